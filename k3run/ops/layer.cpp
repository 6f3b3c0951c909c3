// The decoder layer, step by step as MODEL.md §3.3 (step numbers in the comments).
#include "k3run/ops/layer.h"

#include <algorithm>
#include <string>
#include <vector>

#include "k3run/kernels/thread_pool.h"
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

// y_t = RMSNorm(x_t, w) for T rows of E; rows are independent, so they run on the compute threads.
void RmsNormRows(const float* x, const Vec& w, int64_t E, float eps, int64_t T, float* y) {
  kernels::ParallelChunks(kernels::Threads(), T, [&](int64_t t) {
    RmsNorm(x + t * E, w.data(), E, eps, y + t * E);
  });
}

// h_t ← AttnRes([blocks_t…, prefix_t]) for every token; rows are independent, so they run on
// the compute threads in units of kAggregateRows (each row computed by one thread, the same way
// on any; AttnResRows overlaps the unit's sums).
constexpr int64_t kAggregateRows = 4;

void Aggregate(const BlockStack& blocks, const float* prefix, const Vec& norm, const Vec& proj,
               float eps, int64_t E, int64_t T, float* h) {
  std::vector<float> fold(static_cast<size_t>(E));
  FoldAttnRes(norm.data(), proj.data(), E, fold.data());
  const int64_t m = blocks.count + 1;
  const int64_t units = (T + kAggregateRows - 1) / kAggregateRows;
  kernels::ParallelChunks(kernels::Threads(), units, [&](int64_t u) {
    const int64_t t0 = u * kAggregateRows;
    const int64_t R = T - t0 < kAggregateRows ? T - t0 : kAggregateRows;
    std::vector<const float*> s(static_cast<size_t>(R * m));
    float* out[kAggregateRows];
    for (int64_t r = 0; r < R; ++r) {
      const int64_t t = t0 + r;
      for (int64_t k = 0; k < blocks.count; ++k) s[static_cast<size_t>(r * m + k)] = blocks.at(t, k);
      s[static_cast<size_t>(r * m + blocks.count)] = prefix + t * E;
      out[r] = h + t * E;
    }
    AttnResRows(s.data(), R, m, fold.data(), E, eps, out);
  });
}

}  // namespace

Status CheckSnapshotRoom(int64_t layer, const Dims& d, const BlockStack& blocks) {
  if (layer % d.attn_res_block == 0 && blocks.count >= blocks.capacity) {
    return Status::Invalid("layer " + std::to_string(layer) +
                           ": attention-residual snapshot stack full (capacity " +
                           std::to_string(blocks.capacity) +
                           "); size it n_layers / attn_res_block_size + 1");
  }
  return Status::Ok();
}

Status CheckLayerState(int64_t layer, const LayerWeights& w, int64_t n, LayerState state) {
  if (w.is_mla ? state.mla == nullptr : state.kda == nullptr) {
    return Status::Invalid("layer " + std::to_string(layer) + ": no " +
                           (w.is_mla ? "MLA KV cache" : "KDA state") +
                           " given for this layer (internal: the model must pass one per layer)");
  }
  if (w.is_mla && state.mla->len + n > state.mla->capacity) {
    return Status::Invalid("layer " + std::to_string(layer) + ": MLA KV cache full: " +
                           std::to_string(state.mla->len) + " + " + std::to_string(n) +
                           " > capacity " + std::to_string(state.mla->capacity) +
                           "; size the cache for prompt + generated tokens before starting");
  }
  return Status::Ok();
}

Status BeginLayer(int64_t layer, const LayerWeights& w, const Dims& d, float* h, int64_t T,
                  BlockStack* blocks, LayerScratch* s) {
  const int64_t E = d.hidden;
  const bool boundary = layer % d.attn_res_block == 0;
  K3_RETURN_IF_ERROR(CheckSnapshotRoom(layer, d, *blocks));
  const size_t n = static_cast<size_t>(T * E);
  // 1. prefix ← h
  s->prefix.assign(h, h + n);
  s->prefix_none = false;
  // 2. pre-attention aggregation over the blocks as they were before this layer's push
  if (blocks->count > 0) {
    Aggregate(*blocks, s->prefix.data(), w.self_attention_res_norm, w.self_attention_res_proj,
              d.rms_eps, E, T, h);
  }
  // 3. boundary: push the un-aggregated layer input, prefix ← NONE
  if (boundary) {
    for (int64_t t = 0; t < T; ++t)
      std::copy_n(s->prefix.data() + t * E, E, blocks->at(t, blocks->count));
    blocks->count += 1;
    s->prefix_none = true;
  }
  // 4. a_in = RMSNorm(h, input_layernorm)
  s->a.resize(n);
  s->out.resize(n);
  RmsNormRows(h, w.input_layernorm, E, d.rms_eps, T, s->a.data());
  return Status::Ok();
}

