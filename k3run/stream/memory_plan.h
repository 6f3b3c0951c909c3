// The memory plan k3run checks BEFORE allocating anything (DESIGN.md §6 k3run): latent caches for
// the reserved positions, recurrent state, scratch for the largest pass, the weights the source
// holds, and a refusal (exit 2) with the numbers when the budget or MemAvailable cannot hold them.
// Non-goals: budgets and presets (k3run/stream/streaming_plan.h turns them into the weights part).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "formats/config.h"

namespace k3::run {

// The release's max_position_embeddings: prompt + generated tokens may not exceed it.
inline constexpr int64_t kMaxPositions = int64_t{1} << 20;

struct MemoryPlan {
  int64_t positions = 0;        // per sequence: the positions its latent caches hold (--ctx)
  int64_t chunk = 1;            // the most rows one pass feeds (--chunk; sizes the scratch)
  int64_t sequences = 1;        // sequences held at once (--max-seqs): caches and states each
  int64_t spec_rows = 0;        // draft rows a pass may verify per sequence (--spec)
  uint64_t kv_cache_bytes = 0;  // sequences × Σ MLA layers: positions × (kv_lora + qk_rope) × 4
  uint64_t kv_position_bytes = 0;  // one position of one sequence over all MLA layers: the
                                   // caches are reserved at kv_cache_bytes but grow by this much
                                   // per position reached (ops/mla.h), so RAM follows the context
  uint64_t state_bytes = 0;     // sequences × Σ KDA layers: (H·D·D + 3·P·(K−1)) × 4
  uint64_t record_bytes = 0;    // speculation: per sequence and KDA layer, (spec_rows + 1) rows of
                                // ops::KdaRecords, + one scratch copy of a KDA state
  uint64_t scratch_bytes = 0;   // activations of the largest pass (ScratchBytes)
  uint64_t weights_bytes = 0;   // what the weight source holds (WeightSource::PlannedResidentBytes)
  uint64_t budget = 0;          // the TOTAL budget it was fitted into; 0: none (MemAvailable only)
  uint64_t vision_bytes = 0;    // images: the tower's weights (vision.bin) + the scratch and
                                // rows of the largest image a run may see (0: no images)
  uint64_t total() const {
    return kv_cache_bytes + state_bytes + record_bytes + scratch_bytes + weights_bytes +
           vision_bytes;
  }
  // "weights held …, latent caches … for N positions (grown as used: … per position), KDA
  // states …, scratch … for chunks of R rows = total …", as the CLI prints it.
  std::string Describe() const;
  std::string GrowthNote() const;  // "" without MLA layers
};

// For the first `layers` layers of `c`; `chunk` is the most rows one pass feeds, `threads` the
// compute threads (each has its own MLA score buffer).
MemoryPlan PlanMemory(const ModelConfig& c, int layers, int64_t positions, uint64_t weights_bytes,
                      int64_t chunk = 1, int threads = 1, int64_t sequences = 1,
                      int64_t spec_rows = 0);

// An upper bound of the fp32 activations a pass of T rows allocates at once: the residual
// stream and attention-residual snapshots, the MLA projections (q, q̃, ō), one score buffer of
// `positions` floats and doubles per thread and the transposed W_UK, the KDA projections, the MoE buffers
// ([T][top-k][latent] slots, gathered expert rows, shared expert), the dense FFN, and the logits.
uint64_t ScratchBytes(const ModelConfig& c, int64_t T, int64_t positions, int threads = 1);

// The largest T ≤ max_rows whose ScratchBytes fits `room` (0 when not even one row fits).
int64_t LargestChunk(const ModelConfig& c, uint64_t room, int64_t positions, int threads,
                     int64_t max_rows);

// The default rows per pass when --chunk is not given: the plan's room decides below this; past
// it a longer pass no longer pays (at 512 rows the weights are read once per 512 tokens, and the
// pass is compute-bound on any disk).
inline constexpr int64_t kDefaultMaxChunk = 512;

// kInvalid when plan.total() > mem_available, naming every component, the total and what to do.
Status CheckMemory(const MemoryPlan& plan, uint64_t mem_available);

// "1.23 GB (1.15 GiB)": GB is 10^9 bytes (DESIGN.md §6).
std::string FormatGb(uint64_t bytes);

}  // namespace k3::run
