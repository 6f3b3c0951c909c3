// The forward pass in data-flow order (MODEL.md §3). Shapes: E hidden, V vocab, T rows.
#include "k3run/engine/model.h"

#include <algorithm>
#include <vector>

#include "k3run/kernels/matmul.h"
#include "k3run/ops/layer.h"
#include "k3run/ops/norm.h"
#include "k3run/ops/router.h"

namespace k3::run {

State State::Make(const ModelConfig& c, int layers, int64_t capacity) {
  const ops::Dims d = DimsFromConfig(c);
  State s;
  s.kda.resize(static_cast<size_t>(c.n_layers));
  s.mla.resize(static_cast<size_t>(c.n_layers));
  for (int L = 0; L < layers; ++L) {
    if (c.is_mla(L)) {
      s.mla[static_cast<size_t>(L)] = ops::MlaCache::Make(d, capacity);
    } else {
      s.kda[static_cast<size_t>(L)] = ops::KdaState::Zero(d);
    }
  }
  return s;
}

void State::Reset() {
  for (ops::KdaState& k : kda) k.Reset();
  for (ops::MlaCache& m : mla) m.len = 0;  // rows past len are never read
  pos = 0;
}

Model::Model(const ModelConfig& c, WeightSource* weights, int layers)
    : config_(c), dims_(DimsFromConfig(c)), weights_(weights), layers_(layers) {}

Status Model::Forward(const int32_t* ids, int64_t T, State* state, bool all_rows,
                      float* logits) {
  if (T <= 0) return Status::Invalid("Forward: no tokens to feed");
  const int64_t E = dims_.hidden;
  // h [T][E]: the embedding rows (bf16 widened, no scaling; §3.2).
  std::vector<float> h(static_cast<size_t>(T * E));
  K3_RETURN_IF_ERROR(weights_->EmbeddingRows(ids, T, h.data()));
  // Attention-residual snapshots of this call only (never carried across calls, §7).
  ops::BlockStack blocks =
      ops::BlockStack::Make(T, E, config_.n_layers / config_.attn_res_block + 1);
  // Decoder layers (§3.3–3.7).
  for (int L = 0; L < layers_; ++L) {
    K3_ASSIGN_OR_RETURN(const ops::LayerWeights* w, weights_->Layer(L));
    const ops::ExpertLookup experts = [this, L](int64_t e) {
      return weights_->Expert(L, static_cast<int>(e));
    };
    ops::LayerState ls;
    if (w->is_mla) {
      ls.mla = &state->mla[static_cast<size_t>(L)];
    } else {
      ls.kda = &state->kda[static_cast<size_t>(L)];
    }
    // Each wave's reads are issued as soon as routing is known; its slots are released after
    // the wave's expert work (the source bounds the wave size by its cache).
    ops::ExpertWaves waves;
    waves.max_experts = weights_->ExpertWaveSize();
    waves.begin = [this, L](std::span<const int32_t> wave) { weights_->WillUse(L, wave); };
    waves.end = [this, L] { weights_->ReleaseExperts(L); };
    waves.ready = [this, L](int64_t e) { return weights_->ExpertReady(L, static_cast<int>(e)); };
    waves.routed = [this, L](const float* pre_norm, int64_t rows) {
      GuessNextExperts(L, pre_norm, rows);
    };
    Status s =
        ops::DecoderLayer(L, *w, experts, dims_, h.data(), T, &blocks, ls, &stats_, &waves);
    weights_->ReleaseExperts(L);
    weights_->ReleaseLayer(L);
    K3_RETURN_IF_ERROR(s);
  }
  state->pos += T;
  // Head (§3.8): AttnRes over [snapshots…, h], final RMSNorm, lm_head.
  K3_ASSIGN_OR_RETURN(const HeadWeights* head, weights_->Head());
  ops::FinalAttnRes(blocks, head->output_attn_res_norm.data(), head->output_attn_res_proj.data(),
                    dims_.rms_eps, h.data(), T);
  const int64_t first = all_rows ? 0 : T - 1;
  const int64_t rows = T - first;
  std::vector<float> x(static_cast<size_t>(rows * E));
  for (int64_t r = 0; r < rows; ++r) {
    ops::RmsNorm(h.data() + (first + r) * E, head->norm.data(), E, dims_.rms_eps,
                 x.data() + r * E);
  }
  return Head(x.data(), rows, logits);
}

// While layer L's experts load, the most likely experts of L+1 (ops::GuessExperts on L's pre-norm
// MLP input h; bench preset: 85 % of a top-8 guess is picked, docs/STREAMING.md) go to the
// source, which reads them behind L's batch (or during the dense FFN when L is dense) while L
// finishes and L+1's attention computes. A guess only: what is read never changes a bit.
void Model::GuessNextExperts(int L, const float* h, int64_t T) {
  const int next = L + 1;
  if (next >= layers_) return;
  const int64_t budget = weights_->PrefetchBudget(next);
  if (budget <= 0) return;
  const ops::LayerWeights* w = weights_->HeldLayer(next);
  if (w == nullptr) return;
  weights_->Prefetch(next, ops::GuessExperts(*w, dims_, h, T, budget));
}

// logits [rows][V] = lm_head · x, chunk by chunk as the source serves it.
Status Model::Head(const float* x, int64_t rows, float* logits) {
  const int64_t V = config_.vocab;
  const int64_t chunk = std::max<int64_t>(1, weights_->LmHeadChunkRows());
  std::vector<float> part;
  for (int64_t begin = 0; begin < V; begin += chunk) {
    const int64_t n = std::min(chunk, V - begin);
    Result<kernels::Matrix> chunk_or = weights_->LmHeadRows(begin, n);
    if (!chunk_or.ok()) {
      weights_->LmHeadDone();
      return chunk_or.status();
    }
    const kernels::Matrix& m = *chunk_or;
    if (n == V) {
      kernels::MatMul(m, x, rows, logits);
      continue;
    }
    part.resize(static_cast<size_t>(rows * n));
    kernels::MatMul(m, x, rows, part.data());
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(part.data() + r * n, n, logits + r * V + begin);
    }
  }
  weights_->LmHeadDone();
  return Status::Ok();
}

}  // namespace k3::run
