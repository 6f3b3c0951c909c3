// Bit-identity of the operators (DESIGN.md §7): across ISA paths, across 1/2/3 threads, and
// T rows in one call == T single-row calls with carried state (KDA, MLA KV cache, MoE, layers).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "k3run/kernels/matmul.h"
#include "k3run/ops/layer.h"
#include "kernel_settings.h"
#include "random_model.h"

namespace k3::ops {
namespace {

using testing::RandomDims;
using testing::KernelSettings;
using testing::RandomModel;

::testing::AssertionResult SameBits(const std::string& what, const std::vector<float>& a,
                                    const std::vector<float>& b) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << what << ": sizes " << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << what << "[" << i << "]: " << a[i] << " vs " << b[i]
                                           << " (bits differ)";
    }
  }
  return ::testing::AssertionSuccess();
}

constexpr int64_t kT = 5;

TEST(Identity, KdaLayerTRowsEqualSingleSteps) {
  const Dims d = RandomDims();
  RandomModel m(d);
  const LayerWeights w = m.Layer(false, false);
  const std::vector<float> x = m.Activations(kT * d.hidden);
  KdaState batch = KdaState::Zero(d), step = KdaState::Zero(d);
  std::vector<float> yb(x.size()), ys(x.size());
  KdaLayer(w.kda, d, x.data(), kT, &batch, yb.data());
  for (int64_t t = 0; t < kT; ++t)
    KdaLayer(w.kda, d, x.data() + t * d.hidden, 1, &step, ys.data() + t * d.hidden);
  EXPECT_TRUE(SameBits("kda out", yb, ys));
  EXPECT_TRUE(SameBits("kda S", batch.S, step.S));
  EXPECT_TRUE(SameBits("kda q history", batch.hist_q, step.hist_q));
  EXPECT_TRUE(SameBits("kda k history", batch.hist_k, step.hist_k));
  EXPECT_TRUE(SameBits("kda v history", batch.hist_v, step.hist_v));
}

// Speculation's rollback (DESIGN.md §11.4): rows run with records leave the state untouched and
// give the outputs of a plain run; replaying the first r of them gives the state of feeding
// just those r rows, for every r from 0 (drop all) to T (keep all).
TEST(Identity, KdaRecordsReplayKeepsExactlyTheFirstRows) {
  const Dims d = RandomDims();
  RandomModel m(d);
  const LayerWeights w = m.Layer(false, false);
  const std::vector<float> warm = m.Activations(3 * d.hidden);
  const std::vector<float> x = m.Activations(kT * d.hidden);
  KdaState start = KdaState::Zero(d);
  std::vector<float> ignored(warm.size());
  KdaLayer(w.kda, d, warm.data(), 3, &start, ignored.data());  // a state that is not zero

  KdaState plain = start;
  std::vector<float> y_plain(x.size()), y_rec(x.size());
  KdaLayer(w.kda, d, x.data(), kT, &plain, y_plain.data());
  KdaState live = start;
  KdaRecords records;
  KdaLayer(w.kda, d, x.data(), kT, &live, y_rec.data(), &records);
  EXPECT_TRUE(SameBits("outputs with records", y_rec, y_plain));
  EXPECT_TRUE(SameBits("state untouched", live.S, start.S));
  EXPECT_TRUE(SameBits("history untouched", live.hist_k, start.hist_k));
  ASSERT_EQ(records.rows, kT);
  for (int64_t keep = 0; keep <= kT; ++keep) {
    KdaState replayed = start, fed = start;
    KdaReplay(records, keep, d, &replayed);
    std::vector<float> y(static_cast<size_t>(std::max<int64_t>(keep, 1) * d.hidden));
    if (keep > 0) KdaLayer(w.kda, d, x.data(), keep, &fed, y.data());
    const std::string at = " keeping " + std::to_string(keep);
    EXPECT_TRUE(SameBits("S" + at, replayed.S, fed.S));
    EXPECT_TRUE(SameBits("q history" + at, replayed.hist_q, fed.hist_q));
    EXPECT_TRUE(SameBits("k history" + at, replayed.hist_k, fed.hist_k));
    EXPECT_TRUE(SameBits("v history" + at, replayed.hist_v, fed.hist_v));
  }
  // A state that moved is visible: replaying every row differs from the start.
  KdaState all = start;
  KdaReplay(records, kT, d, &all);
  EXPECT_FALSE(SameBits("S after all rows", all.S, start.S));
}

