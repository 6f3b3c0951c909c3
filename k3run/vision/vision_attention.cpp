// The tower's attention: 2-D RoPE, the q/k/v layouts, and the key-tiled online softmax
// (vision_attention.h has the layouts and the numerics).
#include "k3run/vision/vision_attention.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "k3run/kernels/matmul.h"
#include "k3run/kernels/thread_pool.h"
#include "k3run/ops/math.h"

namespace k3::vision::internal {

RopeTables BuildRope(const VisionDims& dims, int64_t gh, int64_t gw) {
  RopeTables t;
  const int64_t d = dims.head_dim;
  t.quarter = d / 4;
  // f_i = theta^(−4i/d) (the reference: 1 / theta^(arange(0, d, 4)[:d/4] / d)), in double (the
  // reference's fp32 angles differ by < 3e-5 rad at 512 patches a side). Entry 2i is the column
  // angle, 2i+1 the row angle: the ports' code stacks [x_cis, y_cis]; one port's docstring says
  // the opposite, and the code, which is what ran, is followed (docs/VISION.md).
  std::vector<double> freq(static_cast<size_t>(t.quarter));
  for (int64_t i = 0; i < t.quarter; ++i) {
    freq[static_cast<size_t>(i)] =
        1.0 / std::pow(dims.rope_theta, static_cast<double>(4 * i) / static_cast<double>(d));
  }
  auto fill = [&](int64_t count, std::vector<float>& cs, std::vector<float>& sn) {
    cs.resize(static_cast<size_t>(count * t.quarter));
    sn.resize(cs.size());
    for (int64_t pos = 0; pos < count; ++pos) {
      for (int64_t i = 0; i < t.quarter; ++i) {
        const double a = static_cast<double>(pos) * freq[static_cast<size_t>(i)];
        cs[static_cast<size_t>(pos * t.quarter + i)] = static_cast<float>(std::cos(a));
        sn[static_cast<size_t>(pos * t.quarter + i)] = static_cast<float>(std::sin(a));
      }
    }
  };
  fill(gw, t.col_cos, t.col_sin);
  fill(gh, t.row_cos, t.row_sin);
  return t;
}

void ScatterHead(const VisionDims& dims, const RopeTables& rope, int64_t gw, int64_t n,
                 const float* qs, const float* ks, const float* vs, int64_t p0, int64_t rows,
                 float* q, float* kt, float* v) {
  const int64_t d = dims.head_dim, qt = rope.quarter;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t p = p0 + i, r = p / gw, c = p % gw;
    const float* ccos = rope.col_cos.data() + c * qt;
    const float* csin = rope.col_sin.data() + c * qt;
    const float* rcos = rope.row_cos.data() + r * qt;
    const float* rsin = rope.row_sin.data() + r * qt;
    const int64_t tile = p / kKeyTile, within = p % kKeyTile;
    const int64_t len = std::min<int64_t>(kKeyTile, n - tile * kKeyTile);
    const float* qi = qs + i * d;
    const float* ki = ks + i * d;
    float* qd = q + p * d;
    float* kd = kt + tile * kKeyTile * d + within;  // column `within` of the tile's [d][len]
    for (int64_t t = 0; t < d / 2; ++t) {
      // Pair t: even pairs turn with the column, odd pairs with the row, frequency t/2.
      const float cs = (t & 1) == 0 ? ccos[t / 2] : rcos[t / 2];
      const float sn = (t & 1) == 0 ? csin[t / 2] : rsin[t / 2];
      const float qa = qi[2 * t], qb = qi[2 * t + 1];
      qd[2 * t] = qa * cs - qb * sn;
      qd[2 * t + 1] = qa * sn + qb * cs;
      const float ka = ki[2 * t], kb = ki[2 * t + 1];
      kd[(2 * t) * len] = ka * cs - kb * sn;
      kd[(2 * t + 1) * len] = ka * sn + kb * cs;
    }
    std::memcpy(v + p * d, vs + i * d, static_cast<size_t>(d) * 4);
  }
}

