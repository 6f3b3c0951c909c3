#include "k3run/ops/norm.h"

#include <cmath>

#include "k3run/ops/weights.h"

namespace k3::ops {

namespace {
double SumSquares(const float* x, int64_t n) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return ss;
}
}  // namespace

void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* y) {
  const double ss = SumSquares(x, n);
  const float inv =
      static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + static_cast<double>(eps)));
  for (int64_t i = 0; i < n; ++i) y[i] = (w[i] * x[i]) * inv;
}

void L2Norm(float* v, int64_t n) {
  const double ss = SumSquares(v, n);
  const float inv = static_cast<float>(1.0 / std::sqrt(ss + kL2NormEps));
  for (int64_t i = 0; i < n; ++i) v[i] = v[i] * inv;
}

}  // namespace k3::ops