TEST(Identity, MlaTRowsEqualSingleStepsAndPrefillThenDecode) {
  const Dims d = RandomDims();
  RandomModel m(d);
  const LayerWeights w = m.Layer(true, false);
  const std::vector<float> x = m.Activations(kT * d.hidden);
  MlaCache batch = MlaCache::Make(d, kT), step = MlaCache::Make(d, kT), mixed = MlaCache::Make(d, kT);
  std::vector<float> yb(x.size()), ys(x.size()), ym(x.size());
  ASSERT_TRUE(MlaLayer(w.mla, d, x.data(), kT, &batch, yb.data()).ok());
  for (int64_t t = 0; t < kT; ++t)
    ASSERT_TRUE(MlaLayer(w.mla, d, x.data() + t * d.hidden, 1, &step, ys.data() + t * d.hidden).ok());
  // prefill 2 rows, then decode the rest one at a time
  ASSERT_TRUE(MlaLayer(w.mla, d, x.data(), 2, &mixed, ym.data()).ok());
  for (int64_t t = 2; t < kT; ++t)
    ASSERT_TRUE(MlaLayer(w.mla, d, x.data() + t * d.hidden, 1, &mixed, ym.data() + t * d.hidden).ok());
  EXPECT_TRUE(SameBits("mla out (single steps)", yb, ys));
  EXPECT_TRUE(SameBits("mla out (prefill 2 + decode)", yb, ym));
  EXPECT_TRUE(SameBits("mla latent cache", std::vector<float>(batch.data.begin(), batch.data.end()),
                       std::vector<float>(step.data.begin(), step.data.end())));
  EXPECT_EQ(batch.len, kT);
}

// LayerAttentionAll (every sequence of a pass in one fork/join) against LayerAttention once per
// sequence: the same outputs, states, records and caches, on 1 and 3 threads. Sequences of
// 2, 0, 1 and 3 rows; in KDA the 1-row one runs with records (speculation), in MLA the caches
// start at different lengths. A full cache fails the call before any cache changes.
struct AttentionRun {
  std::vector<float> out;
  std::vector<KdaState> kda;
  std::vector<KdaRecords> records;
  std::vector<MlaCache> mla;
};

AttentionRun RunAttention(const LayerWeights& w, const Dims& d, const std::vector<float>& warm,
                          const std::vector<float>& x, const std::vector<int64_t>& rows,
                          bool all_at_once) {
  const int64_t T = static_cast<int64_t>(x.size()) / d.hidden;
  AttentionRun run;
  for (size_t i = 0; i < rows.size(); ++i) {
    run.kda.push_back(KdaState::Zero(d));
    run.mla.push_back(MlaCache::Make(d, 16));
    // a different history per sequence: i rows of the warm-up (MLA cache lengths 0, 1, 2, ...)
    std::vector<float> ignored(warm.size());
    const int64_t n = static_cast<int64_t>(std::min<size_t>(i, 2));
    if (n == 0) continue;
    if (w.is_mla) {
      EXPECT_TRUE(MlaLayer(w.mla, d, warm.data(), n, &run.mla.back(), ignored.data()).ok());
    } else {
      KdaLayer(w.kda, d, warm.data(), n, &run.kda.back(), ignored.data());
    }
  }
  run.records.resize(rows.size());
  LayerScratch s;
  s.a = x;
  s.out.assign(x.size(), 0.0f);
  EXPECT_TRUE(BeginAttention(w, d, T, &s).ok());
  std::vector<AttentionSegment> segments;
  int64_t first = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    LayerState st;
    if (w.is_mla) {
      st.mla = &run.mla[i];
    } else {
      st.kda = &run.kda[i];
      if (rows[i] == 1) st.records = &run.records[i];
    }
    segments.push_back({first, rows[i], st});
    first += rows[i];
  }
  if (all_at_once) {
    EXPECT_TRUE(LayerAttentionAll(0, w, d, segments, &s).ok());
  } else {
    for (const AttentionSegment& g : segments) {
      EXPECT_TRUE(LayerAttention(0, w, d, g.first, g.n, g.state, &s).ok());
    }
  }
  EndAttention(w, d, &s);
  run.out = s.out;
  return run;
}

