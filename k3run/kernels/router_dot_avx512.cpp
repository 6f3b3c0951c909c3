// Router logits, AVX-512F body: lane l of a zmm accumulator is row r + l, so each lane performs
// the scalar acc = acc + double(w)·double(x) in ascending column order (router_dot.h).
//
// Why it is faster than the scalar body although every add of a row is still serial:
//  - kGroups independent 8-row groups advance through the columns together, so kGroups
//    accumulator chains are in flight and the add latency is hidden (one group alone is
//    latency-bound: measured 1.3x slower than two);
//  - the 8 rows' values of a column reach one vector by an in-register transpose instead of a
//    load + convert per element. A bf16 row is read as dwords, each holding the columns
//    (2m, 2m+1); ymm y_j = [row j | row j+4] × 8 columns, j < 4; a 4×4 dword transpose per
//    128-bit lane (unpack epi32, then epi64) gives t_m = rows 0..3 | 4..7 × dword m. The
//    even column's bf16 is the low half of each dword, the odd column's the high half, so
//    `t_m << 16` and `t_m & 0xFFFF0000` are the two columns as exact fp32 (bf16 widening is
//    placing the bits in the high half), cvtps_pd widens them exactly to double.
//  - one fused multiply-add per column: the product of a bf16 or f32 and an f32 has at most
//    48 significant bits and an exponent far inside double's range, so it is exact in double
//    and fma(w, x, acc) rounds once, exactly like acc + (w·x) with the multiply separate.
// F32 weights take the same route one level up (unpack epi32 of columns, then pd).
// The columns past the last whole step of 8, and rows past the last whole group of 8, are
// finished by scalar code with the same operations.
// Compiled with -mavx512f -mavx512bw (CMakeLists.txt); everything here has internal linkage and
// calls no inline function from a header other than the intrinsics (kernels_internal.h says why).
#include <immintrin.h>

#include <cstdint>

#include "k3run/kernels/kernels_internal.h"

// GCC 12's AVX-512 intrinsics build their "don't care" operands as `__m512d __Y = __Y;`
// (_mm512_undefined_*), which -Wuninitialized reports at every expansion site in this file.
// (Clang has neither the false positive nor the second warning's name.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace k3::kernels::internal {
namespace {

// 2 groups = 16 rows in flight. Measured against 2 (single thread, ns per call): at [896][768]
// 1 group took 1.30x, 3 groups 1.04x, 4 groups 0.98x; at [896][7168] 3 groups took 1.14x and 4
// groups 1.48x: a row stride of 14,336 bytes puts every row in the same 2 of L1's 64 sets, and
// 32 rows of lines no longer fit their 8 ways.
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

// Rows [r, r + 8·G), all columns, for NX activation rows x[0..NX) (out[a] is row a's [rows]):
// each step's transposed columns feed every activation, so the weights are read and transposed
// once for all NX; each (row, activation) keeps its own accumulator lane with the single-row
// operations in the single-row order. The next `next_rows` rows (contiguous after these) are
// prefetched along the way when they are short: the engine's gate comes from memory, not cache,
// and rows of 1.5 KB end before the hardware prefetcher ramps up on 16 streams (as in MatMul).
template <int G, int NX, typename Elem>
void Groups(const Elem* w, int64_t cols, const float* const* x, double* const* out, int64_t r,
            int64_t next_rows) {
  constexpr int64_t kMaxGroupPrefetchBytes = 32 << 10;
  const char* pf = reinterpret_cast<const char*>(w + (r + kRowsPerGroup * G) * cols);
  int64_t pf_bytes = next_rows * cols * static_cast<int64_t>(sizeof(Elem));
  if (pf_bytes > kMaxGroupPrefetchBytes) pf_bytes = 0;
  const int64_t steps = cols >= kColsPerStep ? cols / kColsPerStep : 1;
  const int64_t pf_stride = (pf_bytes + steps - 1) / steps;  // bf16: 256 B per step
  int64_t pf_at = 0;
  __m512d acc[NX][G];
#pragma GCC unroll 8
  for (int a = 0; a < NX; ++a) {
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) acc[a][g] = _mm512_setzero_pd();
  }
  int64_t c = 0;
  for (; c + kColsPerStep <= cols; c += kColsPerStep) {
    for (int64_t b = 0; b < pf_stride && pf_at < pf_bytes; b += 64, pf_at += 64) {
      _mm_prefetch(pf + pf_at, _MM_HINT_T0);
    }
    alignas(64) double xd[NX][kColsPerStep];
#pragma GCC unroll 8
    for (int a = 0; a < NX; ++a) _mm512_store_pd(xd[a], _mm512_cvtps_pd(_mm256_loadu_ps(x[a] + c)));
    __m256 f[G][kColsPerStep];
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) Columns(w, cols, r + kRowsPerGroup * g, c, f[g]);
#pragma GCC unroll 8
    for (int k = 0; k < kColsPerStep; ++k) {
      __m512d wd[G];
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) wd[g] = _mm512_cvtps_pd(f[g][k]);
#pragma GCC unroll 8
      for (int a = 0; a < NX; ++a) {
        const __m512d xk = _mm512_set1_pd(xd[a][k]);
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) acc[a][g] = _mm512_fmadd_pd(wd[g], xk, acc[a][g]);
      }
    }
  }
  for (int a = 0; a < NX; ++a) {
    for (int g = 0; g < G; ++g) {
      alignas(64) double lanes[kRowsPerGroup];
      _mm512_store_pd(lanes, acc[a][g]);
      for (int64_t l = 0; l < kRowsPerGroup; ++l) {
        const int64_t row = r + kRowsPerGroup * g + l;
        double s = lanes[l];
        for (int64_t i = c; i < cols; ++i) {  // the ragged columns, still ascending
          s = s + Widen(w[row * cols + i]) * static_cast<double>(x[a][i]);
        }
        out[a][row] = s;
      }
    }
  }
}

