#include "k3run/ops/activation.h"

#include "k3run/ops/math.h"

namespace k3::ops {

void SituGlu(const float* gate, const float* up, int64_t n, float beta1, float beta2, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float a = beta1 * Tanh(g / beta1) * Sigmoid(g);
    const float u = beta2 * Tanh(up[i] / beta2);
    y[i] = a * u;
  }
}

}  // namespace k3::ops
