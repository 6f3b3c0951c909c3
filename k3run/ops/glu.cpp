#include "k3run/ops/glu.h"

#include <vector>

#include "k3run/ops/activation.h"

namespace k3::ops {

void GluMlp(const GluWeights& w, float beta1, float beta2, const float* x, int64_t T, float* y) {
  if (T <= 0) return;
  const int64_t W = w.gate.rows;
  std::vector<float> g(static_cast<size_t>(T * W)), u(static_cast<size_t>(T * W));
  kernels::MatMul(w.gate, x, T, g.data());
  kernels::MatMul(w.up, x, T, u.data());
  SituGlu(g.data(), u.data(), T * W, beta1, beta2, g.data());
  kernels::MatMul(w.down, g.data(), T, y);
}

}  // namespace k3::ops