// [r, r1) is whole 8-row groups; NX activation rows.
template <int NX, typename Elem>
void Rows(const Elem* w, int64_t cols, const float* const* x, double* const* out, int64_t r,
          int64_t r1) {
  constexpr int64_t kStep = kGroups * kRowsPerGroup;
  for (; r + kStep <= r1; r += kStep) {
    Groups<kGroups, NX>(w, cols, x, out, r, r1 - (r + kStep) < kStep ? r1 - (r + kStep) : kStep);
  }
  for (; r + kRowsPerGroup <= r1; r += kRowsPerGroup) Groups<1, NX>(w, cols, x, out, r, 0);
}

// Activation rows in tiles of kTile (the accumulators of 2 groups × 4 activations and the 16
// transposed column vectors fill the register file), the rest 2 then 1 at a time.
constexpr int kTile = 4;

template <typename Elem>
void Activations(const Elem* w, int64_t cols, int64_t rows, const float* x, int64_t T,
                 double* out, int64_t r0, int64_t r1) {
  const float* xs[kTile];
  double* os[kTile];
  auto point = [&](int64_t t, int n) {
    for (int a = 0; a < n; ++a) {
      xs[a] = x + (t + a) * cols;
      os[a] = out + (t + a) * rows;
    }
  };
  int64_t t = 0;
  for (; t + kTile <= T; t += kTile) {
    point(t, kTile);
    Rows<kTile>(w, cols, xs, os, r0, r1);
  }
  if (t + 2 <= T) {
    point(t, 2);
    Rows<2>(w, cols, xs, os, r0, r1);
    t += 2;
  }
  if (t < T) {
    point(t, 1);
    Rows<1>(w, cols, xs, os, r0, r1);
  }
}

// Prefill widths (T >= kPanelMinT): the tiles above transpose a group's columns again for every
// 4 activations, and those shuffles and conversions cost about as much as the FMAs. Here a
// 16-row pair's columns are transposed once per block of kPanelCols into a panel of doubles
// (panel[c][l] = w[r + l][c]) that every activation then reads with plain loads, kPanelTile
// activations at a time. The accumulators live in `out` between blocks (row t's 16 sums of the
// pair are contiguous there), so each (row, activation) still adds its columns in ascending
// order with the same fma(w, x, acc): the same bits. Stack buffers only (no std::vector: see
// kernels_internal.h).
constexpr int64_t kPanelMinT = 8;
constexpr int64_t kPanelCols = 128;  // a panel: 16 rows × 128 columns × 8 B = 16 KiB
constexpr int kPanelTile = 8;        // 8 activations × 2 groups = 16 accumulators
constexpr int64_t kPairRows = 2 * kRowsPerGroup;

