#include "k3run/ops/conv.h"

#include "k3run/ops/math.h"

namespace k3::ops {

K3_ELEMENTWISE_CLONES void ShortConv(const float* x, int64_t T, int64_t C, int64_t K,
                                     const float* w, float* hist, float* y) {
  const int64_t H = K - 1;  // history length
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < C; ++c) {
      const float xt = x[t * C + c];  // read before y (which may alias x) is written
      const float* wc = w + c * K;
      float* hc = hist + c * H;
      float acc = wc[H] * xt;
      for (int64_t j = 0; j < H; ++j) acc += wc[j] * hc[j];
      for (int64_t j = 0; j + 1 < H; ++j) hc[j] = hc[j + 1];
      if (H > 0) hc[H - 1] = xt;
      y[t * C + c] = acc;
    }
    // The row's SiLU in a loop of its own, which vectorises (math.h); x's row was read above.
    float* yt = y + t * C;
    for (int64_t c = 0; c < C; ++c) yt[c] = Silu(yt[c]);
  }
}

void ShortConvPush(const float* x, int64_t T, int64_t C, int64_t K, float* hist) {
  const int64_t H = K - 1;
  if (H <= 0) return;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < C; ++c) {
      float* hc = hist + c * H;
      for (int64_t j = 0; j + 1 < H; ++j) hc[j] = hc[j + 1];
      hc[H - 1] = x[t * C + c];
    }
  }
}

}  // namespace k3::ops
