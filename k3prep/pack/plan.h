// The pack plan (internal to `k3prep pack`): every output byte as (stream, offset), every source
// byte as a Piece, the journaled units, and the windows the pipeline reads, hashes and writes.
// Built once from the checkpoint and the options (MakePlan), before anything is written.
//
// Invariants: a Stream's pieces are sorted by dst; its units are sorted by begin and tile
// [0, size); pieces never cross a unit end. MakeWindows' segments tile each window and are cut
// at piece and unit boundaries, so the hashing side never has to split them again.
// Non-goals: the byte layout itself (formats/prepared_layout.h), I/O (k3prep/pack/pipeline.h).
// Thread safety: a Plan is filled by the pipeline's consumer thread only; not shared otherwise.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/hash.h"
#include "common/status.h"
#include "formats/config.h"
#include "formats/experts_index.h"
#include "formats/prepared_layout.h"
#include "formats/prepared_manifest.h"
#include "formats/vision_layout.h"
#include "k3prep/pack/pack.h"

namespace k3::prep::pack_internal {

// Source bytes that land at [dst, dst+len) of a stream; belongs to a region and/or an expert.
struct Piece {
  uint32_t src = 0;  // index into Plan::sources
  uint64_t src_off = 0;
  uint64_t len = 0;
  uint64_t dst = 0;
  int32_t region = -1;  // index into Plan::regions (trunk/resident tensors)
  int32_t expert = -1;  // record index (experts.idx)
};

// A journaled piece of work: a contiguous span of one stream (see pack.h "Resume").
struct Unit {
  size_t stream = 0;
  uint64_t begin = 0, end = 0;
  int layer = -1;                // for progress; -1 for resident tensors
  std::vector<int32_t> regions;  // in dst order
  std::vector<int32_t> experts;  // in dst order
  bool reused = false;
  Hash128 span;  // XXH3-128 of [begin, end) as written
};

// One output file (temp name while packing), or the virtual stream of link-mode experts
// (final_path empty: read and hashed, never written).
struct Stream {
  std::string final_path;  // absolute or relative to the cwd, as the Env sees it
  uint64_t size = 0;
  std::vector<Piece> pieces;  // sorted by dst
  std::vector<size_t> units;  // indices into Plan::units, sorted by begin, tiling [0, size)
  std::string label;          // progress text prefix
};

struct Plan {
  ModelConfig config;
  prepared::Layout layout;
  std::optional<VisionConfig> vision;  // set when vision.bin is written
  prepared::VisionLayout vision_layout;
  std::vector<std::string> sources;       // shard paths
  std::vector<uint64_t> source_sizes;     // shard file sizes
  std::vector<Stream> streams;
  std::vector<Unit> units;
  std::vector<prepared::Region> regions;  // trunk, resident, then vision (manifest order), hashes
                                          // filled by packing
  std::vector<prepared::ExpertRecord> records;
  std::vector<bool> expert_hashed;
  std::vector<prepared::FileEntry> expert_files;  // experts.idx path table with sizes
  prepared::SourceInfo source;
  std::vector<std::string> tokenizer_files;  // names present in model_dir
  uint64_t expert_bytes = 0;
};

// Windows: what one buffer holds. Segments tile [begin, end): source bytes or zero padding.
struct Seg {
  uint64_t dst = 0;
  uint64_t len = 0;
  int64_t piece = -1;  // index into the stream's pieces; -1: zero padding
};

struct Window {
  size_t stream = 0;
  uint64_t begin = 0, end = 0;
  std::vector<Seg> segs;
};

// Reads the config and the checkpoint index under o.model_dir and plans every output
// (stripe_abs: the absolute --stripe directories). kInvalid for a checkpoint that cannot be
// packed in o.experts mode; kIntegrity when a shard's size contradicts the download manifest.
Result<Plan> MakePlan(Env* env, const PackOptions& o, const std::vector<std::string>& stripe_abs);

// Copy mode's experts.idx path table (with file sizes) and records (hashes zero), as
// PlanCopyExperts places them; shared by MakePlan and PreparedForTensors (k3prep/pack/manifest.h).
void PlaceCopyExperts(const ModelConfig& c, const prepared::ExpertPlan& ep,
                      std::vector<prepared::FileEntry>* files,
                      std::vector<prepared::ExpertRecord>* records);

// The windows (at most window_bytes each) covering every unit not marked reused, in stream
// and offset order.
std::vector<Window> MakeWindows(const Plan& plan, uint64_t window_bytes);

}  // namespace k3::prep::pack_internal
