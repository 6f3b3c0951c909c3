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

// Rows [row0, row0 + rows) of `w` as a matrix of their own (F32 or BF16: plain row-major).
kernels::Matrix RowSlice(const kernels::Matrix& w, int64_t row0, int64_t rows) {
  kernels::Matrix m = w;
  m.rows = rows;
  const size_t elem = w.type == kernels::WeightType::kF32 ? 4 : 2;
  m.data = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(row0 * w.cols) * elem;
  return m;
}

// ō += p · row, element by element in fp32 (a product, then a sum); restrict lets the compiler
// vectorise over j, which changes no element's operations.
void AddScaledRow(float p, const float* __restrict row, int64_t c, float* __restrict o) {
  for (int64_t j = 0; j < c; ++j) o[j] += p * row[j];
}

// Steps 3–5 for head h and the n rows from `first` of a pass of T rows (one sequence's, the
// first at position p0): ō[h][t] from q̃[h][t], the rope query and the cache.
// The scores are the router kernel's double sums (kernels/router_dot.h: one double accumulator
// per cached position, terms in ascending index) of the query [q̃_h ‖ q_rope] against each cache
// row [latent ‖ k_rope]: latent terms, then rope terms, as step 3 says. `query` (c + r floats),
// `acc` (len + n doubles) and `score` (len + n floats) belong to the calling thread.
void AttendHead(const Dims& d, int64_t h, int64_t T, int64_t first, int64_t n, int64_t p0,
                const float* q, const float* qt, const MlaCache& cache, float scale,
                float* query, double* acc, float* score, float* obar) {
  const int64_t H = d.n_heads, nope = d.qk_nope, r = d.qk_rope, qh = d.qk_head(), c = d.kv_lora;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = first + i, len = p0 + i + 1;  // causal: s ≤ the row's position
    std::memcpy(query, qt + (h * T + t) * c, size_t(c) * 4);             // q̃_h
    std::memcpy(query + c, q + (t * H + h) * qh + nope, size_t(r) * 4);  // the rope query
    const kernels::Matrix keys{kernels::WeightType::kF32, len, c + r, cache.data.data(), nullptr};
    kernels::RouterLogitsOnThisThread(keys, query, acc);
    for (int64_t s = 0; s < len; ++s) score[s] = static_cast<float>(acc[s]) * scale;
    Softmax(score, len, score);
    float* o = obar + (h * T + t) * c;
    for (int64_t j = 0; j < c; ++j) o[j] = 0.0f;
    for (int64_t s = 0; s < len; ++s) AddScaledRow(score[s], cache.row(s), c, o);
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

  // 3.–5. (sequence, head) pairs claimed one at a time by the compute threads, one score
  // buffer per thread sized for the longest sequence: one fork/join for every sequence of the
  // pass (a decode pass of 16 sequences forked 16 times per layer before).
  const int64_t pairs = static_cast<int64_t>(segments.size()) * H;
  const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(kernels::Threads(), pairs)));
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.qk_head()));
  const int64_t width = MlaCacheWidth(d);
  std::vector<float> score = Buf(threads * (longest + width));
  std::vector<double> acc(static_cast<size_t>(threads * longest));
  std::atomic<int64_t> next_pair{0};
  kernels::ParallelChunks(threads, threads, [&](int64_t chunk) {
    float* mine = score.data() + chunk * (longest + width);
    double* sums = acc.data() + chunk * longest;
    for (int64_t pair = next_pair++; pair < pairs; pair = next_pair++) {
      const size_t i = static_cast<size_t>(pair / H);
      const MlaSegment& g = segments[i];
      if (g.n <= 0) continue;
      const int64_t len = p0[i] + g.n;
      AttendHead(d, pair % H, T, g.first, g.n, p0[i], r->q.data(), r->qt.data(), *g.cache,
                 scale, mine + len, sums, mine, r->obar.data());
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
