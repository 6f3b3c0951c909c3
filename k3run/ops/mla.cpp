// Gated MLA in absorbed form, step by step as the order written in mla.h (step numbers below).
#include "k3run/ops/mla.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <span>
#include <vector>

#include "k3run/kernels/router_dot.h"
#include "k3run/kernels/thread_pool.h"
#include "k3run/kernels/transposed.h"
#include "k3run/ops/math.h"
#include "k3run/ops/norm.h"

namespace k3::ops {

namespace {

std::vector<float> Buf(int64_t n) { return std::vector<float>(static_cast<size_t>(n)); }

template <typename V>
void Grow(std::vector<V>* v, int64_t n) {
  if (v->size() < static_cast<size_t>(n)) v->resize(static_cast<size_t>(n));
}

// Rows [row0, row0 + rows) of `w` as a matrix of their own (F32 or BF16: plain row-major).
kernels::Matrix RowSlice(const kernels::Matrix& w, int64_t row0, int64_t rows) {
  kernels::Matrix m = w;
  m.rows = rows;
  const size_t elem = w.type == kernels::WeightType::kF32 ? 4 : 2;
  m.data = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(row0 * w.cols) * elem;
  return m;
}

// Sixteen fp32 lanes (GCC vector extension): +, * act element by element with one IEEE rounding
// each, in any target's registers (zmm in the AVX-512 copy below, halves or quarters in the
// others). Moved with memcpy (any alignment); never passed by value (that ABI differs by target).
typedef float Lanes16 __attribute__((vector_size(64)));

// o[jn floats] += Σ_s p[s]·row_s for two heads' scores pa, pb over the positions [s0, s1) of
// rows `width` floats apart from `rows`: each element a product, then a sum, s ascending.
// jn = 64 keeps 8 accumulators in registers; jn = 16 two; the columns past those, one by one.
template <int kVectors>
[[gnu::always_inline]] inline void HeadPairColumns(const float* pa, const float* pb,
                                                  int64_t s0, int64_t s1, const float* rows,
                                                  int64_t width, float* oa, float* ob) {
  Lanes16 a[kVectors], b[kVectors];
  for (int v = 0; v < kVectors; ++v) {
    std::memcpy(&a[v], oa + 16 * v, sizeof(Lanes16));
    std::memcpy(&b[v], ob + 16 * v, sizeof(Lanes16));
  }
  for (int64_t s = s0; s < s1; ++s) {
    const float* row = rows + s * width;
    const float wa = pa[s], wb = pb[s];
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) {
      Lanes16 x;
      std::memcpy(&x, row + 16 * v, sizeof x);
      a[v] = a[v] + wa * x;
      b[v] = b[v] + wb * x;
    }
  }
  for (int v = 0; v < kVectors; ++v) {
    std::memcpy(oa + 16 * v, &a[v], sizeof(Lanes16));
    std::memcpy(ob + 16 * v, &b[v], sizeof(Lanes16));
  }
}

// Every head pair of the group over the columns [j, j + 16·kVectors) of positions [s0, s1).
// (Helpers of WeightedLatents are always inlined, never lambdas or calls: only its own body is
// compiled in each target's copy.)
template <int kVectors>
[[gnu::always_inline]] inline void HeadPairs(const float* p, int64_t stride, int64_t nh,
                                            int64_t s0, int64_t s1, const float* rows,
                                            int64_t width, float* const* o, int64_t j) {
  for (int64_t i = 0; i < nh; i += 2) {
    const int64_t k = i + 1 < nh ? i + 1 : i;
    HeadPairColumns<kVectors>(p + i * stride, p + k * stride, s0, s1, rows, width, o[i] + j,
                              o[k] + j);
  }
}

// Step 5 for a group of nh heads: o[i][j] += p_i[s]·latent_s[j] for s ascending in [0, len), with
// p_i = p + i·stride and latent_s the first c of the `width` floats of cache row s; o[i] starts at
// zero. Each element is one accumulator, a product then a sum per position, s ascending, whatever
// the blocking: positions in blocks of 64 (their 64-column slices stay in L1 while every head
// pair reads them), columns 64 at a time, heads two at a time (an odd last head pairs with
// itself, its sums computed twice and stored twice, identically). Compiled in AVX-512, AVX2 and
// baseline copies (math.h): the same IEEE operations per element in each, so the same bits.
// Before (a row at a time, the 4-lane baseline copy alone, o loaded and stored for every
// position): about 100 ms a layer at 32,768 positions of the released dims on two threads.
K3_ELEMENTWISE_CLONES void WeightedLatents(const float* p, int64_t stride, int64_t len,
                                           int64_t nh, const float* cache, int64_t width,
                                           int64_t c, float* const* o) {
  constexpr int64_t kPositions = 64;
  for (int64_t i = 0; i < nh; ++i) std::memset(o[i], 0, size_t(c) * sizeof(float));
  for (int64_t s0 = 0; s0 < len; s0 += kPositions) {
    const int64_t s1 = len - s0 < kPositions ? len : s0 + kPositions;
    int64_t j = 0;
    for (; j + 64 <= c; j += 64) HeadPairs<4>(p, stride, nh, s0, s1, cache + j, width, o, j);
    for (; j + 16 <= c; j += 16) HeadPairs<1>(p, stride, nh, s0, s1, cache + j, width, o, j);
    for (; j < c; ++j) {
      for (int64_t i = 0; i < nh; ++i) {
        for (int64_t s = s0; s < s1; ++s) {
          o[i][j] = o[i][j] + p[i * stride + s] * cache[s * width + j];
        }
      }
    }
  }
}

// A sequence's consecutive rows of a pass, attended together (AttendBlock).
struct Block {
  int64_t t0, nr, len0;  // rows t0 … t0 + nr − 1 of the pass, the first at cache length len0
  const MlaCache* cache;
};

// Steps 3–5 for the nr rows t0 … t0 + nr − 1 of a pass (consecutive positions of one sequence,
// the first at cache length len0, i.e. position len0 − 1) and the heads [h0, h0 + nh): ō[h][t]
// from q̃[h][t], the rope query and the cache. The block's queries [q̃_h ‖ q_rope] share every
// read of the cache: they go to the router kernel together (kernels/router_dot.h: per (query,
// position) one double accumulator, terms in ascending index, the same bits as one query at a
// time) over the positions the last row sees; each row keeps the scores of its own positions
// (causal) and discards the rest. Step 5 walks the positions once per row, adding each latent
// row into every head's ō. Each ō element still sums its positions in ascending order with a
// product, then a sum, so the blocks (their rows, their heads) never change a bit. Before, each
// head read the whole cache on its own: 96 times per row at the released dims. `query`
// (nr·nh·(c + r) floats), `acc` (nr·nh·kMlaKeyBlock doubles) and `score` (nr·nh·(len0 + nr − 1)
// floats) belong to the calling thread.
void AttendBlock(const Dims& d, const Block& b, int64_t h0, int64_t nh, int64_t T,
                 const float* q, const float* qt, float scale, float* query, double* acc,
                 float* score, float* obar) {
  const int64_t H = d.n_heads, nope = d.qk_nope, r = d.qk_rope, qh = d.qk_head(), c = d.kv_lora;
  const int64_t len = b.len0 + b.nr - 1, n = b.nr * nh;  // positions the last row sees; queries
  for (int64_t k = 0; k < b.nr; ++k) {
    const int64_t t = b.t0 + k;
    for (int64_t i = 0; i < nh; ++i) {
      float* x = query + (k * nh + i) * (c + r);
      std::memcpy(x, qt + ((h0 + i) * T + t) * c, size_t(c) * 4);             // q̃_h
      std::memcpy(x + c, q + (t * H + h0 + i) * qh + nope, size_t(r) * 4);  // the rope query
    }
  }
  // The keys kMlaKeyBlock positions at a time, every query's sums for a block before the next:
  // the block stays in L2 while the queries read it, also on the router bodies that take one
  // query after another (AVX2, scalar). score [n][len] = fp32(sum) · scale, as step 3 says;
  // the positions a row does not see are scored too, and never read.
  for (int64_t s0 = 0; s0 < len; s0 += kMlaKeyBlock) {
    const int64_t m = len - s0 < kMlaKeyBlock ? len - s0 : kMlaKeyBlock;
    const kernels::Matrix keys{kernels::WeightType::kF32, m, c + r, b.cache->row(s0), nullptr};
    kernels::RouterLogitsOnThisThread(keys, query, n, acc);  // acc [n][m]
    for (int64_t x = 0; x < n; ++x) {
      for (int64_t s = 0; s < m; ++s) {
        score[x * len + s0 + s] = static_cast<float>(acc[x * m + s]) * scale;
      }
    }
  }
  float* o[kMlaUnitQueries];
  for (int64_t k = 0; k < b.nr; ++k) {
    const int64_t seen = b.len0 + k;  // causal: positions 0 … len0 − 1 + k
    float* sk = score + k * nh * len;
    for (int64_t i = 0; i < nh; ++i) {
      Softmax(sk + i * len, seen, sk + i * len);
      o[i] = obar + ((h0 + i) * T + b.t0 + k) * c;
    }
    WeightedLatents(sk, len, seen, nh, b.cache->data.data(), b.cache->width, c, o);
  }
}

Status CheckRoom(const MlaCache& cache, int64_t n) {
  if (cache.len + n <= cache.capacity) return Status::Ok();
  return Status::Invalid("MLA latent cache full: " + std::to_string(cache.len) +
                         " positions cached + " + std::to_string(n) + " new > capacity " +
                         std::to_string(cache.capacity) +
                         "; reserve more positions (--ctx) or start a new sequence");
}

}  // namespace

