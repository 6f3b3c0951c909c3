// The wiring of one decoder layer (MODEL.md §3.3): which sources each aggregation sees, when the
// boundary push happens, what the running prefix is. The expected values are composed here from
// the individual operators, following the statements of §3.3, so equality is bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "k3run/ops/attnres.h"
#include "k3run/ops/glu.h"
#include "k3run/ops/layer.h"
#include "k3run/ops/moe.h"
#include "k3run/ops/norm.h"
#include "k3run/ops/router.h"
#include "random_model.h"

namespace k3::ops {
namespace {

using testing::RandomDims;
using testing::RandomModel;
using F = std::vector<float>;

F Agg(const std::vector<const F*>& src, const Vec& norm, const Vec& proj, const Dims& d) {
  F fold(static_cast<size_t>(d.hidden)), out(static_cast<size_t>(d.hidden));
  FoldAttnRes(norm.data(), proj.data(), d.hidden, fold.data());
  std::vector<const float*> p;
  for (const F* s : src) p.push_back(s->data());
  AttnRes(p.data(), static_cast<int64_t>(p.size()), fold.data(), d.hidden, d.rms_eps, out.data());
  return out;
}

F Norm(const F& x, const Vec& w, const Dims& d) {
  F y(x.size());
  RmsNorm(x.data(), w.data(), d.hidden, d.rms_eps, y.data());
  return y;
}

F Add(const F& a, const F& b) {
  F y(a.size());
  for (size_t i = 0; i < a.size(); ++i) y[i] = a[i] + b[i];
  return y;
}

F Kda(const LayerWeights& w, const Dims& d, const F& x) {
  KdaState st = KdaState::Zero(d);
  F y(x.size());
  KdaLayer(w.kda, d, x.data(), 1, &st, y.data());
  return y;
}

F Mlp(const LayerWeights& w, const RandomModel& m, const Dims& d, const F& x) {
  F y(x.size());
  if (w.is_dense) {
    GluMlp(w.dense, d.situ_b1, d.situ_b2, x.data(), 1, y.data());
  } else {
    MoeBlock(w.moe, m.Experts(), d, x.data(), 1, y.data(), nullptr);
  }
  return y;
}

struct LayerRun {
  F out;
  BlockStack blocks;
};

// DecoderLayer on one token with the given snapshots.
LayerRun RunLayer(int64_t layer, const LayerWeights& w, const RandomModel& m, const Dims& d,
             const F& h, const std::vector<F>& snaps) {
  LayerRun r{h, BlockStack::Make(1, d.hidden, 4)};
  for (const F& s : snaps) std::memcpy(r.blocks.at(0, r.blocks.count++), s.data(), s.size() * 4);
  KdaState st = KdaState::Zero(d);
  const Status s = DecoderLayer(layer, w, m.Experts(), d, r.out.data(), 1, &r.blocks, {&st, nullptr}, nullptr);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return r;
}

void ExpectSameBits(const F& got, const F& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << what;
}

TEST(DecoderLayer, LayerZeroWorkedExample) {
  // No pre-attention aggregation; push e; prefix = att0; pre-MLP sources [e, att0];
  // output att0 + mlp0 (the embedding is NOT in the running sum, only snapshot 0).
  const Dims d = RandomDims();
  RandomModel m(d);
  const LayerWeights w = m.Layer(false, true);
  const F e = m.Activations(d.hidden);
  const LayerRun r = RunLayer(0, w, m, d, e, {});
  const F att = Kda(w, d, Norm(e, w.input_layernorm, d));
  const F h2 = Agg({&e, &att}, w.mlp_res_norm, w.mlp_res_proj, d);
  ExpectSameBits(r.out, Add(att, Mlp(w, m, d, Norm(h2, w.post_attention_layernorm, d))), "out");
  ASSERT_EQ(r.blocks.count, 1);
  ExpectSameBits(F(r.blocks.at(0, 0), r.blocks.at(0, 0) + d.hidden), e, "snapshot 0 = e");
}

// The phases of a layer leave in h, after MlpInput, the MLP input before its norm (what the
// engine ranks the next layer's experts with, under that layer's own norm), and its norm in
// LayerScratch::a: in a dense layer as in a MoE layer, and the phases compose to DecoderLayer.
TEST(DecoderLayer, PhasesLeaveThePreNormMlpInputAndComposeToTheLayer) {
  const Dims d = RandomDims();
  RandomModel m(d);
  for (bool dense : {true, false}) {
    SCOPED_TRACE(dense ? "dense" : "moe");
    const LayerWeights w = m.Layer(false, dense);
    const F e = m.Activations(d.hidden);
    F h = e;
    BlockStack blocks = BlockStack::Make(1, d.hidden, 4);
    KdaState st = KdaState::Zero(d);
    LayerScratch s;
    ASSERT_TRUE(BeginLayer(0, w, d, h.data(), 1, &blocks, &s).ok());
    ASSERT_TRUE(BeginAttention(w, d, 1, &s).ok());
    ASSERT_TRUE(LayerAttention(0, w, d, 0, 1, {&st, nullptr}, &s).ok());
    EndAttention(w, d, &s);
    MlpInput(w, d, blocks, h.data(), 1, &s);
    const F att = Kda(w, d, Norm(e, w.input_layernorm, d));
    const F h2 = Agg({&e, &att}, w.mlp_res_norm, w.mlp_res_proj, d);
    ExpectSameBits(h, h2, "the pre-norm MLP input");
    ExpectSameBits(s.a, Norm(h2, w.post_attention_layernorm, d), "the MLP input");
    F whole = e;
    BlockStack blocks2 = BlockStack::Make(1, d.hidden, 4);
    KdaState st2 = KdaState::Zero(d);
    ASSERT_TRUE(
        DecoderLayer(0, w, m.Experts(), d, whole.data(), 1, &blocks2, {&st2, nullptr}, nullptr)
            .ok());
    ExpectSameBits(whole, Add(att, Mlp(w, m, d, Norm(h2, w.post_attention_layernorm, d))),
                   "DecoderLayer out");
  }
}

TEST(DecoderLayer, InsideABlockWithOneSnapshot) {
  // Layer 1 (block size 2: not a boundary), one snapshot b0: both aggregations see
  // [b0, running prefix]; the prefix is h + att; output prefix + mlp.
  const Dims d = RandomDims();
  RandomModel m(d);
  const LayerWeights w = m.Layer(false, false);
  const F h = m.Activations(d.hidden), b0 = m.Activations(d.hidden);
  const LayerRun r = RunLayer(1, w, m, d, h, {b0});
  const F h1 = Agg({&b0, &h}, w.self_attention_res_norm, w.self_attention_res_proj, d);
  const F prefix = Add(h, Kda(w, d, Norm(h1, w.input_layernorm, d)));
  const F h2 = Agg({&b0, &prefix}, w.mlp_res_norm, w.mlp_res_proj, d);
  ExpectSameBits(r.out, Add(prefix, Mlp(w, m, d, Norm(h2, w.post_attention_layernorm, d))), "out");
  EXPECT_EQ(r.blocks.count, 1);
}

TEST(DecoderLayer, BoundaryPushesTheLayerInputAndRestartsThePrefix) {
  // Layer 2 is a boundary: the pre-attention aggregation uses the stack BEFORE the push
  // ([b0, h]); then h is pushed, prefix = att alone, pre-MLP sources [b0, h, att].
  const Dims d = RandomDims();
  RandomModel m(d);
  const LayerWeights w = m.Layer(false, false);
  const F h = m.Activations(d.hidden), b0 = m.Activations(d.hidden);
  const LayerRun r = RunLayer(2, w, m, d, h, {b0});
  const F h1 = Agg({&b0, &h}, w.self_attention_res_norm, w.self_attention_res_proj, d);
  const F att = Kda(w, d, Norm(h1, w.input_layernorm, d));
  const F h2 = Agg({&b0, &h, &att}, w.mlp_res_norm, w.mlp_res_proj, d);
  ExpectSameBits(r.out, Add(att, Mlp(w, m, d, Norm(h2, w.post_attention_layernorm, d))), "out");
  ASSERT_EQ(r.blocks.count, 2);
  ExpectSameBits(F(r.blocks.at(0, 1), r.blocks.at(0, 1) + d.hidden), h, "snapshot 1 = h");
}

TEST(DecoderLayer, FinalAggregationOverAllSnapshotsThenH) {
  const Dims d = RandomDims();
  RandomModel m(d);
  const F h = m.Activations(d.hidden), b0 = m.Activations(d.hidden), b1 = m.Activations(d.hidden);
  const F norm = m.Activations(d.hidden), proj = m.Activations(d.hidden);
  BlockStack blocks = BlockStack::Make(1, d.hidden, 2);
  std::memcpy(blocks.at(0, 0), b0.data(), b0.size() * 4);
  std::memcpy(blocks.at(0, 1), b1.data(), b1.size() * 4);
  blocks.count = 2;
  F got = h;
  FinalAttnRes(blocks, norm.data(), proj.data(), d.rms_eps, got.data(), 1);
  ExpectSameBits(got, Agg({&b0, &b1, &h}, Vec(norm), Vec(proj), d), "final");
}

TEST(MoeBlock, ComposedStepByStepInTopKOrder) {
  // MODEL.md §3.6 steps 5–10 composed from the primitives, experts summed in top-k order
  // (descending selection score) into an fp32 accumulator starting at 0: bit for bit.
  const Dims d = RandomDims();
  RandomModel m(d, 21);
  const LayerWeights w = m.Layer(false, false);
  const F x = m.Activations(d.hidden, 2.0f);
  F got(x.size());
  MoeBlock(w.moe, m.Experts(), d, x.data(), 1, got.data(), nullptr);

  const Routing r = Route(w.moe, d, x.data(), 1);
  F z(static_cast<size_t>(d.latent)), acc(static_cast<size_t>(d.latent), 0.0f), y(acc.size());
  kernels::MatVec(w.moe.down, x.data(), z.data());
  for (int64_t j = 0; j < d.topk; ++j) {
    GluMlp(*m.Experts()[static_cast<size_t>(r.idx[static_cast<size_t>(j)])], d.situ_b1, d.situ_b2, z.data(), 1, y.data());
    for (size_t i = 0; i < acc.size(); ++i) acc[i] = acc[i] + r.weight[static_cast<size_t>(j)] * y[i];
  }
  RmsNorm(acc.data(), w.moe.norm.data(), d.latent, d.rms_eps, acc.data());
  F routed(x.size()), shared(x.size());
  kernels::MatVec(w.moe.up, acc.data(), routed.data());
  GluMlp(w.moe.shared, d.situ_b1, d.situ_b2, x.data(), 1, shared.data());
  ExpectSameBits(got, Add(routed, shared), "moe out");
}

// Layer `next`'s own routing (top `count`) of h under `gain` in place of its post-attention norm.
std::vector<int32_t> RankUnder(const LayerWeights& next, const Vec& gain, Dims d, const F& h,
                               int64_t count) {
  d.topk = count;
  std::vector<int32_t> idx(static_cast<size_t>(count));
  std::vector<float> weight(static_cast<size_t>(count));
  const F x = Norm(h, gain, d);
  RouteToken(next.moe.gate, next.moe.score_bias.data(), d, x.data(), idx.data(), weight.data());
  return idx;
}

// More experts than RandomDims has, so that guesses under different norms can differ.
Dims GuessDims() {
  Dims d = RandomDims();
  d.n_experts = 64;
  return d;
}

TEST(GuessExperts, OneRowIsTheNextLayersRankingUnderItsOwnNorm) {
  const Dims d = GuessDims();
  RandomModel m(d, 5);
  const LayerWeights previous = m.Layer(false, false);
  LayerWeights next = m.Layer(false, false);
  // Channel gains far from 1, as real layers have: the next layer's norm must be the one used.
  F gain(static_cast<size_t>(d.hidden));
  for (size_t i = 0; i < gain.size(); ++i) gain[i] = i % 3 == 0 ? 4.0f : 0.25f;
  next.post_attention_layernorm = Vec(gain);
  const F h = m.Activations(d.hidden, 3.0f);
  constexpr int64_t kCount = 8;
  const std::vector<int32_t> want = RankUnder(next, next.post_attention_layernorm, d, h, kCount);
  ASSERT_NE(want, RankUnder(next, previous.post_attention_layernorm, d, h, kCount))
      << "test precondition: the two norms must rank differently";
  EXPECT_EQ(GuessExperts(next, d, h.data(), 1, kCount), want);
  // Asking for more than there are gives every expert once, best first.
  const std::vector<int32_t> all = GuessExperts(next, d, h.data(), 1, d.n_experts + 5);
  ASSERT_EQ(static_cast<int64_t>(all.size()), d.n_experts);
  EXPECT_EQ(std::vector<int32_t>(all.begin(), all.begin() + kCount), want);
}

// `rows` random rows laid out [rows][E] in *h, and each row's own top `count` under next's norm.
std::vector<std::vector<int32_t>> RandomRows(RandomModel& m, const LayerWeights& next,
                                             const Dims& d, int64_t rows, int64_t count, F* h) {
  std::vector<std::vector<int32_t>> per_row;
  for (int64_t t = 0; t < rows; ++t) {
    const F row = m.Activations(d.hidden, 2.0f);
    h->insert(h->end(), row.begin(), row.end());
    per_row.push_back(RankUnder(next, next.post_attention_layernorm, d, row, count));
  }
  return per_row;
}

// The spec's merge, written out: every row's first choice, then every row's second, …, over the
// first `rows` rows, skipping repeats.
std::vector<int32_t> MergeRankMajor(const std::vector<std::vector<int32_t>>& per_row,
                                    int64_t rows, int64_t count) {
  std::vector<int32_t> merged;
  for (int64_t j = 0; j < count; ++j) {
    for (int64_t t = 0; t < rows; ++t) {
      const int32_t e = per_row[static_cast<size_t>(t)][static_cast<size_t>(j)];
      if (std::find(merged.begin(), merged.end(), e) == merged.end()) merged.push_back(e);
    }
  }
  return merged;
}

TEST(GuessExperts, RowsMergeRankMajorWithoutRepeats) {
  const Dims d = GuessDims();
  RandomModel m(d, 6);
  const LayerWeights next = m.Layer(false, false);
  constexpr int64_t kRows = 3, kCount = 6;
  F h;
  const auto per_row = RandomRows(m, next, d, kRows, kCount, &h);
  const std::vector<int32_t> want = MergeRankMajor(per_row, kRows, kCount);
  ASSERT_GT(want.size(), static_cast<size_t>(kCount)) << "test precondition: rows must differ";
  EXPECT_EQ(GuessExperts(next, d, h.data(), kRows, kCount), want);
}

TEST(GuessExperts, OnlyTheFirstCountRowsAreRanked) {
  const Dims d = GuessDims();
  RandomModel m(d, 8);
  const LayerWeights next = m.Layer(false, false);
  constexpr int64_t kRows = 5, kCount = 2;
  F h;
  const auto per_row = RandomRows(m, next, d, kRows, kCount, &h);
  const std::vector<int32_t> want = MergeRankMajor(per_row, kCount, kCount);  // rows 0 and 1
  EXPECT_EQ(GuessExperts(next, d, h.data(), kRows, kCount), want);
  bool later_rows_differ = false;  // precondition: ranking all rows would have given more
  for (int64_t t = kCount; t < kRows; ++t) {
    for (int32_t e : per_row[static_cast<size_t>(t)]) {
      later_rows_differ |= std::find(want.begin(), want.end(), e) == want.end();
    }
  }
  EXPECT_TRUE(later_rows_differ) << "test precondition: later rows must rank other experts";
}

TEST(GuessExperts, NothingForADenseLayerOrNoRoom) {
  const Dims d = GuessDims();
  RandomModel m(d, 7);
  const F h = m.Activations(d.hidden);
  EXPECT_TRUE(GuessExperts(m.Layer(false, true), d, h.data(), 1, 4).empty());
  EXPECT_TRUE(GuessExperts(m.Layer(false, false), d, h.data(), 1, 0).empty());
}

}  // namespace
}  // namespace k3::ops
