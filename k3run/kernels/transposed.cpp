// The dispatch of transposed.h and its scalar reference path.
#include "k3run/kernels/transposed.h"

#include <cmath>
#include <string>

#include "k3run/kernels/kernels_internal.h"

namespace k3::kernels {
namespace internal {

void TransposedColsScalar(const Matrix& w, const float* x, int64_t x_stride, int64_t T, float* y,
                          int64_t j_begin, int64_t j_end) {
  const auto* f32 = static_cast<const float*>(w.data);
  const auto* bf16 = static_cast<const uint16_t*>(w.data);
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * x_stride;
    for (int64_t j = j_begin; j < j_end; ++j) {
      float lanes[16] = {};
      for (int64_t i = 0; i < w.rows; ++i) {
        const float wij = w.type == WeightType::kF32 ? f32[i * w.cols + j]
                                                     : Bf16ToF32(bf16[i * w.cols + j]);
        lanes[i % 16] = std::fmaf(wij, xt[i], lanes[i % 16]);
      }
      for (int width = 8; width >= 1; width /= 2) {
        for (int l = 0; l < width; ++l) lanes[l] = lanes[l] + lanes[l + width];
      }
      y[t * w.cols + j] = lanes[0];
    }
  }
}

}  // namespace internal

using internal::Die;

void MatMulTransposedOnThisThread(const Matrix& w, const float* x, int64_t x_stride, int64_t T,
                                  float* y) {
  if (Status st = ValidateMatrix(w, "MatMulTransposed weight"); !st.ok()) Die(st.message());
  if (w.type == WeightType::kMXFP4) {
    Die("MatMulTransposed of an MXFP4 matrix (F32 or BF16 only)");
  }
  if (T < 0 || x_stride < w.rows) {
    Die("MatMulTransposed with T = " + std::to_string(T) + ", x_stride = " +
        std::to_string(x_stride) + " < rows = " + std::to_string(w.rows));
  }
  if (w.cols == 0 || T == 0) return;
  if (x == nullptr || y == nullptr) Die("MatMulTransposed with a null activation or output");
  switch (ActiveIsa()) {
    case Isa::kAvx512:
      return internal::TransposedColsAvx512(w, x, x_stride, T, y);
    case Isa::kAvx2:
      return internal::TransposedColsAvx2(w, x, x_stride, T, y);
    case Isa::kScalar:
      break;
  }
  internal::TransposedColsScalar(w, x, x_stride, T, y, 0, w.cols);
}

}  // namespace k3::kernels
