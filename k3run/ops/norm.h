// RMSNorm and L2Norm with the precision and order of MODEL.md §3.1.
#pragma once

#include <cstdint>

namespace k3::ops {

// y_i = (w_i·x_i)·inv with ss = Σ x_i² in double (ascending i),
// inv = fp32(1/sqrt(ss/n + eps)) computed in double. y may alias x.
void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* y);

// v_i ← v_i·inv with ss = Σ v_i² in double (a SUM, not a mean), inv = fp32(1/sqrt(ss + 1e-6)).
void L2Norm(float* v, int64_t n);

}  // namespace k3::ops
