// The AVX2+FMA path. The 16 lanes of one output element are two ymm registers: lanes 0..7 in
// `lo`, 8..15 in `hi`; each fmadd is the scalar fmaf of matmul.h per lane.
// Compiled with -mavx2 -mfma (see CMakeLists.txt): everything here is internal linkage and
// calls nothing inline from a header (kernels_internal.h explains why).
#include <immintrin.h>

#include <cstdint>

#include "k3run/kernels/kernels_internal.h"

namespace k3::kernels::internal {
namespace {

struct V16 {
  __m256 lo, hi;
};

// Lanes [0, n) of a ragged end, as a blend mask (all bits set where the element exists).
V16 TailMask(int64_t n) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i count = _mm256_set1_epi32(static_cast<int>(n));
  return {
      _mm256_castsi256_ps(_mm256_cmpgt_epi32(count, lane)),
      _mm256_castsi256_ps(_mm256_cmpgt_epi32(count, _mm256_add_epi32(lane, _mm256_set1_epi32(8))))};
}

// n < 16 floats into a zero-padded register pair; AVX2 has no masked 16-bit loads, so ragged
// ends go through a small buffer instead of reading past the row.
V16 LoadPaddedF32(const float* p, int64_t n) {
  alignas(32) float buf[16] = {};
  for (int64_t i = 0; i < n; ++i) buf[i] = p[i];
  return {_mm256_load_ps(buf), _mm256_load_ps(buf + 8)};
}

__m256 WidenBf16(__m128i h) {  // 8 bf16 → 8 fp32, exact
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Loaders: the 16 fp32 weights of row r, columns [c, c+16), or the first n of them.
struct F32Rows {
  static constexpr int kStepBytes = 64;  // bytes of a row one Load reads
  const float* base;
  int64_t cols;
  V16 Load(int64_t r, int64_t c) const {
    const float* p = base + r * cols + c;
    return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
  }
  V16 LoadTail(int64_t r, int64_t c, int64_t n) const {
    return LoadPaddedF32(base + r * cols + c, n);
  }
  const void* RowStart(int64_t r) const { return base + r * cols; }
  int64_t row_bytes() const { return cols * 4; }
  void PrefetchSide(int64_t, int64_t) const {}
};

struct Bf16Rows {
  static constexpr int kStepBytes = 32;
  const uint16_t* base;
  int64_t cols;
  V16 Load(int64_t r, int64_t c) const {
    const __m128i* p = reinterpret_cast<const __m128i*>(base + r * cols + c);
    return {WidenBf16(_mm_loadu_si128(p)), WidenBf16(_mm_loadu_si128(p + 1))};
  }
  V16 LoadTail(int64_t r, int64_t c, int64_t n) const {
    alignas(32) uint16_t buf[16] = {};
    const uint16_t* p = base + r * cols + c;
    for (int64_t i = 0; i < n; ++i) buf[i] = p[i];
    const __m128i* b = reinterpret_cast<const __m128i*>(buf);
    return {WidenBf16(_mm_load_si128(b)), WidenBf16(_mm_load_si128(b + 1))};
  }
  const void* RowStart(int64_t r) const { return base + r * cols; }
  int64_t row_bytes() const { return cols * 2; }
  void PrefetchSide(int64_t, int64_t) const {}
};

struct Mxfp4Rows {
  static constexpr int kStepBytes = 8;
  const uint8_t* packed;
  const uint8_t* scales;
  int64_t cols;
  const Mxfp4LutRow* lut;
  V16 Load(int64_t r, int64_t c) const {
    // Elements 0..7 of the block are the 8 nibbles of its first 4 bytes (low nibble = even
    // element), 8..15 those of the next 4. Each 4 bytes are broadcast to every dword lane (a
    // load, no shuffle) and lane j shifted right by 4j, so lane j's low 4 bits are element j's
    // nibble: its low 3 bits index the magnitude (permutevar8x32 reads only those) and bit 3,
    // moved to bit 31, is its sign. Rows 8..15 of the table are rows 0..7 with the sign bit
    // set, so XOR with the sign gives the same bits as the 16-entry lookup of the scalar path.
    const uint8_t* p = packed + r * (cols / 2) + c / 2;
    const __m256i shift = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i i0 = _mm256_srlv_epi32(_mm256_broadcastd_epi32(_mm_loadu_si32(p)), shift);
    const __m256i i1 = _mm256_srlv_epi32(_mm256_broadcastd_epi32(_mm_loadu_si32(p + 4)), shift);
    const __m256 mag =
        _mm256_load_ps(lut[scales[r * (cols / kMxfp4GroupSize) + c / kMxfp4GroupSize]].v);
    const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
    const __m256 s0 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(i0, 28), sign));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(i1, 28), sign));
    return {_mm256_xor_ps(_mm256_permutevar8x32_ps(mag, i0), s0),
            _mm256_xor_ps(_mm256_permutevar8x32_ps(mag, i1), s1)};
  }
  V16 LoadTail(int64_t, int64_t, int64_t) const {  // unreachable: MXFP4 cols % 32 == 0
    return {_mm256_setzero_ps(), _mm256_setzero_ps()};
  }
  const void* RowStart(int64_t r) const { return packed + r * (cols / 2); }
  int64_t row_bytes() const { return cols / 2; }
  void PrefetchSide(int64_t r, int64_t n) const {  // the scales of rows [r, r + n)
    const char* p = reinterpret_cast<const char*>(scales + r * (cols / kMxfp4GroupSize));
    for (int64_t b = 0; b < n * (cols / kMxfp4GroupSize); b += 64) {
      _mm_prefetch(p + b, _MM_HINT_T0);
    }
  }
};

