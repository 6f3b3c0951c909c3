#include "formats/experts_index.h"
#include "formats/little_endian.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <utility>

namespace k3::prepared {
namespace {

// Record field offsets (bytes from the record start).
constexpr size_t kRecFileId = 0;
constexpr size_t kRecFlags = 4;
constexpr size_t kRecOffset = 8;
constexpr size_t kRecLength = 16;
constexpr size_t kRecSubOffset = 24;  // 6 × u64
constexpr size_t kRecSubSize = 72;    // 6 × u32
constexpr size_t kRecHash = 96;
constexpr size_t kRecPadding = 104;   // to 128
static_assert(kRecSubOffset + 8 * kExpertSubCount == kRecSubSize);
static_assert(kRecSubSize + 4 * kExpertSubCount == kRecHash);
static_assert(kRecPadding + 24 == kExpertRecordSize);


uint64_t PathTableEnd(const std::vector<std::string>& files) {
  uint64_t end = kExpertsIndexHeaderSize;
  for (const std::string& f : files) end += 4 + f.size();
  return AlignUp(end, kPathTableAlign);
}

std::string At(const std::string& source, uint64_t offset) {
  return source + ": byte offset " + std::to_string(offset);
}

// "record 17 (layer 3, expert 5)".
std::string RecordName(const ExpertsIndex& idx, uint64_t i) {
  const uint64_t n = idx.n_experts == 0 ? 1 : idx.n_experts;
  return "record " + std::to_string(i) + " (layer " + std::to_string(idx.first_moe_layer + i / n) +
         ", expert " + std::to_string(i % n) + ")";
}

}  // namespace

uint64_t ExpertsIndexFileSize(const std::vector<std::string>& files, uint64_t n_records) {
  return PathTableEnd(files) + n_records * kExpertRecordSize;
}

ExpertRecord MakeExpertRecord(uint32_t file_id, uint64_t offset,
                              const std::array<uint64_t, kExpertSubCount>& sub_sizes,
                              uint64_t xxh3_64) {
  ExpertRecord r;
  r.file_id = file_id;
  r.offset = offset;
  uint64_t at = 0;
  for (size_t s = 0; s < kExpertSubCount; ++s) {
    r.sub_offset[s] = at;
    r.sub_size[s] = static_cast<uint32_t>(sub_sizes[s]);
    at += sub_sizes[s];
  }
  r.length = at;
  r.xxh3_64 = xxh3_64;
  return r;
}

ExpertRecord MakeAbsentRecord() {
  ExpertRecord r;
  r.flags = kExpertFlagAbsent;
  return r;
}

std::string EncodeExpertsIndex(const ExpertsIndex& index) {
  assert(index.first_moe_layer <= index.n_layers);
  assert(index.records.size() ==
         uint64_t{index.n_layers - index.first_moe_layer} * index.n_experts);
  const uint64_t records_at = PathTableEnd(index.files);
  std::string out(records_at + index.records.size() * kExpertRecordSize, '\0');
  std::memcpy(out.data(), kExpertsIndexMagic.data(), 4);
  le::Put32(out, 4, kExpertsIndexVersion);
  le::Put32(out, 8, index.n_layers);
  le::Put32(out, 12, index.first_moe_layer);
  le::Put32(out, 16, index.n_experts);
  le::Put32(out, 20, static_cast<uint32_t>(index.files.size()));
  le::Put32(out, 24, kExpertRecordSize);
  le::Put32(out, 28, 0);
  size_t at = kExpertsIndexHeaderSize;
  for (const std::string& f : index.files) {
    le::Put32(out, at, static_cast<uint32_t>(f.size()));
    std::memcpy(out.data() + at + 4, f.data(), f.size());
    at += 4 + f.size();
  }
  at = records_at;
  for (const ExpertRecord& r : index.records) {
    le::Put32(out, at + kRecFileId, r.file_id);
    le::Put32(out, at + kRecFlags, r.flags);
    le::Put64(out, at + kRecOffset, r.offset);
    le::Put64(out, at + kRecLength, r.length);
    for (size_t s = 0; s < kExpertSubCount; ++s) {
      le::Put64(out, at + kRecSubOffset + 8 * s, r.sub_offset[s]);
      le::Put32(out, at + kRecSubSize + 4 * s, r.sub_size[s]);
    }
    le::Put64(out, at + kRecHash, r.xxh3_64);
    at += kExpertRecordSize;
  }
  return out;
}

namespace {

// Header fields (bytes [0, 32)) into *idx and *n_files, each checked against its rule and k3's
// bounds before anything is allocated.
Status DecodeHeader(std::string_view bytes, const std::string& source, ExpertsIndex* idx,
                    uint32_t* n_files) {
  if (bytes.size() < kExpertsIndexHeaderSize) {
    return Status::Invalid(source + ": file is " + std::to_string(bytes.size()) +
                           " bytes, shorter than the 32-byte header (truncated; re-run k3prep pack)");
  }
  if (std::memcmp(bytes.data(), kExpertsIndexMagic.data(), 4) != 0) {
    return Status::Invalid(At(source, 0) + ": magic is not \"K3EI\" (not an experts.idx file)");
  }
  const uint32_t version = le::Get32(bytes, 4);
  if (version != kExpertsIndexVersion) {
    return Status::Invalid(At(source, 4) + ": version " + std::to_string(version) +
                           " is not supported (this k3 reads version 1; re-run k3prep pack)");
  }
  idx->n_layers = le::Get32(bytes, 8);
  idx->first_moe_layer = le::Get32(bytes, 12);
  idx->n_experts = le::Get32(bytes, 16);
  *n_files = le::Get32(bytes, 20);
  const uint32_t record_size = le::Get32(bytes, 24);
  const uint32_t reserved = le::Get32(bytes, 28);
  if (record_size != kExpertRecordSize) {
    return Status::Invalid(At(source, 24) + ": record_size is " + std::to_string(record_size) +
                           ", must be 128");
  }
  if (reserved != 0) {
    return Status::Invalid(At(source, 28) + ": reserved header field is " +
                           std::to_string(reserved) + ", must be 0");
  }
  if (idx->first_moe_layer > idx->n_layers) {
    return Status::Invalid(At(source, 12) + ": first_moe_layer " +
                           std::to_string(idx->first_moe_layer) + " exceeds n_layers " +
                           std::to_string(idx->n_layers));
  }
  // The config's bounds (config.h), so a header cannot claim a model k3 would refuse anyway.
  const std::pair<uint32_t, int64_t> counts[] = {{idx->n_layers, kMaxLayers},
                                                 {idx->n_experts, kMaxExperts}};
  for (size_t k = 0; k < 2; ++k) {
    if (counts[k].first > counts[k].second) {
      return Status::Invalid(At(source, k == 0 ? 8 : 16) +
                             (k == 0 ? ": n_layers " : ": n_experts ") +
                             std::to_string(counts[k].first) + " exceeds the bound " +
                             std::to_string(counts[k].second) + " (re-run k3prep pack)");
    }
  }
  if (uint64_t{idx->n_layers - idx->first_moe_layer} * idx->n_experts >
      static_cast<uint64_t>(kMaxRoutedExperts)) {
    return Status::Invalid(At(source, 16) + ": (n_layers - first_moe_layer) x n_experts exceeds "
                           "the bound " + std::to_string(kMaxRoutedExperts) + " routed experts");
  }
  // Each path needs at least 5 bytes, so this bounds n_files before anything is allocated.
  if (uint64_t{*n_files} * 5 > bytes.size()) {
    return Status::Invalid(At(source, 20) + ": n_files " + std::to_string(*n_files) +
                           " cannot fit in a " + std::to_string(bytes.size()) + "-byte file");
  }
  return Status::Ok();
}

// The path table from byte 32: n_files entries into *files; returns the offset of the records
// (the table's end rounded up to kPathTableAlign, with zero padding).
Result<uint64_t> DecodePathTable(std::string_view bytes, const std::string& source,
                                 uint32_t n_files, std::vector<std::string>* files) {
  uint64_t at = kExpertsIndexHeaderSize;
  for (uint32_t i = 0; i < n_files; ++i) {
    if (at + 4 > bytes.size()) {
      return Status::Invalid(At(source, at) + ": path table entry " + std::to_string(i) +
                             " runs past the end of the file");
    }
    const uint32_t len = le::Get32(bytes, at);
    if (len == 0 || len > kMaxExpertPathLen) {
      return Status::Invalid(At(source, at) + ": path_len of file " + std::to_string(i) + " is " +
                             std::to_string(len) + ", must be 1.." +
                             std::to_string(kMaxExpertPathLen));
    }
    if (at + 4 + len > bytes.size()) {
      return Status::Invalid(At(source, at) + ": path of file " + std::to_string(i) +
                             " runs past the end of the file");
    }
    std::string path(bytes.substr(at + 4, len));
    if (path.find('\0') != std::string::npos) {
      return Status::Invalid(At(source, at + 4) + ": path of file " + std::to_string(i) +
                             " contains a NUL byte");
    }
    files->push_back(std::move(path));
    at += 4 + len;
  }
  const uint64_t records_at = AlignUp(at, kPathTableAlign);
  if (records_at > bytes.size()) {
    return Status::Invalid(At(source, at) + ": path table padding runs past the end of the file");
  }
  for (uint64_t p = at; p < records_at; ++p) {
    if (bytes[p] != '\0') {
      return Status::Invalid(At(source, p) +
                             ": path table padding byte is not zero (the table must be "
                             "zero-padded to a multiple of 64 bytes)");
    }
  }
  return records_at;
}

// An absent record names no bytes: each field other than flags must be zero.
Status CheckAbsentRecord(const ExpertRecord& r, const std::string& where) {
  auto nonzero = [&](const std::string& field, uint64_t v) {
    return Status::Invalid(where + ": absent record (flags 0x00000001): " + field + " is " +
                           std::to_string(v) +
                           ", must be 0 (an expert another rank's share holds has no bytes here)");
  };
  if (r.file_id != 0) return nonzero("file_id", r.file_id);
  if (r.offset != 0) return nonzero("offset", r.offset);
  if (r.length != 0) return nonzero("length", r.length);
  for (size_t s = 0; s < kExpertSubCount; ++s) {
    const std::string sub(kExpertSubNames[s]);
    if (r.sub_offset[s] != 0) return nonzero("sub_offset of " + sub, r.sub_offset[s]);
    if (r.sub_size[s] != 0) return nonzero("sub_size of " + sub, r.sub_size[s]);
  }
  if (r.xxh3_64 != 0) return nonzero("xxh3_64", r.xxh3_64);
  return Status::Ok();
}

// The 128-byte record at `base`; `where` names it in messages.
Status DecodeRecord(std::string_view bytes, uint64_t base, size_t n_files,
                    const std::string& where, ExpertRecord* r) {
  for (uint64_t p = kRecPadding; p < kExpertRecordSize; ++p) {
    if (bytes[base + p] != '\0') {
      return Status::Invalid(where + ": padding byte " + std::to_string(p) +
                             " of the record is not zero");
    }
  }
  r->file_id = le::Get32(bytes, base + kRecFileId);
  r->flags = le::Get32(bytes, base + kRecFlags);
  r->offset = le::Get64(bytes, base + kRecOffset);
  r->length = le::Get64(bytes, base + kRecLength);
  for (size_t s = 0; s < kExpertSubCount; ++s) {
    r->sub_offset[s] = le::Get64(bytes, base + kRecSubOffset + 8 * s);
    r->sub_size[s] = le::Get32(bytes, base + kRecSubSize + 4 * s);
  }
  r->xxh3_64 = le::Get64(bytes, base + kRecHash);
  if (r->offset > kMaxFileBytes) {
    return Status::Invalid(where + ": offset " + std::to_string(r->offset) +
                           " exceeds the bound " + std::to_string(kMaxFileBytes) +
                           " (2^50) on byte offsets in a prepared directory");
  }
  if ((r->flags & ~kExpertFlagsKnown) != 0) {
    return Status::Invalid(where + ": flags 0x" + Hex64(r->flags).substr(8) +
                           " has unknown bits (version 1 defines only 0x00000001, absent)");
  }
  if (r->absent()) return CheckAbsentRecord(*r, where);
  if (r->file_id >= n_files) {
    return Status::Invalid(where + ": file_id " + std::to_string(r->file_id) +
                           " is out of range (n_files " + std::to_string(n_files) + ")");
  }
  uint64_t end = 0;
  for (size_t s = 0; s < kExpertSubCount; ++s) {
    if (r->sub_offset[s] != end) {
      return Status::Invalid(
          where + ": sub-tensor " + std::string(kExpertSubNames[s]) + " sub_offset " +
          std::to_string(r->sub_offset[s]) +
          (r->sub_offset[s] < end ? " overlaps" : " leaves a gap after") +
          " the previous sub-tensor (must be " + std::to_string(end) +
          ": the six sub-tensors are contiguous in canonical order w1.packed, w1.scale, "
          "w2.packed, w2.scale, w3.packed, w3.scale)");
    }
    end += r->sub_size[s];
  }
  if (r->length != end) {
    return Status::Invalid(where + ": length " + std::to_string(r->length) +
                           " is not the sum of the sub-tensor sizes " + std::to_string(end));
  }
  return Status::Ok();
}

// The share rule: a record is absent exactly when k3.json's share does not hold its expert.
Status CheckPresence(const ExpertRecord& r, int expert, int n_experts, const ExpertShare* share,
                     const std::string& where) {
  if (share == nullptr) {
    if (!r.absent()) return Status::Ok();
    return Status::Invalid(where + ": absent, but k3.json has no share: a full prepared directory "
                                   "holds every expert (re-run k3prep pack or k3prep split)");
  }
  const bool holds = share->Holds(expert, n_experts);
  if (holds != r.absent()) return Status::Ok();
  const ExpertMap map = share->Map(n_experts);
  const int owner = map.Owner(expert);
  const std::string mine = "rank " + std::to_string(share->rank) + " of " +
                           std::to_string(share->ranks) + " holds experts " +
                           std::to_string(map.Begin(static_cast<int>(share->rank))) + ".." +
                           std::to_string(map.End(static_cast<int>(share->rank)) - 1);
  if (holds) {
    return Status::Invalid(where + ": absent, but k3.json's share says this directory holds it (" +
                           mine + " of every MoE layer; re-run k3prep split)");
  }
  return Status::Invalid(where + ": present, but k3.json's share does not hold it (" + mine +
                         "; expert " + std::to_string(expert) + " is rank " +
                         std::to_string(owner) + "'s; re-run k3prep split)");
}

}  // namespace

Result<ExpertsIndex> DecodeExpertsIndex(std::string_view bytes, const std::string& source) {
  ExpertsIndex idx;
  uint32_t n_files = 0;
  K3_RETURN_IF_ERROR(DecodeHeader(bytes, source, &idx, &n_files));
  K3_ASSIGN_OR_RETURN(const uint64_t records_at,
                      DecodePathTable(bytes, source, n_files, &idx.files));
  const uint64_t want = uint64_t{idx.n_layers - idx.first_moe_layer} * idx.n_experts;
  const uint64_t have_bytes = bytes.size() - records_at;
  if (have_bytes % kExpertRecordSize != 0 || have_bytes / kExpertRecordSize != want) {
    return Status::Invalid(
        source + ": record count mismatch: " + std::to_string(have_bytes) +
        " bytes after the path table (offset " + std::to_string(records_at) + ") hold " +
        std::to_string(have_bytes / kExpertRecordSize) + " records" +
        (have_bytes % kExpertRecordSize ? " and a partial one" : "") +
        ", the header implies (n_layers " + std::to_string(idx.n_layers) +
        " - first_moe_layer " + std::to_string(idx.first_moe_layer) + ") x n_experts " +
        std::to_string(idx.n_experts) + " = " + std::to_string(want) +
        " (truncated or altered file; re-run k3prep pack)");
  }
  idx.records.resize(want);
  for (uint64_t i = 0; i < want; ++i) {
    const uint64_t base = records_at + i * kExpertRecordSize;
    K3_RETURN_IF_ERROR(DecodeRecord(bytes, base, idx.files.size(),
                                    At(source, base) + ": " + RecordName(idx, i), &idx.records[i]));
  }
  return idx;
}

Status ValidateExpertsIndex(const ExpertsIndex& idx, const ExpertsIndexCheck& check,
                            const std::string& source) {
  const ModelConfig& c = *check.config;
  auto mismatch = [&](const char* field, uint64_t offset, uint64_t got, int64_t want) {
    return Status::Invalid(At(source, offset) + ": header " + field + " is " +
                           std::to_string(got) + ", the config says " + std::to_string(want) +
                           " (experts.idx and k3.json disagree; re-run k3prep pack)");
  };
  if (int64_t{idx.n_layers} != c.n_layers) return mismatch("n_layers", 8, idx.n_layers, c.n_layers);
  if (int64_t{idx.first_moe_layer} != c.first_dense) {
    return mismatch("first_moe_layer", 12, idx.first_moe_layer, c.first_dense);
  }
  if (int64_t{idx.n_experts} != c.n_experts) {
    return mismatch("n_experts", 16, idx.n_experts, c.n_experts);
  }
  if (check.file_sizes.size() != idx.files.size()) {
    return Status::Invalid(source + ": path table lists " + std::to_string(idx.files.size()) +
                           " files, k3.json lists " + std::to_string(check.file_sizes.size()) +
                           " expert files");
  }
  const std::array<uint64_t, kExpertSubCount> want = ExpertSubSizes(c);
  const uint64_t records_at = PathTableEnd(idx.files);
  struct Span {
    uint64_t begin, end, record;
    uint32_t file;
  };
  std::vector<Span> spans;
  spans.reserve(idx.records.size());
  std::vector<bool> used(idx.files.size(), false);
  for (uint64_t i = 0; i < idx.records.size(); ++i) {
    const ExpertRecord& r = idx.records[i];
    const std::string where = At(source, records_at + i * kExpertRecordSize) + ": " +
                              RecordName(idx, i);
    K3_RETURN_IF_ERROR(CheckPresence(r, static_cast<int>(i % idx.n_experts), c.n_experts,
                                     check.share, where));
    if (r.absent()) continue;
    used[r.file_id] = true;
    for (size_t s = 0; s < kExpertSubCount; ++s) {
      if (r.sub_size[s] != want[s]) {
        return Status::Invalid(where + ": sub_size of " + std::string(kExpertSubNames[s]) +
                               " is " + std::to_string(r.sub_size[s]) + ", the config implies " +
                               std::to_string(want[s]) + " (MXFP4, routed_expert_hidden_size " +
                               std::to_string(c.latent) + ", moe_intermediate_size " +
                               std::to_string(c.moe_inter) + ")");
      }
    }
    const uint64_t size = check.file_sizes[r.file_id];
    if (r.offset > size || r.length > size - r.offset) {
      return Status::Invalid(where + ": bytes [" + std::to_string(r.offset) + ", " +
                             std::to_string(r.offset + r.length) + ") lie outside file \"" +
                             idx.files[r.file_id] + "\" of " + std::to_string(size) + " bytes");
    }
    if (check.require_aligned && r.offset % kExpertAlign != 0) {
      return Status::Invalid(where + ": offset " + std::to_string(r.offset) +
                             " is not a multiple of " + std::to_string(kExpertAlign) +
                             " (copy mode places every expert on a 4096-byte boundary)");
    }
    spans.push_back(Span{r.offset, r.offset + r.length, i, r.file_id});
  }
  for (size_t f = 0; f < used.size(); ++f) {
    if (!used[f]) {
      return Status::Invalid(source + ": path table entry " + std::to_string(f) + " \"" +
                             idx.files[f] + "\" is used by no present record (the path table "
                             "and k3.json's expert_files list only the files the records read)");
    }
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.file != b.file ? a.file < b.file : a.begin < b.begin;
  });
  for (size_t k = 1; k < spans.size(); ++k) {
    const Span& a = spans[k - 1];
    const Span& b = spans[k];
    if (a.file == b.file && b.begin < a.end) {
      return Status::Invalid(source + ": " + RecordName(idx, a.record) + " and " +
                             RecordName(idx, b.record) + " overlap in file \"" +
                             idx.files[a.file] + "\" (bytes " + std::to_string(b.begin) + ".." +
                             std::to_string(std::min(a.end, b.end)) + ")");
    }
  }
  return Status::Ok();
}

}  // namespace k3::prepared
