// Gated MLA in absorbed form, step by step as the order written in mla.h (step numbers below).
#include "k3run/ops/mla.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "k3run/kernels/thread_pool.h"
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

// Step 2's W_UK[h]ᵀ for every head, [H][c][n], in kv_b_proj's own dtype: a transposition copies
// element values, so the MatMul below sees exactly the weights of kv_b_proj.
struct AbsorbedKeys {
  std::vector<uint8_t> bytes;
  kernels::Matrix Head(const kernels::Matrix& kvb, int64_t h, int64_t c, int64_t n) const {
    const size_t elem = kvb.type == kernels::WeightType::kF32 ? 4 : 2;
    return kernels::Matrix{kvb.type, c, n, bytes.data() + static_cast<size_t>(h * c * n) * elem,
                           nullptr};
  }
};

AbsorbedKeys TransposeKeys(const kernels::Matrix& kvb, const Dims& d) {
  const int64_t H = d.n_heads, n = d.qk_nope, c = d.kv_lora, stride = d.kv_head();
  const size_t elem = kvb.type == kernels::WeightType::kF32 ? 4 : 2;
  AbsorbedKeys k;
  k.bytes.resize(static_cast<size_t>(H * c * n) * elem);
  const auto* src = static_cast<const uint8_t*>(kvb.data);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* row = src + static_cast<size_t>((h * stride + i) * c) * elem;
      uint8_t* dst = k.bytes.data() + static_cast<size_t>(h * c * n + i) * elem;
      for (int64_t j = 0; j < c; ++j) {
        std::memcpy(dst + static_cast<size_t>(j * n) * elem, row + static_cast<size_t>(j) * elem,
                    elem);
      }
    }
  }
  return k;
}

// Steps 3–5 for head h and rows [0, T): ō[h][t] from q̃[h][t], the rope query and the cache.
// `score` holds len + T floats and belongs to the calling thread.
void AttendHead(const Dims& d, int64_t h, int64_t T, int64_t p0, const float* q,
                const float* qt, const MlaCache& cache, float scale, float* score, float* obar) {
  const int64_t H = d.n_heads, n = d.qk_nope, r = d.qk_rope, qh = d.qk_head(), c = d.kv_lora;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t len = p0 + t + 1;  // causal: s ≤ the row's position
    const float* qa = qt + (h * T + t) * c;             // q̃_h, [c]
    const float* qr = q + (t * H + h) * qh + n;          // the rope query, [r]
    for (int64_t s = 0; s < len; ++s) {
      const float* lat = cache.row(s);
      double acc = 0.0;
      for (int64_t j = 0; j < c; ++j) acc += double(qa[j]) * double(lat[j]);
      for (int64_t i = 0; i < r; ++i) acc += double(qr[i]) * double(lat[c + i]);
      score[s] = static_cast<float>(acc) * scale;
    }
    Softmax(score, len, score);
    float* o = obar + (h * T + t) * c;
    for (int64_t j = 0; j < c; ++j) o[j] = 0.0f;
    for (int64_t s = 0; s < len; ++s) {
      const float p = score[s];
      const float* lat = cache.row(s);
      for (int64_t j = 0; j < c; ++j) o[j] += p * lat[j];
    }
  }
}

// Step 1: q [T][H][n + r], and the new rows of the cache at positions len … len + T − 1.
void ProjectAndAppend(const MlaWeights& w, const Dims& d, const float* x, int64_t T,
                      MlaCache* cache, std::vector<float>* q) {
  const int64_t qlr = d.q_lora, c = d.kv_lora, r = d.qk_rope, width = c + r;
  std::vector<float> qa = Buf(T * qlr);
  kernels::MatMul(w.q_a_proj, x, T, qa.data());
  for (int64_t t = 0; t < T; ++t) {
    float* row = qa.data() + t * qlr;
    RmsNorm(row, w.q_a_layernorm.data(), qlr, d.mla_latent_eps, row);
  }
  *q = Buf(T * d.n_heads * d.qk_head());
  kernels::MatMul(w.q_b_proj, qa.data(), T, q->data());
  std::vector<float> ckv = Buf(T * width);
  kernels::MatMul(w.kv_a_proj_with_mqa, x, T, ckv.data());
  for (int64_t t = 0; t < T; ++t) {
    const float* src = ckv.data() + t * width;
    float* dst = cache->row(cache->len + t);
    RmsNorm(src, w.kv_a_layernorm.data(), c, d.mla_latent_eps, dst);
    for (int64_t i = 0; i < r; ++i) dst[c + i] = src[c + i];
  }
  cache->len += T;
}

}  // namespace

MlaCache MlaCache::Make(const Dims& d, int64_t capacity) {
  MlaCache c;
  c.capacity = capacity;
  c.latent = d.kv_lora;
  c.width = MlaCacheWidth(d);
  c.data.assign(static_cast<size_t>(capacity * c.width), 0.0f);
  return c;
}

Status MlaLayer(const MlaWeights& w, const Dims& d, const float* x, int64_t T, MlaCache* cache,
                float* out) {
  if (T <= 0) return Status::Ok();
  if (cache->len + T > cache->capacity) {
    return Status::Invalid("MLA latent cache full: " + std::to_string(cache->len) +
                           " positions cached + " + std::to_string(T) + " new > capacity " +
                           std::to_string(cache->capacity) +
                           "; reserve more positions (--ctx) or start a new sequence");
  }
  if (w.kv_b_proj.type == kernels::WeightType::kMXFP4) {
    return Status::Invalid("MLA kv_b_proj is MXFP4; the absorbed form needs F32 or BF16");
  }
  const int64_t H = d.n_heads, n = d.qk_nope, c = d.kv_lora, v = d.v_head, qh = d.qk_head();
  const int64_t p0 = cache->len;
  std::vector<float> q;
  ProjectAndAppend(w, d, x, T, cache, &q);  // 1.

  // 2. q̃[h][t] = W_UK[h]·q_nope[t][h]
  const AbsorbedKeys keys = TransposeKeys(w.kv_b_proj, d);
  std::vector<float> qt = Buf(H * T * c), rows = Buf(T * n);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t t = 0; t < T; ++t) {
      std::memcpy(rows.data() + t * n, q.data() + (t * H + h) * qh, size_t(n) * 4);
    }
    kernels::MatMul(keys.Head(w.kv_b_proj, h, c, n), rows.data(), T, qt.data() + h * T * c);
  }

  // 3.–5. heads claimed one at a time by the compute threads, one score buffer per thread
  const float scale = 1.0f / std::sqrt(static_cast<float>(qh));
  const int threads = std::max(1, std::min<int>(kernels::Threads(), static_cast<int>(H)));
  std::vector<float> score = Buf(threads * (p0 + T)), obar = Buf(H * T * c);
  std::atomic<int64_t> next_head{0};
  kernels::ParallelChunks(threads, threads, [&](int64_t chunk) {
    float* mine = score.data() + chunk * (p0 + T);
    for (int64_t h = next_head++; h < H; h = next_head++) {
      AttendHead(d, h, T, p0, q.data(), qt.data(), *cache, scale, mine, obar.data());
    }
  });

  // 6. o[t][h] = W_UV[h]·ō[h][t]
  std::vector<float> o = Buf(T * H * v), oh = Buf(T * v);
  for (int64_t h = 0; h < H; ++h) {
    kernels::MatMul(RowSlice(w.kv_b_proj, h * (n + v) + n, v), obar.data() + h * T * c, T,
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
  return Status::Ok();
}

}  // namespace k3::ops