// The fixed tree of matmul.h, operands in the same order as the scalar a_l + a_{l+w}.
float Reduce(V16 a) {
  const __m256 s8 = _mm256_add_ps(a.lo, a.hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

// RB weight rows × TB activation rows; each (row, t) pair is one register pair of lanes.
template <class L, int RB, int TB, int kAhead>
void Tile(const L& w, int64_t rows, int64_t cols, const float* x, float* y, int64_t r0,
          int64_t t0, int64_t ahead = 1) {
  V16 acc[RB][TB];
  const float* xt[TB];
#pragma GCC unroll 16
  for (int t = 0; t < TB; ++t) xt[t] = x + (t0 + t) * cols;
#pragma GCC unroll 16
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 16
    for (int t = 0; t < TB; ++t) acc[r][t] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  }
  // As in matmul_avx512.cpp: acc stays in registers only while it is indexed by constants
  // (the loops below are unrolled) and the prefetch of the next tile (kAhead = 1, by the tiles
  // RowBlock picks, for short rows: bf16 with 768 columns streams at 2/3 of the rate of long
  // rows without it) is one pointer with no branch in the loop, walking this tile's own rows
  // when there is nothing to fetch. Longer rows (kAhead = -1) are prefetched in place,
  // kInRowAheadBytes ahead in each row, as on avx512 (both bounds: kernels_internal.h). The
  // prefetched tile is `ahead` tiles on (Rows: short rows reach further).
  constexpr int64_t kStride = RB * L::kStepBytes;
  const char* pf = static_cast<const char*>(w.RowStart(r0));
  if constexpr (kAhead > 0) {
    if (rows - r0 >= (ahead + 1) * RB && RB * w.row_bytes() <= kMaxPrefetchBytes) {
      pf = static_cast<const char*>(w.RowStart(r0 + ahead * RB));
      w.PrefetchSide(r0 + ahead * RB, RB);
    }
  }
  int64_t c = 0;
  for (; c + 16 <= cols; c += 16) {
    if constexpr (kAhead > 0) {
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) _mm_prefetch(pf + 64 * i, _MM_HINT_T0);
      pf += kStride;
    }
    if constexpr (kAhead < 0) {
#pragma GCC unroll 16
      for (int r = 0; r < RB; ++r) {
        _mm_prefetch(static_cast<const char*>(w.RowStart(r0 + r)) + c / 16 * L::kStepBytes +
                         kInRowAheadBytes,
                     _MM_HINT_T0);
      }
    }
    V16 xv[TB];
#pragma GCC unroll 16
    for (int t = 0; t < TB; ++t)
      xv[t] = {_mm256_loadu_ps(xt[t] + c), _mm256_loadu_ps(xt[t] + c + 8)};
#pragma GCC unroll 16
    for (int r = 0; r < RB; ++r) {
      const V16 wv = w.Load(r0 + r, c);
#pragma GCC unroll 16
      for (int t = 0; t < TB; ++t) {
        acc[r][t].lo = _mm256_fmadd_ps(wv.lo, xv[t].lo, acc[r][t].lo);
        acc[r][t].hi = _mm256_fmadd_ps(wv.hi, xv[t].hi, acc[r][t].hi);
      }
    }
  }
  if (c < cols) {  // the ragged end: lanes past cols keep their value (blend)
    const int64_t n = cols - c;
    const V16 keep = TailMask(n);
#pragma GCC unroll 16
    for (int t = 0; t < TB; ++t) {
      const V16 xv = LoadPaddedF32(xt[t] + c, n);
#pragma GCC unroll 16
      for (int r = 0; r < RB; ++r) {
        const V16 wv = w.LoadTail(r0 + r, c, n);
        V16& a = acc[r][t];
        a.lo = _mm256_blendv_ps(a.lo, _mm256_fmadd_ps(wv.lo, xv.lo, a.lo), keep.lo);
        a.hi = _mm256_blendv_ps(a.hi, _mm256_fmadd_ps(wv.hi, xv.hi, a.hi), keep.hi);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 16
    for (int t = 0; t < TB; ++t) y[(t0 + t) * rows + r0 + r] = Reduce(acc[r][t]);
  }
}

template <class L, int RB, int kTB>
void RowBlock(const L& w, int64_t rows, int64_t cols, const float* x, int64_t T, float* y,
              int64_t r0) {
  int64_t t = 0;
  // The next rows are prefetched (see Tile) by a tile of 1 activation and by a first tile of 2,
  // never by tiles of 4, which need their registers, nor by a tile of 2 that another follows
  // over the same rows (bf16 768×3584 at T = 4 on avx2 ran at 0.7× with it).
  // Rows too long for that prefetch their own rows ahead in the first tile.
  if (RB * w.row_bytes() > kMaxPrefetchBytes && T >= kTB) {
    Tile<L, RB, kTB, -1>(w, rows, cols, x, y, r0, 0);
    t = kTB;
  } else if constexpr (kTB <= 2) {
    if (T == kTB) {
      Tile<L, RB, kTB, 1>(w, rows, cols, x, y, r0, 0);
      return;
    }
  }
  for (; t + kTB <= T; t += kTB) Tile<L, RB, kTB, 0>(w, rows, cols, x, y, r0, t);
  for (; t < T; ++t) Tile<L, RB, 1, 1>(w, rows, cols, x, y, r0, t);
}

// Tiles of rb rows that a T = 1 tile prefetches ahead: at least kShortRowsAheadBytes (as on
// avx512: an expert's 256-column MXFP4 rows are 512 bytes a tile of 4). The tiles before the
// first one's target are prefetched here, all at once. (No std::min/max: this file calls no
// inline function from a header, kernels_internal.h.)
template <class L>
int64_t TilesAhead(const L& w, int64_t rb, int64_t r, int64_t r_end) {
  const int64_t tile = rb * w.row_bytes();
  const int64_t ahead = tile >= kShortRowsAheadBytes ? 1 : (kShortRowsAheadBytes + tile - 1) / tile;
  if (ahead > 1) {
    const int64_t n = (r + ahead * rb < r_end ? r + ahead * rb : r_end) - r;
    const char* p = static_cast<const char*>(w.RowStart(r));
    for (int64_t b = 0; b < n * w.row_bytes(); b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
    w.PrefetchSide(r, n);
  }
  return ahead;
}

template <class L>
void Rows(const L& w, int64_t rows, int64_t cols, const float* x, int64_t T, float* y,
          int64_t r_begin, int64_t r_end) {
  int64_t r = r_begin;
  // 16 ymm registers: 4 rows × 1 activation or 2 × 2 leaves room for the operands.
  if (T == 1) {
    if (4 * w.row_bytes() <= kMaxPrefetchBytes) {
      const int64_t ahead = TilesAhead(w, 4, r, r_end);
      for (; r + 4 <= r_end; r += 4) Tile<L, 4, 1, 1>(w, rows, cols, x, y, r, 0, ahead);
    } else {
      for (; r + 4 <= r_end; r += 4) Tile<L, 4, 1, -1>(w, rows, cols, x, y, r, 0);
    }
  } else {
    for (; r + 2 <= r_end; r += 2) RowBlock<L, 2, 2>(w, rows, cols, x, T, y, r);
  }
  for (; r < r_end; ++r) RowBlock<L, 1, 2>(w, rows, cols, x, T, y, r);
}

}  // namespace

void MatMulRowsAvx2(const Matrix& w, const float* x, int64_t T, float* y, int64_t r_begin,
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