// acc = out + t·rows + r for NX activations (stride `rows`); xd [NX][kPanelCols]; n columns.
template <int NX>
void PanelTile(const double* panel, int64_t n, const double* xd, double* acc, int64_t rows) {
  __m512d a[NX][2];
#pragma GCC unroll 8
  for (int i = 0; i < NX; ++i) {
    a[i][0] = _mm512_loadu_pd(acc + i * rows);
    a[i][1] = _mm512_loadu_pd(acc + i * rows + kRowsPerGroup);
  }
  for (int64_t c = 0; c < n; ++c) {
    const __m512d p0 = _mm512_load_pd(panel + c * kPairRows);
    const __m512d p1 = _mm512_load_pd(panel + c * kPairRows + kRowsPerGroup);
#pragma GCC unroll 8
    for (int i = 0; i < NX; ++i) {
      const __m512d xb = _mm512_set1_pd(xd[i * kPanelCols + c]);
      a[i][0] = _mm512_fmadd_pd(p0, xb, a[i][0]);
      a[i][1] = _mm512_fmadd_pd(p1, xb, a[i][1]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < NX; ++i) {
    _mm512_storeu_pd(acc + i * rows, a[i][0]);
    _mm512_storeu_pd(acc + i * rows + kRowsPerGroup, a[i][1]);
  }
}

// Rows [r, r + 16) for all T activation rows.
template <typename Elem>
void Pair(const Elem* w, int64_t cols, int64_t rows, const float* x, int64_t T, double* out,
          int64_t r) {
  alignas(64) double panel[kPanelCols * kPairRows];
  alignas(64) double xd[kPanelTile * kPanelCols];
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t l = 0; l < kPairRows; ++l) out[t * rows + r + l] = 0.0;
  }
  const int64_t whole = cols / kColsPerStep * kColsPerStep;  // the rest: ragged, below
  for (int64_t cb = 0; cb < whole; cb += kPanelCols) {
    const int64_t n = whole - cb < kPanelCols ? whole - cb : kPanelCols;
    for (int64_t c = 0; c < n; c += kColsPerStep) {
      __m256 f[2][kColsPerStep];
      Columns(w, cols, r, cb + c, f[0]);
      Columns(w, cols, r + kRowsPerGroup, cb + c, f[1]);
#pragma GCC unroll 8
      for (int k = 0; k < kColsPerStep; ++k) {
        _mm512_store_pd(panel + (c + k) * kPairRows, _mm512_cvtps_pd(f[0][k]));
        _mm512_store_pd(panel + (c + k) * kPairRows + kRowsPerGroup, _mm512_cvtps_pd(f[1][k]));
      }
    }
    for (int64_t t = 0; t < T; t += kPanelTile) {
      const int64_t nx = T - t < kPanelTile ? T - t : kPanelTile;
      for (int64_t i = 0; i < nx; ++i) {
        for (int64_t c = 0; c < n; c += kColsPerStep) {
          _mm512_store_pd(xd + i * kPanelCols + c,
                          _mm512_cvtps_pd(_mm256_loadu_ps(x + (t + i) * cols + cb + c)));
        }
      }
      double* acc = out + t * rows + r;
      switch (nx) {
        case 8: PanelTile<8>(panel, n, xd, acc, rows); break;
        case 7: PanelTile<7>(panel, n, xd, acc, rows); break;
        case 6: PanelTile<6>(panel, n, xd, acc, rows); break;
        case 5: PanelTile<5>(panel, n, xd, acc, rows); break;
        case 4: PanelTile<4>(panel, n, xd, acc, rows); break;
        case 3: PanelTile<3>(panel, n, xd, acc, rows); break;
        case 2: PanelTile<2>(panel, n, xd, acc, rows); break;
        default: PanelTile<1>(panel, n, xd, acc, rows); break;
      }
    }
  }
  for (int64_t t = 0; t < T; ++t) {  // the ragged columns, still ascending
    for (int64_t l = 0; l < kPairRows; ++l) {
      const int64_t row = r + l;
      double s = out[t * rows + row];
      for (int64_t i = whole; i < cols; ++i) {
        s = s + Widen(w[row * cols + i]) * static_cast<double>(x[t * cols + i]);
      }
      out[t * rows + row] = s;
    }
  }
}

#undef K3_ALWAYS_INLINE

}  // namespace

void RouterRowsAvx512(const Matrix& w, const float* x, int64_t T, double* out, int64_t r0,
                      int64_t r1) {
  // Whole 8-row groups here; the last < 8 rows take the scalar body (same operations per row).
  const int64_t whole = r0 + (r1 - r0) / kRowsPerGroup * kRowsPerGroup;
  if (T >= kPanelMinT) {  // whole 16-row pairs through panels; an 8-row group left below
    const int64_t pairs_end = r0 + (whole - r0) / kPairRows * kPairRows;
    for (; r0 < pairs_end; r0 += kPairRows) {
      if (w.type == WeightType::kBF16) {
        Pair(static_cast<const uint16_t*>(w.data), w.cols, w.rows, x, T, out, r0);
      } else {
        Pair(static_cast<const float*>(w.data), w.cols, w.rows, x, T, out, r0);
      }
    }
  }
  if (w.type == WeightType::kBF16) {
    Activations(static_cast<const uint16_t*>(w.data), w.cols, w.rows, x, T, out, r0, whole);
  } else {
    Activations(static_cast<const float*>(w.data), w.cols, w.rows, x, T, out, r0, whole);
  }
  if (whole < r1) RouterRowsScalar(w, x, T, out, whole, r1);
}

}  // namespace k3::kernels::internal

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
