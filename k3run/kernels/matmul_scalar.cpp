// The scalar reference path: the contract of matmul.h written as plainly as possible. The SIMD
// paths must reproduce these bits; tests compare them with memcmp.
#include <cmath>

#include "k3run/kernels/kernels_internal.h"

namespace k3::kernels::internal {
namespace {

// w_i of row `r`, element `i`, as the exact fp32 value of matmul.h.
float WeightAt(const Matrix& w, int64_t r, int64_t i) {
  switch (w.type) {
    case WeightType::kF32:
      return static_cast<const float*>(w.data)[r * w.cols + i];
    case WeightType::kBF16:
      return Bf16ToF32(static_cast<const uint16_t*>(w.data)[r * w.cols + i]);
    case WeightType::kMXFP4: {
      const uint8_t byte = static_cast<const uint8_t*>(w.data)[r * (w.cols / 2) + i / 2];
      const int nibble = (i & 1) ? byte >> 4 : byte & 15;  // low nibble = even element
      const uint8_t scale = w.scales[r * (w.cols / kMxfp4GroupSize) + i / kMxfp4GroupSize];
      return Mxfp4Lut()[scale].v[nibble];
    }
  }
  return 0.0f;  // unreachable: ValidateMatrix rejects other types
}

// The fixed tree: a_l += a_{l+8}, then +4, +2, +1.
float ReduceLanes(float a[16]) {
  for (int width = 8; width >= 1; width /= 2) {
    for (int l = 0; l < width; ++l) a[l] = a[l] + a[l + width];
  }
  return a[0];
}

}  // namespace

void MatMulRowsScalar(const Matrix& w, const float* x, int64_t T, float* y, int64_t r_begin,
                      int64_t r_end) {
  for (int64_t r = r_begin; r < r_end; ++r) {
    for (int64_t t = 0; t < T; ++t) {
      const float* xt = x + t * w.cols;
      float lanes[16] = {};
      for (int64_t i = 0; i < w.cols; ++i) {
        lanes[i % 16] = std::fmaf(WeightAt(w, r, i), xt[i], lanes[i % 16]);
      }
      y[t * w.rows + r] = ReduceLanes(lanes);
    }
  }
}

}  // namespace k3::kernels::internal
