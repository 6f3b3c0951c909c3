#include "k3run/ops/activation.h"

#include "k3run/ops/math.h"

namespace k3::ops {

// GCC vectorises this loop (math.h's Exp/Tanh are branch-free inline code; check with
// -fopt-info-vec-optimized), each lane doing the scalar operations, so the bits do not depend on
// n, alignment or chunking (tests/k3run/ops/math_test.cpp). Aliased y == gate, the way GluMlp and
// MoeBlock call it, passes GCC's run-time overlap check: element i is read before it is written.
K3_ELEMENTWISE_CLONES void SituGlu(const float* gate, const float* up, int64_t n, float beta1, float beta2, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float a = beta1 * Tanh(g / beta1) * Sigmoid(g);
    const float u = beta2 * Tanh(up[i] / beta2);
    y[i] = a * u;
  }
}

}  // namespace k3::ops