TEST(Identity, LayerAttentionAllEqualsOneCallPerSequence) {
  KernelSettings restore;
  const Dims d = RandomDims();
  RandomModel m(d);
  const std::vector<int64_t> rows = {2, 0, 1, 3};
  const std::vector<float> x = m.Activations(6 * d.hidden);
  const std::vector<float> warm = m.Activations(2 * d.hidden);  // earlier rows of sequences 1..
  for (bool mla : {false, true}) {
    const LayerWeights w = m.Layer(mla, false);
    for (int threads : {1, 3}) {
      kernels::SetThreads(threads);
      const std::string at = std::string(mla ? "mla" : "kda") + ", " +
                             std::to_string(threads) + " threads: ";
      const AttentionRun one = RunAttention(w, d, warm, x, rows, false);
      const AttentionRun all = RunAttention(w, d, warm, x, rows, true);
      EXPECT_TRUE(SameBits(at + "out", all.out, one.out));
      for (size_t i = 0; i < rows.size(); ++i) {
        const std::string seq = at + "sequence " + std::to_string(i) + " ";
        EXPECT_TRUE(SameBits(seq + "S", all.kda[i].S, one.kda[i].S));
        EXPECT_TRUE(SameBits(seq + "k history", all.kda[i].hist_k, one.kda[i].hist_k));
        EXPECT_TRUE(SameBits(seq + "record q", all.records[i].q, one.records[i].q));
        EXPECT_TRUE(SameBits(seq + "record alpha", all.records[i].alpha, one.records[i].alpha));
        EXPECT_EQ(all.mla[i].len, one.mla[i].len) << seq;
        EXPECT_TRUE(SameBits(
            seq + "cache", std::vector<float>(all.mla[i].data.begin(), all.mla[i].data.end()),
            std::vector<float>(one.mla[i].data.begin(), one.mla[i].data.end())));
      }
    }
  }
  // MLA: the last cache cannot take its rows, so nothing is written to any cache.
  const LayerWeights w = m.Layer(true, false);
  LayerScratch s;
  s.a = std::vector<float>(x.begin(), x.begin() + 3 * d.hidden);
  ASSERT_TRUE(BeginAttention(w, d, 3, &s).ok());
  MlaCache roomy = MlaCache::Make(d, 8), full = MlaCache::Make(d, 1);
  const std::vector<AttentionSegment> segments = {{0, 2, {nullptr, &roomy, nullptr}},
                                                  {2, 1, {nullptr, &full, nullptr}}};
  full.len = 1;
  const Status st = LayerAttentionAll(0, w, d, segments, &s);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("full"), std::string::npos) << st.ToString();
  EXPECT_EQ(roomy.len, 0);
}

TEST(Identity, MoeTRowsEqualSingleSteps) {
  const Dims d = RandomDims();
  RandomModel m(d);
  const LayerWeights w = m.Layer(false, false);
  const std::vector<float> x = m.Activations(kT * d.hidden, 2.0f);
  std::vector<float> yb(x.size()), ys(x.size());
  MoeStats sb, ss;
  MoeBlock(w.moe, m.Experts(), d, x.data(), kT, yb.data(), &sb);
  for (int64_t t = 0; t < kT; ++t)
    MoeBlock(w.moe, m.Experts(), d, x.data() + t * d.hidden, 1, ys.data() + t * d.hidden, &ss);
  EXPECT_TRUE(SameBits("moe out", yb, ys));
  EXPECT_EQ(sb.experts_skipped, 0);
}

