// The contiguous expert map, rank-count checks and the model identity (see formats/expert_share.h).
#include "formats/expert_share.h"

#include <algorithm>

#include "formats/config.h"
#include "formats/little_endian.h"
#include "formats/prepared_manifest.h"

namespace k3::prepared {
namespace {

// "0-95", or "7" for a range of one.
std::string Range(int begin, int end) {
  if (end - begin == 1) return std::to_string(begin);
  return std::to_string(begin) + "-" + std::to_string(end - 1);
}

// Unambiguous fields for the identity hash: every string carries its length, every integer is
// 8 bytes little-endian, so no two different field lists encode to the same bytes.
void AppendString(std::string* out, std::string_view s) {
  le::Append64(*out, s.size());
  out->append(s);
}

}  // namespace

int ExpertMap::Owner(int expert) const {
  if (n_experts <= 0 || ranks <= 1) return 0;
  // The largest r with floor(r·E/N) ≤ expert, i.e. r·E < (expert+1)·N.
  const int64_t r = ((int64_t{expert} + 1) * ranks - 1) / n_experts;
  return static_cast<int>(std::clamp<int64_t>(r, 0, ranks - 1));
}

std::string ExpertMap::Describe() const {
  std::string s = "contiguous over " + std::to_string(ranks) + (ranks == 1 ? " rank" : " ranks");
  if (n_experts <= 0) return s + ": no routed experts";
  s += ": ";
  // Thousands of ranks would make a line nobody reads: the first few and the last.
  constexpr int kShown = 8;
  for (int r = 0; r < ranks; ++r) {
    if (ranks > kShown + 1 && r == kShown - 1) {
      s += ", …";
      r = ranks - 1;
    }
    s += (r == 0 ? "rank 0 experts " : ", rank " + std::to_string(r) + " ") + Range(Begin(r), End(r));
  }
  return s;
}

Status ValidateRanks(int ranks, int n_experts, const std::string& what) {
  const int most = std::min(std::max(n_experts, 1), kMaxRanks);
  if (ranks >= 1 && ranks <= most) return Status::Ok();
  const std::string why =
      n_experts <= 0 ? "the model has no routed experts, so there is nothing to share out: only 1"
                     : "every rank owns at least one of the " + std::to_string(n_experts) +
                           " experts of each MoE layer, and k3 runs at most " +
                           std::to_string(kMaxRanks) + " ranks: 1 to " + std::to_string(most);
  return Status::Invalid(what + ": " + std::to_string(ranks) + " ranks is out of range (" + why +
                         ")");
}

int RoutedExperts(const ModelConfig& c) { return c.n_moe_layers() > 0 ? c.n_experts : 0; }

std::string DescribeShare(const ExpertShare& s) {
  return "rank " + std::to_string(s.rank) + " of " + std::to_string(s.ranks) + " (" + s.map + ")";
}

std::string AbsentExpertReason(const ExpertShare& s) {
  const std::string r = std::to_string(s.rank), n = std::to_string(s.ranks);
  return "not in this prepared directory (it holds rank " + r + " of " + n +
         "'s share; run it as rank " + r + " of mpirun -np " + n + " … --mpi)";
}

Hash128 ModelIdentity(const Manifest& m) {
  std::string bytes = "k3-model-identity v1";
  AppendString(&bytes, CanonicalConfigJson(m.config));
  for (const Region& r : m.regions) {
    // experts.idx and the tokenizer differ between shares and modes (or may be absent): only the
    // tensors every directory of the model holds identically take part.
    if (r.file != kTrunkFile && r.file != kResidentFile) continue;
    AppendString(&bytes, r.name);
    AppendString(&bytes, r.file);
    le::Append64(bytes, r.offset);
    le::Append64(bytes, r.length);
    le::Append64(bytes, r.xxh3_128.high);
    le::Append64(bytes, r.xxh3_128.low);
  }
  return Xxh3_128(bytes.data(), bytes.size());
}

}  // namespace k3::prepared
