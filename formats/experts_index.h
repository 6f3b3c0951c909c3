// experts.idx: the expert directory of a prepared directory (DESIGN.md §5, docs/FORMATS.md).
//
// Goals: k3run finds any routed expert with one 128-byte record lookup and one read; every byte
// of the file is checked before use. All integers little-endian; encoded and decoded field by
// field into byte buffers (no struct punning, so host layout and padding never matter):
//   header (32 B): "K3EI", u32 version 1, u32 n_layers, u32 first_moe_layer, u32 n_experts,
//                  u32 n_files, u32 record_size 128, u32 reserved 0
//   path table:    n_files × {u32 path_len, path bytes}, zero-padded to a multiple of 64
//   records:       (n_layers − first_moe_layer) × n_experts × 128 B, record index
//                  (L − first_moe_layer)·n_experts + e:
//                  u32 file_id, u32 flags, u64 offset, u64 length, 6 × u64 sub_offset,
//                  6 × u32 sub_size, u64 xxh3_64, 24 zero bytes
// DecodeExpertsIndex checks the file on its own (structure); ValidateExpertsIndex checks it
// against the config and the expert files' sizes. Both return kInvalid naming experts.idx, the
// byte offset, the record (layer, expert) and the field.
// Non-goals: reading expert bytes; resolving relative paths (prepared_manifest.h does).
// Evolution: new record fields use the padding and a flag bit that says they are present;
// readers reject unknown flag bits, so an old reader never misreads a new file.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "formats/config.h"
#include "formats/expert_share.h"
#include "formats/prepared_layout.h"

namespace k3::prepared {

inline constexpr std::array<char, 4> kExpertsIndexMagic = {'K', '3', 'E', 'I'};
inline constexpr uint32_t kExpertsIndexVersion = 1;
inline constexpr uint32_t kExpertsIndexHeaderSize = 32;
inline constexpr uint32_t kExpertRecordSize = 128;
// The path table ends on this boundary so records start cache-line aligned.
inline constexpr uint32_t kPathTableAlign = 64;
inline constexpr uint32_t kMaxExpertPathLen = 4096;  // PATH_MAX
// Record flags; readers reject any other bit.
// Absent: this expert is not in this directory, another rank's share holds it (k3prep split,
// formats/expert_share.h). Every other field of an absent record is zero: it names no bytes.
inline constexpr uint32_t kExpertFlagAbsent = 1u;
inline constexpr uint32_t kExpertFlagsKnown = kExpertFlagAbsent;

struct ExpertRecord {
  uint32_t file_id = 0;
  uint32_t flags = 0;
  uint64_t offset = 0;  // absolute byte offset in files[file_id]
  uint64_t length = 0;  // sum of sub_size
  std::array<uint64_t, kExpertSubCount> sub_offset{};  // relative to offset
  std::array<uint32_t, kExpertSubCount> sub_size{};
  uint64_t xxh3_64 = 0;  // of the `length` bytes at offset

  bool absent() const { return (flags & kExpertFlagAbsent) != 0; }
};

struct ExpertsIndex {
  uint32_t n_layers = 0;
  uint32_t first_moe_layer = 0;
  uint32_t n_experts = 0;
  std::vector<std::string> files;  // link mode: relative to model_dir; copy: see prepared_manifest.h
  std::vector<ExpertRecord> records;

  uint64_t RecordIndex(uint32_t layer, uint32_t expert) const {
    return uint64_t{layer - first_moe_layer} * n_experts + expert;
  }
  const ExpertRecord& At(uint32_t layer, uint32_t expert) const {
    return records[RecordIndex(layer, expert)];
  }
};

// The exact size of an experts.idx with this path table and record count (header, padded path
// table, records): k3.json's size for the file is checked against it before the file is read.
uint64_t ExpertsIndexFileSize(const std::vector<std::string>& files, uint64_t n_records);

// A record with sub-tensors laid out contiguously in canonical order from `offset`.
ExpertRecord MakeExpertRecord(uint32_t file_id, uint64_t offset,
                              const std::array<uint64_t, kExpertSubCount>& sub_sizes,
                              uint64_t xxh3_64);
// The record of an expert another rank's share holds: kExpertFlagAbsent, every other field zero.
ExpertRecord MakeAbsentRecord();

// Encodes `index`; the result is the exact file content. Asserts (a bug, not input) when the
// record count does not match the header fields.
std::string EncodeExpertsIndex(const ExpertsIndex& index);

// Structural decode. `source` names the file in messages. Checks: size ≥ header, magic,
// version, record_size, reserved, first_moe_layer ≤ n_layers, path table bounds (no
// zero-length path, path_len ≤ 4096, no NUL), zero padding to 64, exact file size for the
// record count, each record's padding zero, flags known, file_id < n_files, sub-tensors
// contiguous in canonical order from 0 and summing to length; an absent record has every other
// field zero.
Result<ExpertsIndex> DecodeExpertsIndex(std::string_view bytes, const std::string& source);

struct ExpertsIndexCheck {
  const ModelConfig* config = nullptr;
  // Size of each file in `files` (from k3.json or the file system); same order.
  std::vector<uint64_t> file_sizes;
  // Copy mode: every expert must start on kExpertAlign.
  bool require_aligned = false;
  // k3.json's share: exactly the experts it does not hold are absent. Null: a full directory,
  // where no record may be absent.
  const ExpertShare* share = nullptr;
};
// Semantic checks: header fields equal the config, absent records are exactly the experts the
// share does not hold, sub sizes of present records match the config's expert shapes, every
// present expert inside its file, no two overlap, every file in the path table used by one.
Status ValidateExpertsIndex(const ExpertsIndex& index, const ExpertsIndexCheck& check,
                            const std::string& source);

}  // namespace k3::prepared
