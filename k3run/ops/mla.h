// Gated MLA attention over a KV cache (MODEL.md §3.5; NoPE, no rotary embedding anywhere).
//
// Precision: scores accumulate in ONE double (nope terms, then rope terms), rounded to fp32, then
// multiplied by fp32 scale = 1/sqrtf(qk_nope + qk_rope); softmax with fp32 max, fp32 expf, a
// double sum and p = fp32(e/Z); o = Σ_s p_s·v_s in fp32, s ascending. The latent norms use
// Dims::mla_latent_eps (1e-6 upstream; 1e-5 reproduces the original engine's fixtures).
// State: MlaCache holds, per position, the EXPANDED k_nope ‖ v of every head and the one shared,
// un-normalised, un-rotated rope key (MODEL.md §7). T rows in one call equal T one-row calls.
// Thread safety: none; one cache per sequence and layer.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "k3run/ops/weights.h"

namespace k3::ops {

struct MlaCache {
  int64_t capacity = 0;  // positions the buffers hold
  int64_t len = 0;       // positions written (the next token's position)
  int64_t heads = 0, kv_head = 0, rope = 0;
  std::vector<float> kv;    // [capacity][Hm][qk_nope + v_head]
  std::vector<float> rope_k;  // [capacity][qk_rope]

  static MlaCache Make(const Dims& d, int64_t capacity);
  const float* kv_at(int64_t pos, int64_t head) const {
    return kv.data() + (pos * heads + head) * kv_head;
  }
  const float* rope_at(int64_t pos) const { return rope_k.data() + pos * rope; }
};

// x [T][E] (the input-layernormed rows), out [T][E]; positions cache->len … len+T−1.
// Fails (kInvalid, cache untouched) if the cache cannot hold T more positions.
Status MlaLayer(const MlaWeights& w, const Dims& d, const float* x, int64_t T, MlaCache* cache,
                float* out);

// The softmax recipe shared by MLA and AttnRes: m = fp32 max, e = expf(score − m) (fp32),
// Z = Σ e in double (ascending), p = fp32(e/Z). p may alias score.
void Softmax(const float* score, int64_t n, float* p);

}  // namespace k3::ops
