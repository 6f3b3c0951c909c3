// The MoE router (MODEL.md §3.6 steps 1–4).
//
// logit_e = fp32(Σ_i double(W[e][i])·double(x_i)) (one sequential double accumulator; the router
// matrix is read here, F32 or BF16, not through the 16-lane kernels), s_e = σ(logit_e),
// selection score c_e = s_e + bias_e (fp32, SELECTION ONLY), top-k by repeated arg-max with
// strict > (ties → lowest expert index), output in descending c; w_j = s_{idx_j}, renormalised
// with a double sum and fp32(1/(S + 1e-20)), then × routed_scale.
#pragma once

#include <cstdint>
#include <vector>

#include "k3run/ops/weights.h"

namespace k3::ops {

// One token: x [E]; idx [topk] and weight [topk] in descending selection score.
void RouteToken(const Matrix& gate, const float* bias, const Dims& d, const float* x,
                int32_t* idx, float* weight);
// Step 2 for n experts: s_e = σ(fp32(logit_e)), c_e = s_e + bias_e. Element-wise, in AVX-512,
// AVX2 and baseline copies with the same bits (K3_ELEMENTWISE_CLONES, ops/math.h).
void RouterScores(const double* logits, const float* bias, int64_t n, float* s, float* c);
// Steps 2–4 for one token from its router logits [n_experts] (kernels::RouterLogits or one row
// of RouterLogitsRows): what RouteToken does after the product.
void SelectExperts(const double* logits, const float* bias, const Dims& d, int32_t* idx,
                   float* weight);

// A guess, for reading ahead, of the experts MoE layer `next` will pick, from an earlier layer's
// pre-norm MLP input h [T][E]: the residual stream changes little from one layer to the next,
// so `next`'s own post-attention norm and router applied to h rank its experts much as its
// routing will (docs/STREAMING.md "Reading ahead"). `next`'s norm, not the earlier layer's:
// on real weights each layer scales its channels its own way before its router. Each row's
// `count` best (≤ n_experts), merged rank-major without repeats (every row's first choice, then
// every row's second, …) so that with several rows each row's best guesses come first; the
// caller reads as many from the front as it has room for. Only the first `count` rows are ranked:
// their first choices alone fill a read of `count`, and a long prompt's prefill would otherwise
// pay a router product per row per layer for guesses nobody reads (the released router is
// [896][7168]: about 0.8 ms per row on one core). Never used for routing itself.
std::vector<int32_t> GuessExperts(const LayerWeights& next, const Dims& d, const float* h,
                                  int64_t T, int64_t count);

}  // namespace k3::ops
