// Router logits, AVX2+FMA body: the AVX-512 body's design (router_dot_avx512.cpp: row groups
// in flight, in-register dword transposes, exact bf16 → fp32 → double widening, one exact-product
// fma per column) with each 8-row group held in two ymm accumulators, rows 0..3 and 4..7. Lane
// l of them is one row, so each lane performs the scalar acc = acc + double(w)·double(x) in
// ascending column order (router_dot.h).
// Compiled with -mavx2 -mfma (CMakeLists.txt); everything here has internal linkage and calls no
// inline function from a header other than the intrinsics (kernels_internal.h says why).
#include <immintrin.h>

#include <cstdint>

#include "k3run/kernels/kernels_internal.h"

namespace k3::kernels::internal {
namespace {

// 2 groups = 16 rows = 4 ymm chains: on the bench shape 1 group took 1.10x, 3 groups 1.03x
// and 4 groups 1.01x the time of 2 (router_dot.h); 16 ymm registers leave little room for more.
constexpr int kGroups = 2;
constexpr int64_t kRowsPerGroup = 8;
constexpr int64_t kColsPerStep = 8;

// GCC at -O2 neither inlines these helpers nor unrolls their short loops by itself, and then
// keeps the accumulators in memory: hence always_inline and the unroll pragmas.
#define K3_ALWAYS_INLINE [[gnu::always_inline]] inline

// Columns c..c+7 of rows r..r+7 as 8 ymm of fp32: f[k] lane l = w[r + l][c + k].
K3_ALWAYS_INLINE void Columns(const uint16_t* w, int64_t cols, int64_t r, int64_t c,
                              __m256 f[8]) {
  __m256i y[4];
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    y[j] = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(w + (r + j + 4) * cols + c),
                               reinterpret_cast<const __m128i*>(w + (r + j) * cols + c));
  }
  const __m256i s0 = _mm256_unpacklo_epi32(y[0], y[1]);  // rows 0,1 | 4,5 × dwords 0,1
  const __m256i s1 = _mm256_unpackhi_epi32(y[0], y[1]);  //                × dwords 2,3
  const __m256i s2 = _mm256_unpacklo_epi32(y[2], y[3]);  // rows 2,3 | 6,7 × dwords 0,1
  const __m256i s3 = _mm256_unpackhi_epi32(y[2], y[3]);  //                × dwords 2,3
  const __m256i t[4] = {
      _mm256_unpacklo_epi64(s0, s2),  // rows 0..3 | 4..7 × dword 0 = cols 0,1
      _mm256_unpackhi_epi64(s0, s2),  // cols 2,3
      _mm256_unpacklo_epi64(s1, s3),  // cols 4,5
      _mm256_unpackhi_epi64(s1, s3),  // cols 6,7
  };
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
#pragma GCC unroll 4
  for (int m = 0; m < 4; ++m) {
    f[2 * m] = _mm256_castsi256_ps(_mm256_slli_epi32(t[m], 16));
    f[2 * m + 1] = _mm256_castsi256_ps(_mm256_and_si256(t[m], high));
  }
}

K3_ALWAYS_INLINE void Columns(const float* w, int64_t cols, int64_t r, int64_t c, __m256 f[8]) {
#pragma GCC unroll 2
  for (int half = 0; half < 2; ++half) {  // columns c + 4·half .. +3
    const int64_t cc = c + 4 * half;
    __m256 y[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      y[j] = _mm256_loadu2_m128(w + (r + j + 4) * cols + cc, w + (r + j) * cols + cc);
    }
    const __m256d s0 = _mm256_castps_pd(_mm256_unpacklo_ps(y[0], y[1]));  // rows 0,1 × cols 0,1
    const __m256d s1 = _mm256_castps_pd(_mm256_unpackhi_ps(y[0], y[1]));  //          × cols 2,3
    const __m256d s2 = _mm256_castps_pd(_mm256_unpacklo_ps(y[2], y[3]));  // rows 2,3
    const __m256d s3 = _mm256_castps_pd(_mm256_unpackhi_ps(y[2], y[3]));
    f[4 * half + 0] = _mm256_castpd_ps(_mm256_unpacklo_pd(s0, s2));
    f[4 * half + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(s0, s2));
    f[4 * half + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(s1, s3));
    f[4 * half + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(s1, s3));
  }
}

double Widen(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return static_cast<double>(f);
}
double Widen(float v) { return static_cast<double>(v); }

// Rows [r, r + 8·G), all columns.
template <int G, typename Elem>
void Groups(const Elem* w, int64_t cols, const float* x, double* out, int64_t r) {
  __m256d lo[G], hi[G];  // rows 0..3 and 4..7 of each group
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) lo[g] = hi[g] = _mm256_setzero_pd();
  int64_t c = 0;
  for (; c + kColsPerStep <= cols; c += kColsPerStep) {
    alignas(32) double xd[kColsPerStep];
    const __m256 xf = _mm256_loadu_ps(x + c);
    _mm256_store_pd(xd, _mm256_cvtps_pd(_mm256_castps256_ps128(xf)));
    _mm256_store_pd(xd + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(xf, 1)));
    __m256 f[G][kColsPerStep];
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) Columns(w, cols, r + kRowsPerGroup * g, c, f[g]);
#pragma GCC unroll 8
    for (int k = 0; k < kColsPerStep; ++k) {
      const __m256d xk = _mm256_set1_pd(xd[k]);
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        lo[g] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(f[g][k])), xk, lo[g]);
        hi[g] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(f[g][k], 1)), xk, hi[g]);
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    alignas(32) double lanes[kRowsPerGroup];
    _mm256_store_pd(lanes, lo[g]);
    _mm256_store_pd(lanes + 4, hi[g]);
    for (int64_t l = 0; l < kRowsPerGroup; ++l) {
      const int64_t row = r + kRowsPerGroup * g + l;
      double a = lanes[l];
      for (int64_t i = c; i < cols; ++i) {  // the ragged columns, still ascending
        a = a + Widen(w[row * cols + i]) * static_cast<double>(x[i]);
      }
      out[row] = a;
    }
  }
}

// [r, r1) is whole 8-row groups.
template <typename Elem>
void Rows(const Elem* w, int64_t cols, const float* x, double* out, int64_t r, int64_t r1) {
  for (; r + kGroups * kRowsPerGroup <= r1; r += kGroups * kRowsPerGroup) {
    Groups<kGroups>(w, cols, x, out, r);
  }
  for (; r + kRowsPerGroup <= r1; r += kRowsPerGroup) Groups<1>(w, cols, x, out, r);
}

#undef K3_ALWAYS_INLINE

// One activation row: whole 8-row groups here, the last < 8 rows by the scalar body (same
// operations per row).
void RowsOfOne(const Matrix& w, const float* x, double* out, int64_t r0, int64_t r1) {
  const int64_t whole = r0 + (r1 - r0) / kRowsPerGroup * kRowsPerGroup;
  if (w.type == WeightType::kBF16) {
    Rows(static_cast<const uint16_t*>(w.data), w.cols, x, out, r0, whole);
  } else {
    Rows(static_cast<const float*>(w.data), w.cols, x, out, r0, whole);
  }
  if (whole < r1) RouterRowsScalar(w, x, 1, out, whole, r1);
}

}  // namespace

void RouterRowsAvx2(const Matrix& w, const float* x, int64_t T, double* out, int64_t r0,
                    int64_t r1) {
  for (int64_t t = 0; t < T; ++t) RowsOfOne(w, x + t * w.cols, out + t * w.rows, r0, r1);
}

}  // namespace k3::kernels::internal
