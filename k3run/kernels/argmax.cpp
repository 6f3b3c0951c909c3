#include "k3run/kernels/argmax.h"

#include <cmath>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace k3::kernels {

int32_t ArgMaxReference(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

#if defined(__SSE2__)
int32_t ArgMax(const float* x, int64_t n) {
  if (std::isnan(x[0])) return 0;  // nothing compares greater than a NaN best
  __m128 m[4];
  for (__m128& v : m) v = _mm_set1_ps(x[0]);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int k = 0; k < 4; ++k) m[k] = _mm_max_ps(_mm_loadu_ps(x + i + 4 * k), m[k]);
  }
  alignas(16) float lanes[16];
  for (int k = 0; k < 4; ++k) _mm_store_ps(lanes + 4 * k, m[k]);
  float best = x[0];
  for (float v : lanes) best = v > best ? v : best;
  for (; i < n; ++i) best = x[i] > best ? x[i] : best;
  const __m128 b = _mm_set1_ps(best);
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const int mask = _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(x + j), b));
    if (mask != 0) return static_cast<int32_t>(j + __builtin_ctz(static_cast<unsigned>(mask)));
  }
  for (; j < n; ++j) {
    if (x[j] == best) return static_cast<int32_t>(j);
  }
  return 0;  // unreachable: best is one of x
}
#else
int32_t ArgMax(const float* x, int64_t n) { return ArgMaxReference(x, n); }
#endif

}  // namespace k3::kernels
