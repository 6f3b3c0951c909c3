// One decoder layer (MODEL.md §3.3, upstream `_forward_attn_residual` statement for statement)
// and the model-level attention-residual aggregation of §3.8.
//
// The attention-residual snapshots ("blocks") live in a BlockStack, per token, for ONE forward
// call: it is never carried across calls (MODEL.md §7), unlike the KDA state and MLA cache.
// T rows in one call equal T one-row calls with carried KDA state / KV cache, bit for bit.
#pragma once

#include <cstdint>
#include <span>
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
  KdaRecords* records = nullptr;  // KDA rows that may be discarded: recorded, kda untouched
};

// A decoder layer in phases, so that a caller can run the attention of several sequences (each
// with its own state) and everything else over all their rows in one pass, every weight read
// once for all of them:
//   BeginLayer (steps 1–4, every row) → BeginAttention (step 5's projections, every row) →
//   LayerAttention (step 5's recurrence or cache, per sequence: rows [first, first + n) with
//   that sequence's state) → EndAttention (step 5's output projection, every row) → MlpInput
//   (steps 6–8, every row) → the MLP on LayerScratch::a into LayerScratch::out (dense GluMlp,
//   or the MoE operators of moe.h) → EndLayer (step 10). Every phase but LayerAttention works
//   row by row, so how rows are grouped never changes a bit.
struct LayerScratch {
  std::vector<float> prefix;  // [T][E] the running prefix (step 1, 6)
  std::vector<float> a;       // [T][E] attention input (step 4), then MLP input (step 8)
  std::vector<float> out;     // [T][E] attention output (step 5), then MLP output
  bool prefix_none = false;   // a boundary layer restarted the prefix (step 3)
  KdaRows kda;                // step 5 between its phases, in a KDA layer
  MlaRows mla;                // step 5 between its phases, in an MLA layer
};

// kInvalid when a boundary layer would push onto a full snapshot stack.
Status CheckSnapshotRoom(int64_t layer, const Dims& d, const BlockStack& blocks);
// kInvalid when the layer's state is missing or n more rows do not fit its MLA cache.
Status CheckLayerState(int64_t layer, const LayerWeights& w, int64_t n, LayerState state);

// h [T][E]: in, the layer input (the previous layer's running prefix; the embedding at layer 0).
// `layer` is zero-based (boundary iff layer % attn_res_block == 0). Fails only on a full
// BlockStack (nothing is changed then).
Status BeginLayer(int64_t layer, const LayerWeights& w, const Dims& d, float* h, int64_t T,
                  BlockStack* blocks, LayerScratch* s);
// Step 5's projections of every row (s->a) into s->kda or s->mla. Fails only on an MLA
// kv_b_proj the absorbed form cannot read (MXFP4).
Status BeginAttention(const LayerWeights& w, const Dims& d, int64_t T, LayerScratch* s);
// Step 5 for one sequence's rows [first, first + n), after BeginAttention. Fails on a missing
// state or a full MLA cache (nothing is changed then).
Status LayerAttention(int64_t layer, const LayerWeights& w, const Dims& d, int64_t first,
                      int64_t n, LayerState state, LayerScratch* s);
// One sequence's rows [first, first + n) of a pass and its state, for LayerAttentionAll.
struct AttentionSegment {
  int64_t first = 0, n = 0;
  LayerState state;
};
// LayerAttention for every sequence of a pass (disjoint rows), with one fork/join for all of
// them where one call per sequence forks once each: the same bits. Every segment is checked
// before any state changes.
Status LayerAttentionAll(int64_t layer, const LayerWeights& w, const Dims& d,
                         std::span<const AttentionSegment> segments, LayerScratch* s);
// Step 5's output projection of every row into s->out, after every sequence's LayerAttention.
void EndAttention(const LayerWeights& w, const Dims& d, LayerScratch* s);
// h ← the MLP input before its norm (what the next layer's expert guess reads); s->a ← its norm.
void MlpInput(const LayerWeights& w, const Dims& d, const BlockStack& blocks, float* h,
              int64_t T, LayerScratch* s);
// h ← prefix + s->out.
void EndLayer(const Dims& d, int64_t T, const LayerScratch& s, float* h);

// The phases for one sequence with every expert at hand (MoeBlock): tests and fixtures.
Status DecoderLayer(int64_t layer, const LayerWeights& w, ExpertTable experts, const Dims& d,
                    float* h, int64_t T, BlockStack* blocks, LayerState state, MoeStats* stats);

// After the last layer: h ← AttnRes([all snapshots…, h], fold = norm ⊙ proj). h [T][E] in/out.
void FinalAttnRes(const BlockStack& blocks, const float* norm, const float* proj, float eps,
                  float* h, int64_t T);

}  // namespace k3::ops