namespace {

// ---- the two products of a key tile, in outer-product form ------------------------------------
// Scores: s[i][k] = fmaf-chain over j ascending of q[i][j]·kt[j][k] from +0 (one accumulator per
// score, one rounding per step). P·V: acc[i][c] = fmaf-chain over k ascending of p[i][k]·v[k][c],
// continuing from acc. The SIMD bodies hold one score (or output column) per lane and broadcast
// the other operand, so no lane ever adds to another: every path does the same fmaf sequence per
// element, bit for bit (std::fmaf is correctly rounded, as is vfmadd). Remainders go to the
// portable loops below, which are the reference.

void ScoresPortable(const float* q, const float* kt, int64_t B, int64_t len, int64_t d, float* s,
                    int64_t k_begin) {
  for (int64_t i = 0; i < B; ++i) {
    for (int64_t k = k_begin; k < len; ++k) {
      float a = 0.0f;
      for (int64_t j = 0; j < d; ++j) a = std::fmaf(q[i * d + j], kt[j * len + k], a);
      s[i * len + k] = a;
    }
  }
}

void PvPortable(const float* p, const float* v, int64_t B, int64_t len, int64_t d, float* acc,
                int64_t c_begin) {
  for (int64_t i = 0; i < B; ++i) {
    for (int64_t c = c_begin; c < d; ++c) {
      float a = acc[i * d + c];
      for (int64_t k = 0; k < len; ++k) a = std::fmaf(p[i * len + k], v[k * d + c], a);
      acc[i * d + c] = a;
    }
  }
}

// 4 queries × 32 keys (8 zmm accumulators) per block; then 1 query × 32 keys; keys past the
// last multiple of 32 go 16 at a time, the last ones masked.
__attribute__((target("avx512f"))) void ScoresAvx512(const float* q, const float* kt, int64_t B,
                                                     int64_t len, int64_t d, float* s) {
  const int64_t kfull = len / 32 * 32;
  for (int64_t k0 = 0; k0 < kfull; k0 += 32) {
    int64_t i = 0;
    for (; i + 4 <= B; i += 4) {
      __m512 a[4][2];
      #pragma GCC unroll 16
      for (int r = 0; r < 4; ++r) a[r][0] = a[r][1] = _mm512_setzero_ps();
      for (int64_t j = 0; j < d; ++j) {
        const __m512 k0v = _mm512_loadu_ps(kt + j * len + k0);
        const __m512 k1v = _mm512_loadu_ps(kt + j * len + k0 + 16);
        #pragma GCC unroll 16
        for (int r = 0; r < 4; ++r) {
          const __m512 qb = _mm512_set1_ps(q[(i + r) * d + j]);
          a[r][0] = _mm512_fmadd_ps(qb, k0v, a[r][0]);
          a[r][1] = _mm512_fmadd_ps(qb, k1v, a[r][1]);
        }
      }
      #pragma GCC unroll 16
      for (int r = 0; r < 4; ++r) {
        _mm512_storeu_ps(s + (i + r) * len + k0, a[r][0]);
        _mm512_storeu_ps(s + (i + r) * len + k0 + 16, a[r][1]);
      }
    }
    for (; i < B; ++i) {
      __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
      for (int64_t j = 0; j < d; ++j) {
        const __m512 qb = _mm512_set1_ps(q[i * d + j]);
        a0 = _mm512_fmadd_ps(qb, _mm512_loadu_ps(kt + j * len + k0), a0);
        a1 = _mm512_fmadd_ps(qb, _mm512_loadu_ps(kt + j * len + k0 + 16), a1);
      }
      _mm512_storeu_ps(s + i * len + k0, a0);
      _mm512_storeu_ps(s + i * len + k0 + 16, a1);
    }
  }
  // 16 keys at a time, the last ones masked (masked lanes load 0 and are never stored).
  for (int64_t k0 = kfull; k0 < len; k0 += 16) {
    const int64_t left = len - k0;
    const __mmask16 mask = left >= 16 ? static_cast<__mmask16>(0xFFFF)
                                      : static_cast<__mmask16>((1u << left) - 1u);
    for (int64_t i = 0; i < B; ++i) {
      __m512 a = _mm512_setzero_ps();
      for (int64_t j = 0; j < d; ++j) {
        a = _mm512_fmadd_ps(_mm512_set1_ps(q[i * d + j]),
                            _mm512_maskz_loadu_ps(mask, kt + j * len + k0), a);
      }
      _mm512_mask_storeu_ps(s + i * len + k0, mask, a);
    }
  }
}

// 4 queries × 64 output columns (16 zmm accumulators) per block; leftover queries 1 × 64;
// columns past the last multiple of 64 (head_dim 128 has none) 16 at a time, the last masked.
__attribute__((target("avx512f"))) void PvAvx512(const float* p, const float* v, int64_t B,
                                                 int64_t len, int64_t d, float* acc) {
  const int64_t cfull = d / 64 * 64;
  for (int64_t c0 = 0; c0 < cfull; c0 += 64) {
    int64_t i = 0;
    for (; i + 4 <= B; i += 4) {
      __m512 a[4][4];
      #pragma GCC unroll 16
      for (int r = 0; r < 4; ++r) {
        #pragma GCC unroll 16
        for (int m = 0; m < 4; ++m) a[r][m] = _mm512_loadu_ps(acc + (i + r) * d + c0 + 16 * m);
      }
      for (int64_t k = 0; k < len; ++k) {
        __m512 vv[4];
        #pragma GCC unroll 16
        for (int m = 0; m < 4; ++m) vv[m] = _mm512_loadu_ps(v + k * d + c0 + 16 * m);
        #pragma GCC unroll 16
        for (int r = 0; r < 4; ++r) {
          const __m512 pb = _mm512_set1_ps(p[(i + r) * len + k]);
          #pragma GCC unroll 16
          for (int m = 0; m < 4; ++m) a[r][m] = _mm512_fmadd_ps(pb, vv[m], a[r][m]);
        }
      }
      #pragma GCC unroll 16
      for (int r = 0; r < 4; ++r) {
        #pragma GCC unroll 16
        for (int m = 0; m < 4; ++m) _mm512_storeu_ps(acc + (i + r) * d + c0 + 16 * m, a[r][m]);
      }
    }
    for (; i < B; ++i) {
      #pragma GCC unroll 16
      for (int m = 0; m < 4; ++m) {
        __m512 a = _mm512_loadu_ps(acc + i * d + c0 + 16 * m);
        for (int64_t k = 0; k < len; ++k) {
          a = _mm512_fmadd_ps(_mm512_set1_ps(p[i * len + k]),
                              _mm512_loadu_ps(v + k * d + c0 + 16 * m), a);
        }
        _mm512_storeu_ps(acc + i * d + c0 + 16 * m, a);
      }
    }
  }
  // 16 columns at a time, the last ones masked.
  for (int64_t c0 = cfull; c0 < d; c0 += 16) {
    const int64_t left = d - c0;
    const __mmask16 mask = left >= 16 ? static_cast<__mmask16>(0xFFFF)
                                      : static_cast<__mmask16>((1u << left) - 1u);
    for (int64_t i = 0; i < B; ++i) {
      __m512 a = _mm512_maskz_loadu_ps(mask, acc + i * d + c0);
      for (int64_t k = 0; k < len; ++k) {
        a = _mm512_fmadd_ps(_mm512_set1_ps(p[i * len + k]),
                            _mm512_maskz_loadu_ps(mask, v + k * d + c0), a);
      }
      _mm512_mask_storeu_ps(acc + i * d + c0, mask, a);
    }
  }
}

// AVX2: 4 queries × 16 keys (8 ymm accumulators); 4 queries × 32 columns for P·V.
__attribute__((target("avx2,fma"))) void ScoresAvx2(const float* q, const float* kt, int64_t B,
                                                    int64_t len, int64_t d, float* s) {
  const int64_t kfull = len / 16 * 16;
  for (int64_t k0 = 0; k0 < kfull; k0 += 16) {
    int64_t i = 0;
    for (; i + 4 <= B; i += 4) {
      __m256 a[4][2];
      #pragma GCC unroll 16
      for (int r = 0; r < 4; ++r) a[r][0] = a[r][1] = _mm256_setzero_ps();
      for (int64_t j = 0; j < d; ++j) {
        const __m256 k0v = _mm256_loadu_ps(kt + j * len + k0);
        const __m256 k1v = _mm256_loadu_ps(kt + j * len + k0 + 8);
        #pragma GCC unroll 16
        for (int r = 0; r < 4; ++r) {
          const __m256 qb = _mm256_set1_ps(q[(i + r) * d + j]);
          a[r][0] = _mm256_fmadd_ps(qb, k0v, a[r][0]);
          a[r][1] = _mm256_fmadd_ps(qb, k1v, a[r][1]);
        }
      }
      #pragma GCC unroll 16
      for (int r = 0; r < 4; ++r) {
        _mm256_storeu_ps(s + (i + r) * len + k0, a[r][0]);
        _mm256_storeu_ps(s + (i + r) * len + k0 + 8, a[r][1]);
      }
    }
    for (; i < B; ++i) {
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
      for (int64_t j = 0; j < d; ++j) {
        const __m256 qb = _mm256_set1_ps(q[i * d + j]);
        a0 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(kt + j * len + k0), a0);
        a1 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(kt + j * len + k0 + 8), a1);
      }
      _mm256_storeu_ps(s + i * len + k0, a0);
      _mm256_storeu_ps(s + i * len + k0 + 8, a1);
    }
  }
  if (kfull < len) ScoresPortable(q, kt, B, len, d, s, kfull);
}

