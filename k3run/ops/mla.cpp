// Gated MLA, step by step as MODEL.md §3.5 (step numbers in the comments).
#include "k3run/ops/mla.h"

#include <cmath>
#include <string>
#include <vector>

#include "k3run/ops/math.h"
#include "k3run/ops/norm.h"

namespace k3::ops {

MlaCache MlaCache::Make(const Dims& d, int64_t capacity) {
  MlaCache c;
  c.capacity = capacity;
  c.heads = d.n_heads;
  c.kv_head = d.kv_head();
  c.rope = d.qk_rope;
  c.kv.assign(static_cast<size_t>(capacity * c.heads * c.kv_head), 0.0f);
  c.rope_k.assign(static_cast<size_t>(capacity * c.rope), 0.0f);
  return c;
}

Status MlaLayer(const MlaWeights& w, const Dims& d, const float* x, int64_t T, MlaCache* cache,
                float* out) {
  if (T <= 0) return Status::Ok();
  if (cache->len + T > cache->capacity) {
    return Status::Invalid("MLA KV cache full: " + std::to_string(cache->len) +
                           " positions cached + " + std::to_string(T) + " new > capacity " +
                           std::to_string(cache->capacity) +
                           "; size the cache for prompt + generated tokens before starting");
  }
  const int64_t Hm = d.n_heads, nope = d.qk_nope, rope = d.qk_rope, vh = d.v_head;
  const int64_t qh = d.qk_head(), kvd = d.kv_head(), qlr = d.q_lora, kvl = d.kv_lora;
  auto buf = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n)); };

  // 1. query: q_a → RMSNorm (latent eps) → q_b, [T][Hm][qh] (nope ‖ rope per head)
  std::vector<float> qa = buf(T * qlr), q = buf(T * Hm * qh);
  kernels::MatMul(w.q_a_proj, x, T, qa.data());
  for (int64_t t = 0; t < T; ++t) {
    float* r = qa.data() + t * qlr;
    RmsNorm(r, w.q_a_layernorm.data(), qlr, d.mla_latent_eps, r);
  }
  kernels::MatMul(w.q_b_proj, qa.data(), T, q.data());

  // 2. compressed kv: latent (normalised) ‖ shared rope key (NOT normalised, NOT rotated)
  const int64_t ca = kvl + rope;
  std::vector<float> c = buf(T * ca), latent = buf(T * kvl);
  kernels::MatMul(w.kv_a_proj_with_mqa, x, T, c.data());
  for (int64_t t = 0; t < T; ++t) {
    RmsNorm(c.data() + t * ca, w.kv_a_layernorm.data(), kvl, d.mla_latent_eps,
            latent.data() + t * kvl);
  }
  // 3.+4. expand per head and append to the cache at positions len … len+T−1
  const int64_t p0 = cache->len;
  kernels::MatMul(w.kv_b_proj, latent.data(), T, cache->kv.data() + p0 * Hm * kvd);
  for (int64_t t = 0; t < T; ++t) {
    const float* kr = c.data() + t * ca + kvl;
    float* dst = cache->rope_k.data() + (p0 + t) * rope;
    for (int64_t i = 0; i < rope; ++i) dst[i] = kr[i];
  }
  cache->len = p0 + T;

  // 5.+6. causal attention per token and head
  const float scale = 1.0f / std::sqrt(static_cast<float>(qh));  // the FULL qk width
  std::vector<float> o = buf(T * Hm * vh), score = buf(p0 + T);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n = p0 + t + 1;  // s ≤ p
    for (int64_t h = 0; h < Hm; ++h) {
      const float* qv = q.data() + (t * Hm + h) * qh;
      for (int64_t s = 0; s < n; ++s) {
        const float* kn = cache->kv_at(s, h);
        const float* kr = cache->rope_at(s);
        double acc = 0.0;
        for (int64_t i = 0; i < nope; ++i)
          acc += static_cast<double>(qv[i]) * static_cast<double>(kn[i]);
        for (int64_t i = 0; i < rope; ++i)
          acc += static_cast<double>(qv[nope + i]) * static_cast<double>(kr[i]);
        score[static_cast<size_t>(s)] = static_cast<float>(acc) * scale;
      }
      Softmax(score.data(), n, score.data());
      float* oh = o.data() + (t * Hm + h) * vh;
      for (int64_t j = 0; j < vh; ++j) oh[j] = 0.0f;
      for (int64_t s = 0; s < n; ++s) {
        const float p = score[static_cast<size_t>(s)];
        const float* vs = cache->kv_at(s, h) + nope;
        for (int64_t j = 0; j < vh; ++j) oh[j] += p * vs[j];
      }
    }
  }

  // 7. output gate σ(Wg x) BEFORE o_proj, no norm
  if (d.mla_out_gate) {
    std::vector<float> gate = buf(T * Hm * vh);
    kernels::MatMul(w.g_proj, x, T, gate.data());
    for (size_t i = 0; i < o.size(); ++i) o[i] = o[i] * Sigmoid(gate[i]);
  }
  // 8. output projection
  kernels::MatMul(w.o_proj, o.data(), T, out);
  return Status::Ok();
}

}  // namespace k3::ops
