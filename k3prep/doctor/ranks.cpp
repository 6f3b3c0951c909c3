// Per-rank needs of an N-rank run (see k3prep/doctor/ranks.h).
#include "k3prep/doctor/ranks.h"

#include <algorithm>

#include "common/align.h"
#include "formats/expert_share.h"
#include "formats/experts_index.h"
#include "formats/prepared_layout.h"

namespace k3::prep {
namespace {

// The share directory `k3prep split` writes for experts [begin, end): the whole trunk, resident,
// vision and tokenizer files, the share's expert files, experts.idx (every record, absent or not),
// k3.json and k3.sum.
uint64_t ShareDiskBytes(const ModelSizes& m, int begin, int end) {
  const ModelConfig& c = m.config;
  const prepared::ExpertPlan ep = prepared::PlanShareExperts(c, begin, end);
  uint64_t bytes = m.trunk_file + m.resident_file + m.vision_file + m.tokenizer_bytes +
                   m.manifest_bytes + 50;
  for (uint64_t f : ep.file_sizes) bytes += f;
  const uint64_t records = uint64_t(std::max(0, c.n_moe_layers())) * uint64_t(std::max(0, c.n_experts));
  return bytes + prepared::ExpertsIndexFileSize(ep.files, records);
}

}  // namespace

Result<RanksReport> PlanRanks(const ModelSizes& m, int ranks, uint64_t rank0_base) {
  const ModelConfig& c = m.config;
  const int n_experts = prepared::RoutedExperts(c);
  K3_RETURN_IF_ERROR(prepared::ValidateRanks(ranks, n_experts, "--ranks"));
  const prepared::ExpertMap map{ranks, n_experts};
  RanksReport r;
  r.ranks = ranks;
  r.map = map.Describe();
  r.basis = m.basis;
  r.rank0_base = rank0_base;
  // One cache slot per expert, as k3run's expert cache sizes them.
  const uint64_t slot = n_experts > 0 ? AlignUp(prepared::ExpertBytes(c), 64) : 0;
  for (int rank = 0; rank < ranks; ++rank) {
    RankNeeds n;
    n.rank = rank;
    n.expert_begin = map.Begin(rank);
    n.expert_end = map.End(rank);
    n.experts = uint64_t(n.expert_end - n.expert_begin) * uint64_t(std::max(0, c.n_moe_layers()));
    n.trunk_bytes = m.trunk_file + m.resident_file;
    n.reads_trunk = rank == 0;
    n.share_ram_bytes = n.experts * slot;
    n.budget_bytes = (rank == 0 ? rank0_base : kRankMarginBytes) + n.share_ram_bytes;
    n.disk_bytes = ShareDiskBytes(m, n.expert_begin, n.expert_end);
    r.per_rank.push_back(n);
  }
  return r;
}

}  // namespace k3::prep
