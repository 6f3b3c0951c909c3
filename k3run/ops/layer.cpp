// The decoder layer, step by step as MODEL.md §3.3 (step numbers in the comments).
#include "k3run/ops/layer.h"

#include <algorithm>
#include <string>
#include <vector>

#include "k3run/ops/attnres.h"
#include "k3run/ops/glu.h"
#include "k3run/ops/norm.h"

namespace k3::ops {

BlockStack BlockStack::Make(int64_t T, int64_t hidden, int64_t capacity) {
  BlockStack b;
  b.T = T;
  b.hidden = hidden;
  b.capacity = capacity;
  b.data.assign(static_cast<size_t>(T * capacity * hidden), 0.0f);
  return b;
}

namespace {

// h_t ← AttnRes([blocks_t…, prefix_t]) for every token.
void Aggregate(const BlockStack& blocks, const float* prefix, const Vec& norm, const Vec& proj,
               float eps, int64_t E, int64_t T, float* h) {
  std::vector<float> fold(static_cast<size_t>(E));
  FoldAttnRes(norm.data(), proj.data(), E, fold.data());
  std::vector<const float*> src(static_cast<size_t>(blocks.count + 1));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < blocks.count; ++k) src[static_cast<size_t>(k)] = blocks.at(t, k);
    src[static_cast<size_t>(blocks.count)] = prefix + t * E;
    AttnRes(src.data(), blocks.count + 1, fold.data(), E, eps, h + t * E);
  }
}

}  // namespace

Status DecoderLayer(int64_t layer, const LayerWeights& w, const ExpertLookup& experts,
                    const Dims& d, float* h, int64_t T, BlockStack* blocks, LayerState state,
                    MoeStats* stats, const ExpertWaves* waves) {
  if (T <= 0) return Status::Ok();
  const int64_t E = d.hidden;
  const bool boundary = layer % d.attn_res_block == 0;
  if (boundary && blocks->count >= blocks->capacity) {
    return Status::Invalid("layer " + std::to_string(layer) +
                           ": attention-residual snapshot stack full (capacity " +
                           std::to_string(blocks->capacity) +
                           "); size it n_layers / attn_res_block_size + 1");
  }
  if (w.is_mla ? state.mla == nullptr : state.kda == nullptr) {
    return Status::Invalid("layer " + std::to_string(layer) + ": no " +
                           (w.is_mla ? "MLA KV cache" : "KDA state") +
                           " given for this layer (internal: the model must pass one per layer)");
  }
  if (w.is_mla && state.mla->len + T > state.mla->capacity) {
    return Status::Invalid("layer " + std::to_string(layer) + ": MLA KV cache full: " +
                           std::to_string(state.mla->len) + " + " + std::to_string(T) +
                           " > capacity " + std::to_string(state.mla->capacity) +
                           "; size the cache for prompt + generated tokens before starting");
  }
  const size_t n = static_cast<size_t>(T * E);
  // 1. prefix ← h
  std::vector<float> prefix(h, h + n);
  bool prefix_none = false;
  // 2. pre-attention aggregation over the blocks as they were before this layer's push
  if (blocks->count > 0) {
    Aggregate(*blocks, prefix.data(), w.self_attention_res_norm, w.self_attention_res_proj,
              d.rms_eps, E, T, h);
  }
  // 3. boundary: push the un-aggregated layer input, prefix ← NONE
  if (boundary) {
    for (int64_t t = 0; t < T; ++t)
      std::copy_n(prefix.data() + t * E, E, blocks->at(t, blocks->count));
    blocks->count += 1;
    prefix_none = true;
  }
  // 4. a_in = RMSNorm(h, input_layernorm)
  std::vector<float> a(n), att(n);
  for (int64_t t = 0; t < T; ++t)
    RmsNorm(h + t * E, w.input_layernorm.data(), E, d.rms_eps, a.data() + t * E);
  // 5. attention
  if (w.is_mla) {
    K3_RETURN_IF_ERROR(MlaLayer(w.mla, d, a.data(), T, state.mla, att.data()));
  } else {
    KdaLayer(w.kda, d, a.data(), T, state.kda, att.data());
  }
  // 6. prefix ← att, or prefix + att
  for (size_t i = 0; i < n; ++i) prefix[i] = prefix_none ? att[i] : prefix[i] + att[i];
  // 7. pre-MLP aggregation, unconditional
  Aggregate(*blocks, prefix.data(), w.mlp_res_norm, w.mlp_res_proj, d.rms_eps, E, T, h);
  // 8. m_in = RMSNorm(h, post_attention_layernorm)
  for (int64_t t = 0; t < T; ++t)
    RmsNorm(h + t * E, w.post_attention_layernorm.data(), E, d.rms_eps, a.data() + t * E);
  // 9. MLP
  if (w.is_dense) {
    // The next (MoE) layer's likely experts can load while the dense FFN computes.
    if (waves != nullptr && waves->routed) waves->routed(h, T);
    GluMlp(w.dense, d.situ_b1, d.situ_b2, a.data(), T, att.data());
  } else {
    MoeBlock(w.moe, experts, d, a.data(), T, att.data(), stats, waves, h);
  }
  // 10. output = prefix + mlp
  for (size_t i = 0; i < n; ++i) h[i] = prefix[i] + att[i];
  return Status::Ok();
}

void FinalAttnRes(const BlockStack& blocks, const float* norm, const float* proj, float eps,
                  float* h, int64_t T) {
  const int64_t E = blocks.hidden;
  std::vector<float> prefix(h, h + T * E);
  Aggregate(blocks, prefix.data(), Vec(norm, static_cast<size_t>(E)),
            Vec(proj, static_cast<size_t>(E)), eps, E, T, h);
}

}  // namespace k3::ops
