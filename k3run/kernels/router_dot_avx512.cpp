// Router logits, AVX-512 body: 8 rows per vector (lane g = row r + g), 8 columns at a time
// transposed in registers, then per column acc = acc + w·x with separate multiply and add, in
// ascending column order — the scalar body's exact operations, lane by lane. Compiled with
// -mavx512f (see CMakeLists.txt); calls no inline function from any header (kernels_internal.h).
#include <immintrin.h>

#include "k3run/kernels/router_dot.h"

// GCC 12's AVX-512 intrinsics build their "don't care" operands as `__m512d __Y = __Y;`
// (_mm512_undefined_*, GCC bug 105593), which -Wuninitialized reports at every expansion site.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace k3::kernels::internal {
namespace {

// 8 weights of row `row` from column i, widened to double.
__m512d LoadBf16(const uint16_t* row, int64_t i) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i));
  const __m256i w32 = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
  return _mm512_cvtps_pd(_mm256_castsi256_ps(w32));
}
__m512d LoadF32(const float* row, int64_t i) { return _mm512_cvtps_pd(_mm256_loadu_ps(row + i)); }

// v[g] holds row g's 8 columns; afterwards v[c] holds column c's 8 rows.
void Transpose8x8(__m512d v[8]) {
  __m512d a[8];
  for (int k = 0; k < 4; ++k) {
    a[2 * k] = _mm512_unpacklo_pd(v[2 * k], v[2 * k + 1]);      // cols 0,2,4,6 of rows 2k,2k+1
    a[2 * k + 1] = _mm512_unpackhi_pd(v[2 * k], v[2 * k + 1]);  // cols 1,3,5,7
  }
  const __m512i lo = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);
  const __m512i hi = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
  __m512d b[8];
  // Rows 0–3 (a[0..3]) and rows 4–7 (a[4..7]): pairs of row pairs.
  for (int half = 0; half < 2; ++half) {
    const __m512d* p = a + 4 * half;
    b[4 * half + 0] = _mm512_permutex2var_pd(p[0], lo, p[2]);  // cols 0,4
    b[4 * half + 1] = _mm512_permutex2var_pd(p[1], lo, p[3]);  // cols 1,5
    b[4 * half + 2] = _mm512_permutex2var_pd(p[0], hi, p[2]);  // cols 2,6
    b[4 * half + 3] = _mm512_permutex2var_pd(p[1], hi, p[3]);  // cols 3,7
  }
  const __m512i first = _mm512_set_epi64(11, 10, 9, 8, 3, 2, 1, 0);
  const __m512i second = _mm512_set_epi64(15, 14, 13, 12, 7, 6, 5, 4);
  for (int c = 0; c < 4; ++c) {
    v[c] = _mm512_permutex2var_pd(b[c], first, b[4 + c]);       // cols 0..3
    v[c + 4] = _mm512_permutex2var_pd(b[c], second, b[4 + c]);  // cols 4..7
  }
}

template <bool kBf16>
void Block8(const void* data, int64_t cols, const float* x, double* out, int64_t r) {
  __m512d acc = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= cols; i += 8) {
    __m512d v[8];
    for (int g = 0; g < 8; ++g) {
      if constexpr (kBf16) {
        v[g] = LoadBf16(static_cast<const uint16_t*>(data) + (r + g) * cols, i);
      } else {
        v[g] = LoadF32(static_cast<const float*>(data) + (r + g) * cols, i);
      }
    }
    Transpose8x8(v);
    for (int c = 0; c < 8; ++c) {
      const __m512d xc = _mm512_set1_pd(static_cast<double>(x[i + c]));
      acc = _mm512_add_pd(acc, _mm512_mul_pd(v[c], xc));
    }
  }
  alignas(64) double lanes[8];
  _mm512_store_pd(lanes, acc);
  for (int g = 0; g < 8; ++g) {
    double a = lanes[g];
    for (int64_t k = i; k < cols; ++k) {  // the remaining columns, still ascending
      double wv;
      if constexpr (kBf16) {
        const uint16_t b = static_cast<const uint16_t*>(data)[(r + g) * cols + k];
        const uint32_t bits = static_cast<uint32_t>(b) << 16;
        float f;
        __builtin_memcpy(&f, &bits, sizeof f);
        wv = static_cast<double>(f);
      } else {
        wv = static_cast<double>(static_cast<const float*>(data)[(r + g) * cols + k]);
      }
      a = a + wv * static_cast<double>(x[k]);
    }
    out[r + g] = a;
  }
}

}  // namespace

void RouterRowsAvx512(const Matrix& w, const float* x, double* out, int64_t r0, int64_t r1) {
  const bool bf16 = w.type == WeightType::kBF16;
  int64_t r = r0;
  for (; r + 8 <= r1; r += 8) {
    if (bf16) {
      Block8<true>(w.data, w.cols, x, out, r);
    } else {
      Block8<false>(w.data, w.cols, x, out, r);
    }
  }
  if (r < r1) RouterRowsScalar(w, x, out, r, r1);  // fewer than 8 rows left
}

}  // namespace k3::kernels::internal

#pragma GCC diagnostic pop
