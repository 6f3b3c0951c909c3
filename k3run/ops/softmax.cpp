#include "k3run/ops/math.h"
#include "k3run/ops/mla.h"

namespace k3::ops {

void Softmax(const float* score, int64_t n, float* p) {
  if (n <= 0) return;
  float m = score[0];
  for (int64_t s = 1; s < n; ++s) m = score[s] > m ? score[s] : m;
  // Two loops: the element-wise Exp vectorises (math.h), the ascending double sum cannot.
  for (int64_t s = 0; s < n; ++s) p[s] = Exp(score[s] - m);
  double Z = 0.0;
  for (int64_t s = 0; s < n; ++s) Z += static_cast<double>(p[s]);
  for (int64_t s = 0; s < n; ++s) p[s] = static_cast<float>(static_cast<double>(p[s]) / Z);
}

}  // namespace k3::ops
