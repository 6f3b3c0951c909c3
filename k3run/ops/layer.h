// One decoder layer (MODEL.md §3.3, upstream `_forward_attn_residual` statement for statement)
// and the model-level attention-residual aggregation of §3.8.
//
// The attention-residual snapshots ("blocks") live in a BlockStack, per token, for ONE forward
// call: it is never carried across calls (MODEL.md §7), unlike the KDA state and MLA cache.
// T rows in one call equal T one-row calls with carried KDA state / KV cache, bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "k3run/ops/kda.h"
#include "k3run/ops/mla.h"
#include "k3run/ops/moe.h"
#include "k3run/ops/weights.h"

namespace k3::ops {

struct BlockStack {
  int64_t T = 0, hidden = 0, capacity = 0;
  int64_t count = 0;         // snapshots pushed so far (same for every token)
  std::vector<float> data;   // [T][capacity][E], token-major, oldest snapshot first

  // capacity n_layers / attn_res_block + 1 holds every boundary of the model.
  static BlockStack Make(int64_t T, int64_t hidden, int64_t capacity);
  float* at(int64_t t, int64_t k) { return data.data() + (t * capacity + k) * hidden; }
  const float* at(int64_t t, int64_t k) const {
    return data.data() + (t * capacity + k) * hidden;
  }
};

// The carried per-layer state; exactly one of kda / mla is used, by weights.is_mla.
struct LayerState {
  KdaState* kda = nullptr;
  MlaCache* mla = nullptr;
};

// h [T][E]: in, the layer input (the previous layer's running prefix; the embedding at layer 0);
// out, this layer's output. `layer` is zero-based (boundary iff layer % attn_res_block == 0).
// Fails only on a full MLA cache or a full BlockStack (nothing is changed then).
Status DecoderLayer(int64_t layer, const LayerWeights& w, const ExpertLookup& experts,
                    const Dims& d, float* h, int64_t T, BlockStack* blocks, LayerState state,
                    MoeStats* stats, const ExpertWaves* waves = nullptr);

// After the last layer: h ← AttnRes([all snapshots…, h], fold = norm ⊙ proj). h [T][E] in/out.
void FinalAttnRes(const BlockStack& blocks, const float* norm, const float* proj, float eps,
                  float* h, int64_t T);

}  // namespace k3::ops
