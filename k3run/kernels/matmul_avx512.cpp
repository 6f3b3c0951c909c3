// The AVX-512F/BW path. One zmm holds the 16 lanes of one output element, so lane l of the
// register is lane l of the contract in matmul.h; each fmadd is the scalar fmaf per lane.
// Compiled with -mavx512f -mavx512bw (see CMakeLists.txt): everything here is internal linkage
// and calls nothing inline from a header (kernels_internal.h explains why).
#include <immintrin.h>

#include <cstdint>

#include "k3run/kernels/kernels_internal.h"

// GCC 12's AVX-512 intrinsics build their "don't care" operands as `__m512 __Y = __Y;`
// (_mm512_undefined_*), which -Wuninitialized reports at every expansion site in this file.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace k3::kernels::internal {
namespace {

// Loaders: Load gives the fp32 weights of row r, columns [c, c + 16·kVectors) as kVectors
// 16-lane vectors (c a multiple of 16·kVectors); LoadTail the first lanes of `k` of 16 at the
// ragged end of a row (zeros elsewhere). Only kVectors == 1 loaders have a ragged end.
struct F32Rows {
  static constexpr int kVectors = 1;  // 16-lane vectors per Load
  const float* base;
  int64_t cols;
  void Load(int64_t r, int64_t c, __m512* v) const { v[0] = _mm512_loadu_ps(base + r * cols + c); }
  const void* RowStart(int64_t r) const { return base + r * cols; }
  int64_t row_bytes() const { return cols * 4; }
  void PrefetchSide(int64_t, int64_t) const {}
  __m512 LoadTail(int64_t r, int64_t c, __mmask16 k) const {
    return _mm512_maskz_loadu_ps(k, base + r * cols + c);
  }
};

struct Bf16Rows {
  static constexpr int kVectors = 1;
  const uint16_t* base;
  int64_t cols;
  static __m512 Widen(__m256i h) {  // bf16 bits become the high half of each fp32: exact
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  void Load(int64_t r, int64_t c, __m512* v) const {
    v[0] = Widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + r * cols + c)));
  }
  const void* RowStart(int64_t r) const { return base + r * cols; }
  int64_t row_bytes() const { return cols * 2; }
  void PrefetchSide(int64_t, int64_t) const {}
  __m512 LoadTail(int64_t r, int64_t c, __mmask16 k) const {
    // Masked lanes are not read, so this never touches memory past the row.
    return Widen(_mm512_castsi512_si256(_mm512_maskz_loadu_epi16(k, base + r * cols + c)));
  }
};

// MXFP4 rows are loaded a whole scale group (32 elements, 16 bytes) at a time: one scale and
// LUT row, one load, and the nibbles unpacked in order with two byte interleaves. Lanes still
// see their elements in ascending order (c+l, then c+16+l). cols % 32 == 0 (ValidateMatrix), so
// there is no ragged end.
struct Mxfp4Rows {
  static constexpr int kVectors = 2;
  const uint8_t* packed;
  const uint8_t* scales;
  int64_t cols;
  const Mxfp4LutRow* lut;
  void Load(int64_t r, int64_t c, __m512* v) const {
    const __m128i b =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed + r * (cols / 2) + c / 2));
    // Byte j holds element 2j (low nibble) and 2j+1 (high nibble). Interleaving b with b >> 4
    // puts every element's nibble in the low 4 bits of its own byte, in element order;
    // permutexvar reads only those 4 bits of each index, so the high bits need no mask.
    const __m128i high = _mm_srli_epi16(b, 4);
    const __m512i idx0 = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, high));  // elements 0..15
    const __m512i idx1 = _mm512_cvtepu8_epi32(_mm_unpackhi_epi8(b, high));  // elements 16..31
    const __m512 row =
        _mm512_load_ps(lut[scales[r * (cols / kMxfp4GroupSize) + c / kMxfp4GroupSize]].v);
    v[0] = _mm512_permutexvar_ps(idx0, row);
    v[1] = _mm512_permutexvar_ps(idx1, row);
  }
  __m512 LoadTail(int64_t, int64_t, __mmask16) const { return _mm512_setzero_ps(); }
  const void* RowStart(int64_t r) const { return packed + r * (cols / 2); }
  int64_t row_bytes() const { return cols / 2; }
  // The scales of rows [r, r + n): a few lines, fetched once per tile.
  void PrefetchSide(int64_t r, int64_t n) const {
    const char* p = reinterpret_cast<const char*>(scales + r * (cols / kMxfp4GroupSize));
    for (int64_t b = 0; b < n * (cols / kMxfp4GroupSize); b += 64) {
      _mm_prefetch(p + b, _MM_HINT_T0);
    }
  }
};