__attribute__((target("avx2,fma"))) void PvAvx2(const float* p, const float* v, int64_t B,
                                                int64_t len, int64_t d, float* acc) {
  int64_t c0 = 0;
  for (; c0 + 32 <= d; c0 += 32) {
    int64_t i = 0;
    for (; i + 3 <= B; i += 3) {  // 3 × 4 ymm accumulators + 4 operands of 16 registers
      __m256 a[3][4];
      #pragma GCC unroll 16
      for (int r = 0; r < 3; ++r) {
        #pragma GCC unroll 16
        for (int m = 0; m < 4; ++m) a[r][m] = _mm256_loadu_ps(acc + (i + r) * d + c0 + 8 * m);
      }
      for (int64_t k = 0; k < len; ++k) {
        __m256 vv[4];
        #pragma GCC unroll 16
        for (int m = 0; m < 4; ++m) vv[m] = _mm256_loadu_ps(v + k * d + c0 + 8 * m);
        #pragma GCC unroll 16
        for (int r = 0; r < 3; ++r) {
          const __m256 pb = _mm256_set1_ps(p[(i + r) * len + k]);
          #pragma GCC unroll 16
          for (int m = 0; m < 4; ++m) a[r][m] = _mm256_fmadd_ps(pb, vv[m], a[r][m]);
        }
      }
      #pragma GCC unroll 16
      for (int r = 0; r < 3; ++r) {
        #pragma GCC unroll 16
        for (int m = 0; m < 4; ++m) _mm256_storeu_ps(acc + (i + r) * d + c0 + 8 * m, a[r][m]);
      }
    }
    for (; i < B; ++i) {
      #pragma GCC unroll 16
      for (int m = 0; m < 4; ++m) {
        __m256 a = _mm256_loadu_ps(acc + i * d + c0 + 8 * m);
        for (int64_t k = 0; k < len; ++k) {
          a = _mm256_fmadd_ps(_mm256_set1_ps(p[i * len + k]),
                              _mm256_loadu_ps(v + k * d + c0 + 8 * m), a);
        }
        _mm256_storeu_ps(acc + i * d + c0 + 8 * m, a);
      }
    }
  }
  if (c0 < d) PvPortable(p, v, B, len, d, acc, c0);
}