// A 5-layer stack with the tiny preset's structure at block size 2: KDA dense, KDA MoE,
// MLA MoE (boundary), MLA MoE, KDA MoE (boundary), then the model-level aggregation.
struct Stack {
  Dims d = RandomDims();
  RandomModel m{d};
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm = std::vector<float>(static_cast<size_t>(d.hidden), 1.0f);
  std::vector<float> final_proj;
  Stack() {
    layers.push_back(m.Layer(false, true));
    layers.push_back(m.Layer(false, false));
    layers.push_back(m.Layer(true, false));
    layers.push_back(m.Layer(true, false));
    layers.push_back(m.Layer(false, false));
    final_proj = m.Activations(d.hidden, 0.3f);
  }
  int64_t capacity() const { return static_cast<int64_t>(layers.size()) / d.attn_res_block + 1; }

  // Runs rows [t0, t0+T) of x through the stack with carried states; returns their outputs.
  std::vector<float> Run(const std::vector<float>& x, int64_t t0, int64_t T,
                         std::vector<KdaState>* kda, std::vector<MlaCache>* mla) {
    const int64_t E = d.hidden;
    std::vector<float> h(x.begin() + t0 * E, x.begin() + (t0 + T) * E);
    BlockStack blocks = BlockStack::Make(T, E, capacity());
    MoeStats stats;
    for (size_t L = 0; L < layers.size(); ++L) {
      const Status s = DecoderLayer(static_cast<int64_t>(L), layers[L], m.Experts(), d, h.data(),
                                    T, &blocks, {&(*kda)[L], &(*mla)[L]}, &stats);
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
    FinalAttnRes(blocks, final_norm.data(), final_proj.data(), d.rms_eps, h.data(), T);
    EXPECT_EQ(stats.experts_skipped, 0);
    return h;
  }
  std::vector<KdaState> FreshKda() const { return std::vector<KdaState>(layers.size(), KdaState::Zero(d)); }
  std::vector<MlaCache> FreshMla() const {
    return std::vector<MlaCache>(layers.size(), MlaCache::Make(d, kT));
  }
  // All rows at once.
  std::vector<float> Prefill(const std::vector<float>& x) {
    auto kda = FreshKda();
    auto mla = FreshMla();
    return Run(x, 0, kT, &kda, &mla);
  }
};

TEST(Identity, DecoderLayersTRowsEqualSingleSteps) {
  Stack s;
  const std::vector<float> x = s.m.Activations(kT * s.d.hidden);
  const std::vector<float> batch = s.Prefill(x);
  auto kda = s.FreshKda();
  auto mla = s.FreshMla();
  std::vector<float> steps;
  for (int64_t t = 0; t < kT; ++t) {
    const std::vector<float> y = s.Run(x, t, 1, &kda, &mla);
    steps.insert(steps.end(), y.begin(), y.end());
  }
  EXPECT_TRUE(SameBits("5-layer stack output", batch, steps));
}

TEST(Identity, ThreadCountsOneTwoThree) {
  KernelSettings restore;
  Stack s;
  const std::vector<float> x = s.m.Activations(kT * s.d.hidden);
  kernels::SetThreads(1);
  const std::vector<float> ref = s.Prefill(x);
  for (int n : {2, 3}) {
    kernels::SetThreads(n);
    EXPECT_TRUE(SameBits("stack output with " + std::to_string(n) + " threads vs 1", s.Prefill(x), ref));
  }
}

void CheckIsaMatchesScalar(kernels::Isa isa) {
  if (!kernels::IsaSupported(isa))
    GTEST_SKIP() << kernels::IsaName(isa) << " not supported by this CPU";
  KernelSettings restore;
  Stack s;
  const std::vector<float> x = s.m.Activations(kT * s.d.hidden);
  kernels::SetIsa(kernels::Isa::kScalar);
  const std::vector<float> ref = s.Prefill(x);
  kernels::SetIsa(isa);
  for (int n : {1, 3}) {
    kernels::SetThreads(n);
    EXPECT_TRUE(SameBits(std::string("stack output on ") + kernels::IsaName(isa) + " with " +
                             std::to_string(n) + " threads vs scalar",
                         s.Prefill(x), ref));
  }
}
TEST(Identity, Avx2MatchesScalar) { CheckIsaMatchesScalar(kernels::Isa::kAvx2); }
TEST(Identity, Avx512MatchesScalar) { CheckIsaMatchesScalar(kernels::Isa::kAvx512); }

}  // namespace
}  // namespace k3::ops
