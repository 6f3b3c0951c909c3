// The AVX2+FMA path of transposed.h: one ymm holds 8 consecutive columns j, and the 16 lanes
// a_0..a_15 of the contract (over the summed row index i) are 16 ymm accumulators (all 16
// registers: the compiler keeps a few on the stack), so each fmadd is, per column, the scalar
// fmaf of the contract and the tree is 15 elementwise adds.
// Compiled with -mavx2 -mfma; internal linkage only, nothing inline from a header
// (kernels_internal.h explains why).
#include <immintrin.h>

#include <cstdint>

#include "k3run/kernels/kernels_internal.h"

namespace k3::kernels::internal {
namespace {

struct F32Cols {
  const float* base;
  int64_t cols;
  __m256 Load(int64_t i, int64_t j) const { return _mm256_loadu_ps(base + i * cols + j); }
};

struct Bf16Cols {
  const uint16_t* base;
  int64_t cols;
  __m256 Load(int64_t i, int64_t j) const {  // bf16 bits become the high half of each fp32
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(base + i * cols + j));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
};

template <typename Cols>
void Body(const Cols& wc, int64_t rows, int64_t cols, const float* x, int64_t x_stride, int64_t T,
          float* y) {
  const int64_t full = cols / 8 * 8;
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * x_stride;
    for (int64_t j = 0; j < full; j += 8) {
      __m256 a[16];
#pragma GCC unroll 16
      for (int l = 0; l < 16; ++l) a[l] = _mm256_setzero_ps();
      int64_t i = 0;
      for (; i + 16 <= rows; i += 16) {
#pragma GCC unroll 16
        for (int l = 0; l < 16; ++l) {
          a[l] = _mm256_fmadd_ps(wc.Load(i + l, j), _mm256_set1_ps(xt[i + l]), a[l]);
        }
      }
      for (int l = 0; i + l < rows; ++l) {  // the ragged end: lanes past rows stay untouched
        a[l] = _mm256_fmadd_ps(wc.Load(i + l, j), _mm256_set1_ps(xt[i + l]), a[l]);
      }
#pragma GCC unroll 8
      for (int l = 0; l < 8; ++l) a[l] = _mm256_add_ps(a[l], a[l + 8]);
#pragma GCC unroll 4
      for (int l = 0; l < 4; ++l) a[l] = _mm256_add_ps(a[l], a[l + 4]);
      a[0] = _mm256_add_ps(a[0], a[2]);
      a[1] = _mm256_add_ps(a[1], a[3]);
      _mm256_storeu_ps(y + t * cols + j, _mm256_add_ps(a[0], a[1]));
    }
  }
}

}  // namespace

void TransposedColsAvx2(const Matrix& w, const float* x, int64_t x_stride, int64_t T, float* y) {
  if (w.type == WeightType::kF32) {
    Body(F32Cols{static_cast<const float*>(w.data), w.cols}, w.rows, w.cols, x, x_stride, T, y);
  } else {
    Body(Bf16Cols{static_cast<const uint16_t*>(w.data), w.cols}, w.rows, w.cols, x, x_stride, T,
         y);
  }
  const int64_t full = w.cols / 8 * 8;
  if (full < w.cols) TransposedColsScalar(w, x, x_stride, T, y, full, w.cols);
}

}  // namespace k3::kernels::internal
