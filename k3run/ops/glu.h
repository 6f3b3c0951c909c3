// A SiTU-GLU MLP over T rows: y = down · SiTU-GLU([gate·x | up·x]) (MODEL.md §3.7).
// Used for the dense FFN of layer 0, the fused shared experts and each routed expert.
#pragma once

#include <cstdint>

#include "k3run/ops/weights.h"

namespace k3::ops {

// x [T][in], y [T][in_of_down_rows]; the width is gate.rows. y must not alias x.
void GluMlp(const GluWeights& w, float beta1, float beta2, const float* x, int64_t T, float* y);

}  // namespace k3::ops
