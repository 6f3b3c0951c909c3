#include "k3run/ops/conv.h"

#include <cstddef>
#include <vector>

#include "k3run/ops/math.h"

namespace k3::ops {

// Channel-major inside the row loop: the taps are transposed to [K][C] and the history kept as
// K − 1 rows of channels (the oldest first), so each product and add runs over contiguous
// channels and vectorises. Per channel the operations and their order are those of the
// definition in conv.h (acc = w_{K−1}·x_t, then += w_j·h_j for j ascending), so the bits are.
K3_ELEMENTWISE_CLONES void ShortConvChannels(const float* x, int64_t T, int64_t C, int64_t K,
                                             const float* w, float* hist, float* y, int64_t c0,
                                             int64_t c1) {
  const int64_t H = K - 1;  // history length
  const int64_t n = c1 - c0;
  if (n <= 0 || T <= 0) return;
  std::vector<float> taps(static_cast<std::size_t>(K * n));   // [K][n]
  std::vector<float> rows(static_cast<std::size_t>((H + 1) * n));  // H history rows + the current row
  std::vector<float*> h(static_cast<std::size_t>(H + 1));      // h[0] oldest … h[H − 1], h[H] spare
  for (int64_t j = 0; j <= H; ++j) h[static_cast<std::size_t>(j)] = rows.data() + j * n;
  for (int64_t c = 0; c < n; ++c) {
    for (int64_t j = 0; j < K; ++j) taps[static_cast<std::size_t>(j * n + c)] = w[(c0 + c) * K + j];
    for (int64_t j = 0; j < H; ++j) h[static_cast<std::size_t>(j)][c] = hist[(c0 + c) * H + j];
  }
  const float* now = taps.data() + H * n;
  for (int64_t t = 0; t < T; ++t) {
    float* xt = h[static_cast<std::size_t>(H)];  // x's row, read before y (which may alias x) is written
    const float* xrow = x + t * C + c0;
    for (int64_t c = 0; c < n; ++c) xt[c] = xrow[c];
    float* yt = y + t * C + c0;
    for (int64_t c = 0; c < n; ++c) yt[c] = now[c] * xt[c];
    for (int64_t j = 0; j < H; ++j) {
      const float* tj = taps.data() + j * n;
      const float* hj = h[static_cast<std::size_t>(j)];
      for (int64_t c = 0; c < n; ++c) yt[c] += tj[c] * hj[c];
    }
    for (int64_t c = 0; c < n; ++c) yt[c] = Silu(yt[c]);
    // shift: the oldest row becomes the spare, x_t the newest
    float* oldest = h[0];
    for (int64_t j = 0; j < H; ++j) h[static_cast<std::size_t>(j)] = h[static_cast<std::size_t>(j + 1)];
    h[static_cast<std::size_t>(H)] = oldest;
  }
  for (int64_t c = 0; c < n; ++c) {
    for (int64_t j = 0; j < H; ++j) hist[(c0 + c) * H + j] = h[static_cast<std::size_t>(j)][c];
  }
}

void ShortConv(const float* x, int64_t T, int64_t C, int64_t K, const float* w, float* hist,
               float* y) {
  ShortConvChannels(x, T, C, K, w, hist, y, 0, C);
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