Status BeginAttention(const LayerWeights& w, const Dims& d, int64_t T, LayerScratch* s) {
  // 5. attention: the projections, every weight read once for all T rows
  if (w.is_mla) return MlaProject(w.mla, d, s->a.data(), T, &s->mla);
  KdaProject(w.kda, d, s->a.data(), T, &s->kda);
  return Status::Ok();
}

Status LayerAttention(int64_t layer, const LayerWeights& w, const Dims& d, int64_t first,
                      int64_t n, LayerState state, LayerScratch* s) {
  K3_RETURN_IF_ERROR(CheckLayerState(layer, w, n, state));
  if (w.is_mla) return MlaAttend(w.mla, d, first, n, state.mla, &s->mla);
  KdaAttend(w.kda, d, first, n, state.kda, &s->kda, state.records);
  return Status::Ok();
}

Status LayerAttentionAll(int64_t layer, const LayerWeights& w, const Dims& d,
                         std::span<const AttentionSegment> segments, LayerScratch* s) {
  for (const AttentionSegment& g : segments) {
    K3_RETURN_IF_ERROR(CheckLayerState(layer, w, g.n, g.state));
  }
  if (w.is_mla) {
    std::vector<MlaSegment> mla;
    for (const AttentionSegment& g : segments) mla.push_back({g.first, g.n, g.state.mla});
    return MlaAttendMany(w.mla, d, mla, &s->mla);
  }
  std::vector<KdaSegment> kda;
  for (const AttentionSegment& g : segments) {
    kda.push_back({g.first, g.n, g.state.kda, g.state.records});
  }
  KdaAttendMany(w.kda, d, kda, &s->kda);
  return Status::Ok();
}

void EndAttention(const LayerWeights& w, const Dims& d, LayerScratch* s) {
  if (w.is_mla) {
    MlaOutput(w.mla, d, s->a.data(), s->mla, s->out.data());
  } else {
    KdaOutput(w.kda, s->kda, s->out.data());
  }
}

void MlpInput(const LayerWeights& w, const Dims& d, const BlockStack& blocks, float* h,
              int64_t T, LayerScratch* s) {
  const int64_t E = d.hidden;
  // 6. prefix ← att, or prefix + att (element-wise; rows on the compute threads, as below)
  float* prefix = s->prefix.data();
  const float* att = s->out.data();
  const bool none = s->prefix_none;
  kernels::ParallelChunks(kernels::Threads(), T, [&](int64_t t) {
    for (int64_t i = t * E; i < (t + 1) * E; ++i) prefix[i] = none ? att[i] : prefix[i] + att[i];
  });
  // 7. pre-MLP aggregation, unconditional
  Aggregate(blocks, s->prefix.data(), w.mlp_res_norm, w.mlp_res_proj, d.rms_eps, E, T, h);
  // 8. m_in = RMSNorm(h, post_attention_layernorm)
  RmsNormRows(h, w.post_attention_layernorm, E, d.rms_eps, T, s->a.data());
}

void EndLayer(const Dims& d, int64_t T, const LayerScratch& s, float* h) {
  // 10. output = prefix + mlp
  const int64_t E = d.hidden;
  kernels::ParallelChunks(kernels::Threads(), T, [&](int64_t t) {
    for (int64_t i = t * E; i < (t + 1) * E; ++i) h[i] = s.prefix[static_cast<size_t>(i)] + s.out[static_cast<size_t>(i)];
  });
}

Status DecoderLayer(int64_t layer, const LayerWeights& w, ExpertTable experts, const Dims& d,
                    float* h, int64_t T, BlockStack* blocks, LayerState state, MoeStats* stats) {
  if (T <= 0) return Status::Ok();
  // Every check before any phase changes the blocks or the state, as one call promises.
  K3_RETURN_IF_ERROR(CheckSnapshotRoom(layer, d, *blocks));
  K3_RETURN_IF_ERROR(CheckLayerState(layer, w, T, state));
  LayerScratch s;
  K3_RETURN_IF_ERROR(BeginLayer(layer, w, d, h, T, blocks, &s));
  K3_RETURN_IF_ERROR(BeginAttention(w, d, T, &s));
  K3_RETURN_IF_ERROR(LayerAttention(layer, w, d, 0, T, state, &s));
  EndAttention(w, d, &s);
  MlpInput(w, d, *blocks, h, T, &s);
  // 9. MLP
  if (w.is_dense) {
    GluMlp(w.dense, d.situ_b1, d.situ_b2, s.a.data(), T, s.out.data());
  } else {
    MoeBlock(w.moe, experts, d, s.a.data(), T, s.out.data(), stats);
  }
  EndLayer(d, T, s, h);
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
