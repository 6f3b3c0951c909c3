// The memory plan k3run checks BEFORE allocating anything (DESIGN.md §6 k3run): KV cache for the
// prompt + generated positions, recurrent state, the weights the source holds, and a refusal
// (exit 2) with the numbers when MemAvailable cannot hold them.
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
  int64_t positions = 0;        // KV cache rows (prompt + generated tokens fed back)
  uint64_t kv_cache_bytes = 0;  // Σ MLA layers: positions × (heads·(nope+v) + rope) × 4
  uint64_t state_bytes = 0;     // Σ KDA layers: (H·D·D + 3·P·(K−1)) × 4
  uint64_t scratch_bytes = 0;   // activations of the largest pass (ScratchBytes)
  uint64_t weights_bytes = 0;   // what the weight source holds (WeightSource::PlannedResidentBytes)
  uint64_t total() const { return kv_cache_bytes + state_bytes + scratch_bytes + weights_bytes; }
};

// For the first `layers` layers of `c`; `pass_rows` is the most rows one forward pass feeds
// (the prompt, or prompt + generated tokens with --recompute).
MemoryPlan PlanMemory(const ModelConfig& c, int layers, int64_t positions, uint64_t weights_bytes,
                      int64_t pass_rows = 1);

// An upper bound of the fp32 activations a pass of T rows allocates at once: the residual
// stream and attention-residual snapshots, MLA/KDA projections and scores over `positions`,
// the MoE buffers ([T][top-k][latent] slots, gathered expert rows, shared expert), the dense
// FFN, and the logits.
uint64_t ScratchBytes(const ModelConfig& c, int64_t T, int64_t positions);

// kInvalid when plan.total() > mem_available, naming every component, the total and what to do.
Status CheckMemory(const MemoryPlan& plan, uint64_t mem_available);

// "1.23 GB (1.15 GiB)": GB is 10^9 bytes (DESIGN.md §6).
std::string FormatGb(uint64_t bytes);

}  // namespace k3::run
