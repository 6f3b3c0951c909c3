// The stable LatentMoE block (MODEL.md §3.6) over T rows, as operators on buffers.
//
// The block is split where a streaming caller needs to act: Route() gives the experts the rows
// chose; MoeBegin() computes what needs no routed expert (the latent rows, step 5, and the shared
// experts, step 9); ExpertForward() runs one routed expert over the rows that chose it (step 6a)
// into their slots; MoeCombine() sums each token's slots in top-k order and finishes (steps
// 6b–10). Which experts are at hand when, and in what order they are visited, is the caller's
// business (engine/expert_waves.h reads them in waves); ops/ does no I/O and takes no callbacks.
// Bits: every (token, j) expert output lands in its own [T][topk][latent] slot and each token sums
// its slots in top-k order after every expert ran, so T, the order experts are visited and the
// thread that runs each never change a bit (DESIGN.md §7). A missing expert (never run) leaves
// its slots empty: its term is absent, and the caller counts it (the run is then invalid, exit
// 4, never silent).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "k3run/ops/weights.h"

namespace k3::ops {

// Routed experts by id; null where an expert is unavailable.
using ExpertTable = std::span<const GluWeights* const>;

struct Routing {
  int64_t T = 0, topk = 0;
  std::vector<int32_t> idx;   // [T][topk] expert ids, descending selection score
  std::vector<float> weight;  // [T][topk] renormalised, scaled weights
};

struct MoeStats {
  int64_t experts_skipped = 0;   // (token, j) pairs whose expert was unavailable
  std::vector<int32_t> missing;  // distinct expert ids that were unavailable
};

// x [T][E] (the post-attention-layernormed rows).
Routing Route(const MoeWeights& w, const Dims& d, const float* x, int64_t T);

// The distinct expert ids of a routing, ascending.
std::vector<int32_t> SelectedExperts(const Routing& r);

// The rows (flat slot index t·topk + j, ascending) routed to `expert`, appended to *rows.
void RowsOf(const Routing& r, int32_t expert, std::vector<int64_t>* rows);

// RowsOf for every expert of a routing from one sort of its slots (RowsOf is a pass per expert:
// a prefill's 256 rows × 16 slots × ~900 experts per layer).
class SlotsByExpert {
 public:
  explicit SlotsByExpert(const Routing& r);
  // What RowsOf(r, expert, rows) appends.
  void AppendRowsOf(int32_t expert, std::vector<int64_t>* rows) const;

 private:
  // (expert id, slot) for every slot, sorted: grouped by id, slots ascending within each.
  std::vector<std::pair<int32_t, int64_t>> by_expert_;
};

// What one MoE block holds between MoeBegin and MoeCombine.
struct MoeScratch {
  int64_t T = 0;
  std::vector<float> z;       // [T][latent] latent rows (step 5)
  std::vector<float> shared;  // [T][E] shared experts' output (step 9)
  std::vector<float> slots;   // [T][topk][latent] routed expert outputs
  std::vector<char> have;     // [T][topk] whether the slot was written
  std::vector<float> work;    // ExpertForward's work space for the rows run together
                              // (MoeBlock: all of them; ExpertWaves: a wave's)
  // A caller that keeps one MoeScratch for every layer (the engine's Model) allocates and
  // clears these once instead of per layer: MoeBegin sizes them, and `slots` is only read where
  // `have` (cleared per call) marks it written.
};

// Steps 5 and 9 for x [T][E]; sizes the slots.
void MoeBegin(const MoeWeights& w, const Dims& d, const float* x, int64_t T, MoeScratch* s);

// Floats of work space ExpertForward needs for n rows.
int64_t ExpertWorkFloats(const Dims& d, int64_t n);

// Step 6a for one expert over its n slot rows (RowsOf), on the calling thread: writes only those
// slots (and marks them had). `work` holds ExpertWorkFloats(d, n) floats of its own.
void ExpertForward(const GluWeights& e, const Dims& d, const int64_t* rows, int64_t n,
                   float* work, MoeScratch* s);

// Steps 6b–10: out [T][E] = W_up · RMSNorm(Σ_j w_j · slot_j) + shared.
void MoeCombine(const MoeWeights& w, const Dims& d, const Routing& r, const MoeScratch& s,
                float* out);

// The whole block with every expert in `experts` (the fixtures' and tests' path): Route,
// MoeBegin, each selected expert in ascending id order (in parallel), MoeCombine.
void MoeBlock(const MoeWeights& w, ExpertTable experts, const Dims& d, const float* x,
              int64_t T, float* out, MoeStats* stats);

}  // namespace k3::ops