MlaCache MlaCache::Make(const Dims& d, int64_t capacity) {
  MlaCache c;
  c.capacity = capacity;
  c.latent = d.kv_lora;
  c.width = MlaCacheWidth(d);
  c.data = ReservedFloats(static_cast<size_t>(capacity * c.width));
  return c;
}

Status MlaProject(const MlaWeights& w, const Dims& d, const float* x, int64_t T, MlaRows* r) {
  if (w.kv_b_proj.type == kernels::WeightType::kMXFP4) {
    return Status::Invalid("MLA kv_b_proj is MXFP4; the absorbed form needs F32 or BF16");
  }
  const int64_t H = d.n_heads, n = d.qk_nope, c = d.kv_lora, v = d.v_head, qh = d.qk_head();
  const int64_t qlr = d.q_lora;
  r->T = T;
  // 1. q = q_b(RMSNorm(q_a(x))); c_kv = kv_a(x) (normalised when it joins the cache)
  std::vector<float> qa = Buf(T * qlr);
  kernels::MatMul(w.q_a_proj, x, T, qa.data());
  for (int64_t t = 0; t < T; ++t) {
    float* row = qa.data() + t * qlr;
    RmsNorm(row, w.q_a_layernorm.data(), qlr, d.mla_latent_eps, row);
  }
  r->q.resize(static_cast<size_t>(T * H * qh));
  kernels::MatMul(w.q_b_proj, qa.data(), T, r->q.data());
  r->ckv.resize(static_cast<size_t>(T * MlaCacheWidth(d)));
  kernels::MatMul(w.kv_a_proj_with_mqa, x, T, r->ckv.data());

  // 2. q̃[h][t] = W_UK[h]ᵀ·q_nope[t][h], reading kv_b_proj's rows h·(n+v) + [0, n) by columns
  // (kernels/transposed.h: the bits of MatMul over the transpose, with no copy of it); one
  // head per chunk, so each q̃ element is computed by one thread.
  const int threads = std::max(1, std::min<int>(kernels::Threads(), static_cast<int>(H)));
  r->qt.resize(static_cast<size_t>(H * T * c));
  r->obar.resize(static_cast<size_t>(H * T * c));
  kernels::ParallelChunks(threads, H, [&](int64_t h) {
    kernels::MatMulTransposedOnThisThread(RowSlice(w.kv_b_proj, h * (n + v), n),
                                          r->q.data() + h * qh, H * qh, T,
                                          r->qt.data() + h * T * c);
  });
  return Status::Ok();
}