void Scores(const float* q, const float* kt, int64_t B, int64_t len, int64_t d, float* s) {
  switch (kernels::ActiveIsa()) {
    case kernels::Isa::kAvx512:
      return ScoresAvx512(q, kt, B, len, d, s);
    case kernels::Isa::kAvx2:
      return ScoresAvx2(q, kt, B, len, d, s);
    case kernels::Isa::kScalar:
      break;
  }
  ScoresPortable(q, kt, B, len, d, s, 0);
}

void Pv(const float* p, const float* v, int64_t B, int64_t len, int64_t d, float* acc) {
  switch (kernels::ActiveIsa()) {
    case kernels::Isa::kAvx512:
      return PvAvx512(p, v, B, len, d, acc);
    case kernels::Isa::kAvx2:
      return PvAvx2(p, v, B, len, d, acc);
    case kernels::Isa::kScalar:
      break;
  }
  PvPortable(p, v, B, len, d, acc, 0);
}

// ---- the online softmax --------------------------------------------------------------------

// One key tile's online-softmax step for B rows (vision_attention.h): s [B][len] scores in,
// probabilities out; m, l updated; acc [B][d] set to 0 (first tile) or scaled by α. Element-wise
// IEEE operations only (ops::Exp is branch-free float code), so the three compilations below give
// the same bits: a target attribute only lets GCC use wider vectors for the same per-element
// sequence, as math.h explains for auto-vectorisation (-ffp-contract=off: nothing is fused).
// The tile sum Σ p_k is 8 double partial sums (key index mod 8) combined as a_k += a_{k+4},
// then +2, then +1: a fixed order. The path follows kernels::ActiveIsa(), so SetIsa in the
// tests switches it along with MatMul's.
[[gnu::always_inline]] inline void SoftmaxTileBody(float* s_all, int64_t B, int64_t len,
                                                   int64_t d, float scale, bool first, float* m,
                                                   double* l, float* acc_all) {
  for (int64_t i = 0; i < B; ++i) {
    float* s = s_all + i * len;
    for (int64_t j = 0; j < len; ++j) s[j] = s[j] * scale;
    // The maximum in 16 columns (vectorisable); a maximum does not depend on the order.
    float mx[16];
    for (int k = 0; k < 16; ++k) mx[k] = -std::numeric_limits<float>::infinity();
    int64_t j0 = 0;
    for (; j0 + 16 <= len; j0 += 16) {
      for (int k = 0; k < 16; ++k) mx[k] = s[j0 + k] > mx[k] ? s[j0 + k] : mx[k];
    }
    for (; j0 < len; ++j0) mx[0] = s[j0] > mx[0] ? s[j0] : mx[0];
    float mt = mx[0];
    for (int k = 1; k < 16; ++k) mt = mx[k] > mt ? mx[k] : mt;
    const float m_new = first ? mt : (m[i] > mt ? m[i] : mt);
    const float alpha = first ? 0.0f : ops::Exp(m[i] - m_new);
    for (int64_t j = 0; j < len; ++j) s[j] = ops::Exp(s[j] - m_new);
    double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t j = 0;
    for (; j + 8 <= len; j += 8) {
      for (int k = 0; k < 8; ++k) part[k] += static_cast<double>(s[j + k]);
    }
    for (; j < len; ++j) part[j % 8] += static_cast<double>(s[j]);
    for (int k = 0; k < 4; ++k) part[k] += part[k + 4];
    for (int k = 0; k < 2; ++k) part[k] += part[k + 2];
    const double sum = part[0] + part[1];
    l[i] = first ? sum : l[i] * static_cast<double>(alpha) + sum;
    m[i] = m_new;
    float* acc = acc_all + i * d;
    if (first) {
      for (int64_t c = 0; c < d; ++c) acc[c] = 0.0f;
    } else {
      for (int64_t c = 0; c < d; ++c) acc[c] = acc[c] * alpha;
    }
  }
}