// The fixed tree of matmul.h, operands in the same order as the scalar a_l + a_{l+w}.
float Reduce(__m512 a) {
  const __m256 lo8 = _mm512_castps512_ps256(a);
  const __m256 hi8 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
  const __m256 s8 = _mm256_add_ps(lo8, hi8);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

// RB weight rows × TB activation rows, each (row, t) pair one zmm accumulator; the weights of a
// 16-column block are loaded once and used for all TB activations.
template <class L, int RB, int TB>
void Tile(const L& w, int64_t rows, int64_t cols, const float* x, float* y, int64_t r0,
          int64_t t0) {
  __m512 acc[RB][TB];
  const float* xt[TB];
#pragma GCC unroll 16
  for (int t = 0; t < TB; ++t) xt[t] = x + (t0 + t) * cols;
#pragma GCC unroll 16
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 16
    for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  constexpr int S = L::kVectors;
  // Prefetch of the next tile, for one activation (weights streaming from memory) and short
  // rows: the next tile's rows follow this tile's contiguously, but rows of a few KB end before
  // the hardware prefetcher ramps up on each of the RB interleaved streams (bf16 with 768
  // columns ran at 2/3 of the rate of 7168). Longer rows are left to the hardware, and the
  // prefetched bytes stay small enough not to evict x from L1. A hint: no bits change.
  constexpr int64_t kMaxPrefetchBytes = 16 << 10;
  const int64_t steps = cols >= 16 * S ? cols / (16 * S) : 1;  // no <algorithm>: see
                                                                 // kernels_internal.h
  const char* pf = static_cast<const char*>(w.RowStart(r0 + RB));
  int64_t pf_bytes = 0, pf_stride = 0, pf_at = 0;
  if constexpr (TB == 1) {
    const int64_t next_rows = rows - (r0 + RB) < RB ? rows - (r0 + RB) : RB;
    if (next_rows > 0 && next_rows * w.row_bytes() <= kMaxPrefetchBytes) {
      pf_bytes = next_rows * w.row_bytes();
      // bf16 256 B per step, MXFP4 128 (f32 512: only half is prefetched, 4 lines per step)
      pf_stride = (pf_bytes + steps - 1) / steps;
      w.PrefetchSide(r0 + RB, next_rows);
    }
  }
  int64_t c = 0;
  for (; c + 16 * S <= cols; c += 16 * S) {
    __m512 xv[S][TB];
    if constexpr (TB == 1) {
      if (pf_at < pf_bytes) _mm_prefetch(pf + pf_at, _MM_HINT_T0);
      if (pf_at + 64 < pf_bytes) _mm_prefetch(pf + pf_at + 64, _MM_HINT_T0);
      if (pf_at + 128 < pf_bytes) _mm_prefetch(pf + pf_at + 128, _MM_HINT_T0);
      if (pf_at + 192 < pf_bytes) _mm_prefetch(pf + pf_at + 192, _MM_HINT_T0);
      pf_at += pf_stride;
    }
#pragma GCC unroll 16
    for (int v = 0; v < S; ++v) {
#pragma GCC unroll 16
      for (int t = 0; t < TB; ++t) xv[v][t] = _mm512_loadu_ps(xt[t] + c + 16 * v);
    }
#pragma GCC unroll 16
    for (int r = 0; r < RB; ++r) {
      __m512 wv[S];
      w.Load(r0 + r, c, wv);
#pragma GCC unroll 16
      for (int v = 0; v < S; ++v) {
#pragma GCC unroll 16
        for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_fmadd_ps(wv[v], xv[v][t], acc[r][t]);
      }
    }
  }
  if (c < cols) {  // the ragged end: lanes past cols keep their value (mask3 leaves them)
    const __mmask16 k = static_cast<__mmask16>((1u << (cols - c)) - 1u);
    __m512 xv[TB];
    for (int t = 0; t < TB; ++t) xv[t] = _mm512_maskz_loadu_ps(k, xt[t] + c);
    for (int r = 0; r < RB; ++r) {
      const __m512 wv = w.LoadTail(r0 + r, c, k);
      for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_mask3_fmadd_ps(wv, xv[t], acc[r][t], k);
    }
  }
  for (int r = 0; r < RB; ++r) {
    for (int t = 0; t < TB; ++t) y[(t0 + t) * rows + r0 + r] = Reduce(acc[r][t]);
  }
}

// All activation rows for weight rows [r0, r0+RB), in tiles of up to kTB activations.
template <class L, int RB, int kTB>
void RowBlock(const L& w, int64_t rows, int64_t cols, const float* x, int64_t T, float* y,
              int64_t r0) {
  int64_t t = 0;
  for (; t + kTB <= T; t += kTB) Tile<L, RB, kTB>(w, rows, cols, x, y, r0, t);
  for (; t < T; ++t) Tile<L, RB, 1>(w, rows, cols, x, y, r0, t);
}

template <class L>
void Rows(const L& w, int64_t rows, int64_t cols, const float* x, int64_t T, float* y,
          int64_t r_begin, int64_t r_end) {
  int64_t r = r_begin;
  if (T == 1) {
    // One activation: 8 rows in flight hide the FMA latency and keep 8 streams reading.
    for (; r + 8 <= r_end; r += 8) Tile<L, 8, 1>(w, rows, cols, x, y, r, 0);
  } else {
    for (; r + 4 <= r_end; r += 4) RowBlock<L, 4, 4>(w, rows, cols, x, T, y, r);
  }
  for (; r < r_end; ++r) RowBlock<L, 1, 4>(w, rows, cols, x, T, y, r);
}

}  // namespace

void MatMulRowsAvx512(const Matrix& w, const float* x, int64_t T, float* y, int64_t r_begin,
                      int64_t r_end) {
  switch (w.type) {
    case WeightType::kF32:
      Rows(F32Rows{static_cast<const float*>(w.data), w.cols}, w.rows, w.cols, x, T, y, r_begin,
           r_end);
      return;
    case WeightType::kBF16:
      Rows(Bf16Rows{static_cast<const uint16_t*>(w.data), w.cols}, w.rows, w.cols, x, T, y, r_begin,
           r_end);
      return;
    case WeightType::kMXFP4:
      Rows(Mxfp4Rows{static_cast<const uint8_t*>(w.data), w.scales, w.cols, Mxfp4Lut()}, w.rows,
           w.cols, x, T, y, r_begin, r_end);
      return;
  }
}

}  // namespace k3::kernels::internal

#pragma GCC diagnostic pop
