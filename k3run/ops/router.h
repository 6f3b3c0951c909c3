// The MoE router (MODEL.md §3.6 steps 1–4).
//
// logit_e = fp32(Σ_i double(W[e][i])·double(x_i)) (one sequential double accumulator; the router
// matrix is read here, F32 or BF16, not through the 16-lane kernels), s_e = σ(logit_e),
// selection score c_e = s_e + bias_e (fp32, SELECTION ONLY), top-k by repeated arg-max with
// strict > (ties → lowest expert index), output in descending c; w_j = s_{idx_j}, renormalised
// with a double sum and fp32(1/(S + 1e-20)), then × routed_scale.
#pragma once

#include <cstdint>

#include "k3run/ops/weights.h"

namespace k3::ops {

// One token: x [E]; idx [topk] and weight [topk] in descending selection score.
void RouteToken(const Matrix& gate, const float* bias, const Dims& d, const float* x,
                int32_t* idx, float* weight);

}  // namespace k3::ops