__attribute__((target("avx512f"))) void SoftmaxTileAvx512(float* s, int64_t B, int64_t len,
                                                           int64_t d, float scale, bool first,
                                                           float* m, double* l, float* acc) {
  SoftmaxTileBody(s, B, len, d, scale, first, m, l, acc);
}
__attribute__((target("avx2"))) void SoftmaxTileAvx2(float* s, int64_t B, int64_t len, int64_t d,
                                                     float scale, bool first, float* m, double* l,
                                                     float* acc) {
  SoftmaxTileBody(s, B, len, d, scale, first, m, l, acc);
}
void SoftmaxTilePortable(float* s, int64_t B, int64_t len, int64_t d, float scale, bool first,
                         float* m, double* l, float* acc) {
  SoftmaxTileBody(s, B, len, d, scale, first, m, l, acc);
}
void SoftmaxTile(float* s, int64_t B, int64_t len, int64_t d, float scale, bool first, float* m,
                 double* l, float* acc) {
  switch (kernels::ActiveIsa()) {
    case kernels::Isa::kAvx512:
      return SoftmaxTileAvx512(s, B, len, d, scale, first, m, l, acc);
    case kernels::Isa::kAvx2:
      return SoftmaxTileAvx2(s, B, len, d, scale, first, m, l, acc);
    case kernels::Isa::kScalar:
      break;
  }
  SoftmaxTilePortable(s, B, len, d, scale, first, m, l, acc);
}

