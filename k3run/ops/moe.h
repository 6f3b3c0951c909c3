// The stable LatentMoE block (MODEL.md §3.6) over T rows.
//
// Routed experts are not part of MoeWeights: they arrive through an ExpertLookup so that the
// caller can serve them from RAM, an expert cache or a fixture. Route() is separate so a
// streaming caller can issue the expert reads the moment routing is known, then call MoeApply().
// Bits: every (token, j) expert output lands in its own [T][topk][latent] slot and each token sums
// its slots in top-k order after all experts ran, so T, the order experts are visited and the
// expert cache never change a bit (DESIGN.md §7). A missing expert (lookup returns null) is
// skipped — its term is absent — and counted: the run is then invalid (exit 4), never silent.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "k3run/ops/weights.h"

namespace k3::ops {

// Returns the routed expert e of this layer, or nullptr if it could not be loaded.
using ExpertLookup = std::function<const GluWeights*(int64_t expert)>;

struct Routing {
  int64_t T = 0, topk = 0;
  std::vector<int32_t> idx;   // [T][topk] expert ids, descending selection score
  std::vector<float> weight;  // [T][topk] renormalised, scaled weights
};

struct MoeStats {
  int64_t experts_skipped = 0;  // (token, j) pairs whose expert was unavailable
  std::vector<int32_t> missing;  // distinct expert ids that were unavailable
};

// x [T][E] (the post-attention-layernormed rows).
Routing Route(const MoeWeights& w, const Dims& d, const float* x, int64_t T);

// out [T][E] = W_up · RMSNorm(Σ_j w_j · expert_j(W_down x)) + shared(x).
void MoeApply(const MoeWeights& w, const Routing& r, const ExpertLookup& experts, const Dims& d,
              const float* x, int64_t T, float* out, MoeStats* stats);

// Route + MoeApply.
void MoeBlock(const MoeWeights& w, const ExpertLookup& experts, const Dims& d, const float* x,
              int64_t T, float* out, MoeStats* stats);

}  // namespace k3::ops