Status MlaAttend(const MlaWeights& w, const Dims& d, int64_t first, int64_t n, MlaCache* cache,
                 MlaRows* r) {
  const MlaSegment one{first, n, cache};
  return MlaAttendMany(w, d, std::span<const MlaSegment>(&one, 1), r);
}

Status MlaAttendMany(const MlaWeights& w, const Dims& d, std::span<const MlaSegment> segments,
                     MlaRows* r) {
  for (const MlaSegment& g : segments) K3_RETURN_IF_ERROR(CheckRoom(*g.cache, g.n));
  const int64_t H = d.n_heads, c = d.kv_lora, rope = d.qk_rope, T = r->T;
  int64_t longest = 0;  // positions, after this pass, of the longest sequence
  std::vector<int64_t> p0(segments.size());
  for (size_t i = 0; i < segments.size(); ++i) {
    const MlaSegment& g = segments[i];
    MlaCache* cache = g.cache;
    const int64_t width = cache->width;
    p0[i] = cache->len;
    // The rows' latents (normalised) and rope keys (as they are) at positions p0 … p0 + n − 1.
    for (int64_t j = 0; j < g.n; ++j) {
      const float* src = r->ckv.data() + (g.first + j) * width;
      float* dst = cache->row(p0[i] + j);
      RmsNorm(src, w.kv_a_layernorm.data(), c, d.mla_latent_eps, dst);
      for (int64_t e = 0; e < rope; ++e) dst[c + e] = src[c + e];
    }
    cache->len += g.n;
    if (g.n > 0) longest = std::max(longest, cache->len);
  }
  if (longest == 0) return Status::Ok();

  // 3.–5. Units of (block of a sequence's consecutive rows, group of heads), claimed one at a
  // time by the compute threads: one fork/join for every sequence of the pass. A unit has at
  // most kMlaUnitQueries queries (rows × heads): groups of up to that many heads, one row a block
  // when the heads fill it, else as many rows as fit (prefill); fewer heads a group when a pass
  // has too few blocks to give every thread a unit (a one-row decode pass). Each thread's
  // scratch is one unit's, sized for the longest sequence.
  const int64_t threads_wanted = std::max(1, kernels::Threads());
  const int64_t heads_max = std::min(H, kMlaUnitQueries);
  const int64_t rows_per_block = std::max<int64_t>(1, kMlaUnitQueries / heads_max);
  std::vector<Block> blocks;
  for (size_t i = 0; i < segments.size(); ++i) {
    const MlaSegment& g = segments[i];
    for (int64_t j = 0; j < g.n; j += rows_per_block) {
      const int64_t nr = std::min(rows_per_block, g.n - j);
      blocks.push_back(Block{g.first + j, nr, p0[i] + j + 1, g.cache});
    }
  }
  const auto nb = static_cast<int64_t>(blocks.size());
  const int64_t wanted_groups =
      std::min(H, std::max((H + heads_max - 1) / heads_max, (threads_wanted + nb - 1) / nb));
  const int64_t per_group = (H + wanted_groups - 1) / wanted_groups;
  const int64_t groups = (H + per_group - 1) / per_group;  // every group has a head
  const int64_t units = nb * groups, most = rows_per_block * per_group;  // queries of a unit
  const int threads = static_cast<int>(std::min(threads_wanted, units));
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.qk_head()));
  const int64_t width = MlaCacheWidth(d);
  // Kept by the calling thread and grown, never cleared: every element is written before it is
  // read (queries copied, sums stored, scores from the sums). A fresh buffer per layer (12.6 MB
  // at 32,768 positions of the released dims on two threads) cost its page faults and zeroing
  // on every call.
  thread_local std::vector<float> query, score;
  thread_local std::vector<double> acc;
  Grow(&query, threads * most * width);
  Grow(&score, threads * most * longest);
  Grow(&acc, threads * most * kMlaKeyBlock);
  // The lambda below runs on other threads too: it must see this thread's buffers, by pointer.
  float* const queries = query.data();
  float* const scores = score.data();
  double* const sums = acc.data();
  std::atomic<int64_t> next_unit{0};
  kernels::ParallelChunks(threads, threads, [&](int64_t chunk) {
    for (int64_t unit = next_unit++; unit < units; unit = next_unit++) {
      const int64_t h0 = unit % groups * per_group;
      AttendBlock(d, blocks[static_cast<size_t>(unit / groups)], h0, std::min(per_group, H - h0),
                  T, r->q.data(), r->qt.data(), scale, queries + chunk * most * width,
                  sums + chunk * most * kMlaKeyBlock, scores + chunk * most * longest,
                  r->obar.data());
    }
  });
  return Status::Ok();
}

