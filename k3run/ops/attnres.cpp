#include "k3run/ops/attnres.h"

#include <cmath>
#include <vector>

#include "k3run/ops/math.h"
#include "k3run/ops/mla.h"  // Softmax

namespace k3::ops {

void FoldAttnRes(const float* norm, const float* proj, int64_t E, float* fold) {
  for (int64_t i = 0; i < E; ++i) fold[i] = norm[i] * proj[i];
}

K3_ELEMENTWISE_CLONES void AttnRes(const float* const* sources, int64_t m, const float* fold,
                                   int64_t E, float eps, float* out) {
  std::vector<float> p(static_cast<size_t>(m));
  for (int64_t k = 0; k < m; ++k) {
    const float* s = sources[k];
    double ss = 0.0;
    for (int64_t i = 0; i < E; ++i) ss += static_cast<double>(s[i]) * static_cast<double>(s[i]);
    const float inv = static_cast<float>(
        1.0 / std::sqrt(ss / static_cast<double>(E) + static_cast<double>(eps)));
    double dot = 0.0;
    for (int64_t i = 0; i < E; ++i)
      dot += static_cast<double>(s[i] * inv) * static_cast<double>(fold[i]);
    p[static_cast<size_t>(k)] = static_cast<float>(dot);
  }
  Softmax(p.data(), m, p.data());
  for (int64_t i = 0; i < E; ++i) out[i] = 0.0f;
  for (int64_t k = 0; k < m; ++k) {
    const float pk = p[static_cast<size_t>(k)];
    const float* s = sources[k];
    for (int64_t i = 0; i < E; ++i) out[i] += pk * s[i];
  }
}

}  // namespace k3::ops