// ---- one work item -------------------------------------------------------------------------

// A thread's working memory: scores/probabilities [B][kKeyTile], the accumulator [B][d], and per
// row m (fp32) and l (double).
struct Slot {
  float* s;
  float* acc;
  float* m;
  double* l;
};

Slot CarveSlot(float* base, int64_t d) {
  Slot s;
  s.s = base;
  s.acc = s.s + kQueryBlock * kKeyTile;
  s.m = s.acc + kQueryBlock * d;
  s.l = reinterpret_cast<double*>(s.m + kQueryBlock);  // kQueryBlock is even: 8-byte aligned
  return s;
}

// Queries [q0, q0 + B) of one head against every key; o_row(i) is where query q0 + i's output
// goes (its head's columns of the attention output).
void AttendBlock(const VisionDims& dims, int64_t n, int64_t q0, int64_t B, const float* q,
                 const float* kt, const float* v, float* o, int64_t o_stride, const Slot& sl) {
  const int64_t d = dims.head_dim;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  const float* qblk = q + q0 * d;
  const int64_t tiles = (n + kKeyTile - 1) / kKeyTile;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t len = std::min<int64_t>(kKeyTile, n - t * kKeyTile);
    Scores(qblk, kt + t * kKeyTile * d, B, len, d, sl.s);
    SoftmaxTile(sl.s, B, len, d, scale, t == 0, sl.m, sl.l, sl.acc);
    Pv(sl.s, v + t * kKeyTile * d, B, len, d, sl.acc);
  }
  for (int64_t i = 0; i < B; ++i) {
    float* out = o + (q0 + i) * o_stride;
    const float* acc = sl.acc + i * d;
    const double l = sl.l[i];
    for (int64_t j = 0; j < d; ++j) out[j] = static_cast<float>(static_cast<double>(acc[j]) / l);
  }
}

}  // namespace

int64_t AttentionSlotFloats(const VisionDims& dims) {
  const int64_t d = dims.head_dim;
  // s, acc, m, l (double = 2 floats), rounded up to 16 floats (64 bytes).
  const int64_t f = kQueryBlock * (d + kKeyTile + 1 + 2);
  return (f + 15) / 16 * 16;
}

void AttendHead(const VisionDims& dims, int64_t n, const float* q, const float* kt,
                const float* v, float* o, int64_t o_stride, float* slots, int threads) {
  const int64_t blocks = (n + kQueryBlock - 1) / kQueryBlock;
  const int64_t slot_floats = AttentionSlotFloats(dims);
  const int nthreads = std::max(1, threads);
  // At most `threads` items run at once (ParallelChunks), so a free slot always exists.
  std::unique_ptr<std::atomic<bool>[]> busy(new std::atomic<bool>[static_cast<size_t>(nthreads)]);
  for (int i = 0; i < nthreads; ++i) busy[static_cast<size_t>(i)].store(false);
  kernels::ParallelChunks(nthreads, blocks, [&](int64_t b) {
    int slot = 0;
    for (;; slot = (slot + 1) % nthreads) {
      bool expected = false;
      if (busy[static_cast<size_t>(slot)].compare_exchange_strong(expected, true)) break;
    }
    const int64_t q0 = b * kQueryBlock;
    const int64_t B = std::min<int64_t>(kQueryBlock, n - q0);
    AttendBlock(dims, n, q0, B, q, kt, v, o, o_stride,
                CarveSlot(slots + slot * slot_floats, dims.head_dim));
    busy[static_cast<size_t>(slot)].store(false);
  });
}

}  // namespace k3::vision::internal
