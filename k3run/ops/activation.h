// SiTU-GLU (MODEL.md §3.1): the activation of the dense FFN, the shared and the routed experts.
#pragma once

#include <cstdint>

namespace k3::ops {

// y_i = (β1·tanh(g_i/β1)·σ(g_i)) · (β2·tanh(u_i/β2)), all fp32. The sigmoid takes the UNCAPPED
// gate; |y| ≤ β1·β2. y may alias gate or up.
void SituGlu(const float* gate, const float* up, int64_t n, float beta1, float beta2, float* y);

}  // namespace k3::ops
