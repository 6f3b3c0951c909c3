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
#include <span>
#include <vector>

#include "k3run/ops/weights.h"

namespace k3::ops {

// Returns the routed expert e of this layer, or nullptr if it could not be loaded.
using ExpertLookup = std::function<const GluWeights*(int64_t expert)>;

// Lets a streaming caller bound how many distinct experts are held at once (DESIGN.md §7
// "Multi-token passes"): the pass's expert union is visited in waves of at most max_experts
// (ascending id order); begin(wave) runs before the wave's lookups (issue its batch read there),
// end() after the wave's expert work (release its slots). ready(e), when set, says whether
// expert e's lookup would return without waiting for its read: a wave is computed in rounds, each
// taking the first expert not yet computed (waiting for it) plus every other one that is ready,
// so experts compute while the rest of the wave's reads are in flight. Bits never change:
// outputs land in per-(token, j) slots summed after the last wave.
struct ExpertWaves {
  int64_t max_experts = 0;  // 0: one wave holding the whole union
  std::function<void(std::span<const int32_t> wave)> begin;
  std::function<void()> end;
  std::function<bool(int64_t expert)> ready;  // null: every expert is ready
  // Called once per pass with the layer's MLP input before its post-attention norm, h [T][E] (the
  // residual stream after the pre-MLP aggregation): by MoeApply right after wave 0's begin, and
  // by a dense layer before its FFN (ops::DecoderLayer), so the caller may start reading the next
  // layer's likely experts (ops::GuessExperts, WeightSource::Prefetch). Null: none.
  std::function<void(const float* h, int64_t T)> routed;
};

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

// out [T][E] = W_up · RMSNorm(Σ_j w_j · expert_j(W_down x)) + shared(x). pre_norm [T][E] is
// what waves->routed receives: the rows x was normed from (null: x itself).
void MoeApply(const MoeWeights& w, const Routing& r, const ExpertLookup& experts, const Dims& d,
              const float* x, int64_t T, float* out, MoeStats* stats,
              const ExpertWaves* waves = nullptr, const float* pre_norm = nullptr);

// Route + MoeApply.
void MoeBlock(const MoeWeights& w, const ExpertLookup& experts, const Dims& d, const float* x,
              int64_t T, float* out, MoeStats* stats, const ExpertWaves* waves = nullptr,
              const float* pre_norm = nullptr);

}  // namespace k3::ops