void MlaOutput(const MlaWeights& w, const Dims& d, const float* x, const MlaRows& r, float* out) {
  const int64_t H = d.n_heads, n = d.qk_nope, c = d.kv_lora, v = d.v_head, T = r.T;
  // 6. o[t][h] = W_UV[h]·ō[h][t]
  std::vector<float> o = Buf(T * H * v), oh = Buf(T * v);
  for (int64_t h = 0; h < H; ++h) {
    kernels::MatMul(RowSlice(w.kv_b_proj, h * (n + v) + n, v), r.obar.data() + h * T * c, T,
                    oh.data());
    for (int64_t t = 0; t < T; ++t) {
      std::memcpy(o.data() + (t * H + h) * v, oh.data() + t * v, size_t(v) * 4);
    }
  }
  // 7. output gate σ(Wg x) BEFORE o_proj, no norm; then the output projection
  if (d.mla_out_gate) {
    std::vector<float> gate = Buf(T * H * v);
    kernels::MatMul(w.g_proj, x, T, gate.data());
    for (size_t i = 0; i < o.size(); ++i) o[i] = o[i] * Sigmoid(gate[i]);
  }
  kernels::MatMul(w.o_proj, o.data(), T, out);
}

Status MlaLayer(const MlaWeights& w, const Dims& d, const float* x, int64_t T, MlaCache* cache,
                float* out) {
  if (T <= 0) return Status::Ok();
  K3_RETURN_IF_ERROR(CheckRoom(*cache, T));  // before any work
  MlaRows r;
  K3_RETURN_IF_ERROR(MlaProject(w, d, x, T, &r));
  K3_RETURN_IF_ERROR(MlaAttend(w, d, 0, T, cache, &r));
  MlaOutput(w, d, x, r, out);
  return Status::Ok();
}

}  // namespace k3::ops
