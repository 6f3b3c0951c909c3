// Each operator against a tiny hand-computed case or a float64 reimplementation written here
// from MODEL.md §3 (not from the code under test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "k3run/ops/activation.h"
#include "k3run/ops/attnres.h"
#include "k3run/ops/conv.h"
#include "k3run/ops/kda.h"
#include "k3run/ops/math.h"
#include "k3run/ops/mla.h"
#include "k3run/ops/moe.h"
#include "k3run/ops/norm.h"
#include "k3run/ops/router.h"

namespace k3::ops {
namespace {

double Sig(double z) { return 1.0 / (1.0 + std::exp(-z)); }

TEST(RmsNorm, EpsIsInsideTheSqrtAndGainMultipliesFirst) {
  // ss/n = 1, + eps 3 = 4, inv = 0.5 exactly; eps outside the sqrt would give 0.25.
  const float x[2] = {1.0f, -1.0f}, w[2] = {2.0f, 3.0f};
  float y[2];
  RmsNorm(x, w, 2, 3.0f, y);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -1.5f);
}

TEST(RmsNorm, MatchesFloat64Reference) {
  std::vector<float> x(37), w(37), y(37);
  for (int i = 0; i < 37; ++i) {
    x[static_cast<size_t>(i)] = std::sin(0.7f * static_cast<float>(i)) * 3.0f;
    w[static_cast<size_t>(i)] = 1.0f + 0.01f * static_cast<float>(i);
  }
  RmsNorm(x.data(), w.data(), 37, 1e-5f, y.data());
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double inv = 1.0 / std::sqrt(ss / 37 + 1e-5);
  for (size_t i = 0; i < 37; ++i) EXPECT_NEAR(y[i], w[i] * x[i] * inv, 1e-6) << i;
}

TEST(L2Norm, DividesBySqrtOfTheSumNotTheMean) {
  float v[2] = {3.0f, 4.0f};
  L2Norm(v, 2);
  EXPECT_NEAR(v[0], 0.6, 1e-6);  // a mean-based norm would give 0.6·√2
  EXPECT_NEAR(v[1], 0.8, 1e-6);
}

TEST(SituGlu, HandValuesAndTheCap) {
  const float g[4] = {0.0f, 1000.0f, -1000.0f, 8.0f};
  const float u[4] = {5.0f, 1000.0f, 1000.0f, 1.0f};
  float y[4];
  SituGlu(g, u, 4, 4.0f, 25.0f, y);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_NEAR(y[1], 100.0, 1e-4);  // β1·β2
  EXPECT_NEAR(y[2], 0.0, 1e-6);
  // The sigmoid takes the UNCAPPED gate: σ(8), not σ(4·tanh(2)).
  const double want = 4.0 * std::tanh(2.0) * Sig(8.0) * 25.0 * std::tanh(1.0 / 25.0);
  EXPECT_NEAR(y[3], want, 1e-5);
}

TEST(ShortConv, HandComputedWithCarriedHistory) {
  // C = 1, K = 3, taps w = [1, 2, 3] (w[2] is the current tap), inputs 1, 2, 3 from zero history:
  //   t0: 3·1 = 3;  t1: 3·2 + 1·0 + 2·1 = 8;  t2: 3·3 + 1·1 + 2·2 = 14.
  const float w[3] = {1.0f, 2.0f, 3.0f};
  const float x[3] = {1.0f, 2.0f, 3.0f};
  float hist[2] = {0.0f, 0.0f}, y[3];
  ShortConv(x, 2, 1, 3, w, hist, y);  // two rows, then one more from the carried history
  ShortConv(x + 2, 1, 1, 3, w, hist, y + 2);
  const double acc[3] = {3, 8, 14};
  for (int t = 0; t < 3; ++t) EXPECT_NEAR(y[t], acc[t] * Sig(acc[t]), 1e-5) << t;
  EXPECT_EQ(hist[0], 2.0f);  // oldest first
  EXPECT_EQ(hist[1], 3.0f);
}

TEST(KdaDecay, MatchesFloat64ReferenceAndUsesALogPerHead) {
  const int64_t H = 2, D = 3;
  const float z[6] = {0.1f, -2.0f, 3.0f, 0.5f, -0.5f, 40.0f};
  const float A_log[2] = {0.3f, -0.7f};
  const float dt[6] = {0.2f, 0.0f, -1.0f, 0.1f, 0.3f, 0.0f};
  float g[6], a[6];
  KdaDecay(z, A_log, dt, H, D, -5.0f, g, a);
  for (int64_t i = 0; i < 6; ++i) {
    const double u = std::exp(static_cast<double>(A_log[i / D])) * (z[i] + dt[i]);
    const double gw = -5.0 * Sig(u);
    EXPECT_NEAR(g[i], gw, 1e-5) << i;
    EXPECT_NEAR(a[i], std::exp(gw), 1e-5) << i;
  }
}

TEST(KdaRecurrence, MatchesFloat64DeltaRule) {
  const int64_t D = 4, steps = 3;
  std::vector<float> S(16, 0.0f);
  std::vector<double> Sd(16, 0.0);
  for (int64_t t = 0; t < steps; ++t) {
    float q[4], k[4], v[4], al[4], o[4];
    for (int64_t i = 0; i < D; ++i) {
      const float f = static_cast<float>(t * D + i);
      q[i] = 0.5f * std::cos(f);
      k[i] = std::sin(1.3f * f);
      v[i] = std::cos(0.4f * f) * 2.0f;
      al[i] = 0.5f + 0.1f * static_cast<float>(i);
    }
    const float beta = 0.7f;
    KdaRecurrenceStep(S.data(), q, k, v, al, beta, D, o);
    // float64: decay rows, u = Sᵀk, delta write, o = Sᵀq from the updated state
    std::vector<double> u(4, 0.0), od(4, 0.0);
    for (int64_t i = 0; i < D; ++i)
      for (int64_t j = 0; j < D; ++j) Sd[static_cast<size_t>(i * D + j)] *= al[i];
    for (int64_t i = 0; i < D; ++i)
      for (int64_t j = 0; j < D; ++j) u[static_cast<size_t>(j)] += k[i] * Sd[static_cast<size_t>(i * D + j)];
    for (int64_t i = 0; i < D; ++i)
      for (int64_t j = 0; j < D; ++j)
        Sd[static_cast<size_t>(i * D + j)] += static_cast<double>(k[i]) * beta * (v[j] - u[static_cast<size_t>(j)]);
    for (int64_t i = 0; i < D; ++i)
      for (int64_t j = 0; j < D; ++j) od[static_cast<size_t>(j)] += q[i] * Sd[static_cast<size_t>(i * D + j)];
    for (int64_t j = 0; j < D; ++j) EXPECT_NEAR(o[j], od[static_cast<size_t>(j)], 1e-5) << "t " << t << " j " << j;
  }
  for (size_t i = 0; i < 16; ++i) EXPECT_NEAR(S[i], Sd[i], 1e-5) << i;
}

TEST(Softmax, DoubleSumAndFp32Ratio) {
  const float s[3] = {1.0f, 2.0f, 3.0f};
  float p[3];
  Softmax(s, 3, p);
  const double Z = std::exp(-2.0) + std::exp(-1.0) + 1.0;
  EXPECT_NEAR(p[0], std::exp(-2.0) / Z, 1e-7);
  EXPECT_NEAR(p[2], 1.0 / Z, 1e-7);
}

TEST(AttnRes, KeysNormalisedValuesRaw) {
  // Two sources parallel to each other: their RMS-normalised keys are equal, so the scores tie,
  // p = 1/2 each, and the output is the mean of the RAW sources.
  const int64_t E = 4;
  const float a[4] = {1, 2, 3, 4}, b[4] = {3, 6, 9, 12};
  const float fold[4] = {0.5f, -1.0f, 2.0f, 0.25f};
  const float* src[2] = {a, b};
  float out[4];
  AttnRes(src, 2, fold, E, 0.0f, out);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i], 0.5 * (a[i] + b[i]), 1e-5) << i;
}

TEST(AttnRes, MatchesFloat64Reference) {
  const int64_t E = 8, m = 3;
  std::vector<std::vector<float>> s(3, std::vector<float>(8));
  std::vector<float> fold(8);
  for (int64_t k = 0; k < m; ++k)
    for (int64_t i = 0; i < E; ++i) s[static_cast<size_t>(k)][static_cast<size_t>(i)] = std::sin(static_cast<float>(k * 10 + i));
  for (int64_t i = 0; i < E; ++i) fold[static_cast<size_t>(i)] = 0.3f * static_cast<float>(i) - 1.0f;
  const float* src[3] = {s[0].data(), s[1].data(), s[2].data()};
  float out[8];
  AttnRes(src, m, fold.data(), E, 1e-5f, out);
  std::vector<double> score(3);
  for (size_t k = 0; k < 3; ++k) {
    double ss = 0;
    for (float v : s[k]) ss += static_cast<double>(v) * v;
    const double inv = 1.0 / std::sqrt(ss / E + 1e-5);
    for (size_t i = 0; i < 8; ++i) score[k] += s[k][i] * inv * fold[i];
  }
  const double mx = std::max({score[0], score[1], score[2]});
  double Z = 0;
  for (double& v : score) Z += (v = std::exp(v - mx));
  for (size_t i = 0; i < 8; ++i) {
    double want = 0;
    for (size_t k = 0; k < 3; ++k) want += score[k] / Z * s[k][i];
    EXPECT_NEAR(out[i], want, 1e-5) << i;
  }
}

// Router on a 4-expert, 2-wide identity-like gate: logits are x itself.
struct RouterCase {
  std::vector<float> gate = {1, 0, 0, 1, 0, 0, 0, 0};  // rows e: [e0 = x0, e1 = x1, e2 = 0, e3 = 0]
  kernels::Matrix Gate() const {
    kernels::Matrix m{};
    m.type = kernels::WeightType::kF32;
    m.rows = 4;
    m.cols = 2;
    m.data = gate.data();
    return m;
  }
  Dims d = [] {
    Dims x;
    x.n_experts = 4;
    x.topk = 2;
    return x;
  }();
};

TEST(Router, TiesGoToTheLowestExpertIndex) {
  RouterCase c;
  const float bias[4] = {0, 0, 0, 0};
  const float x[2] = {-1.0f, -1.0f};  // s = σ(-1), σ(-1), 0.5, 0.5: experts 2 and 3 tie on top
  int32_t idx[2];
  float w[2];
  RouteToken(c.Gate(), bias, c.d, x, idx, w);
  EXPECT_EQ(idx[0], 2);
  EXPECT_EQ(idx[1], 3);
}

TEST(Router, BiasSelectsButDoesNotWeight) {
  RouterCase c;
  const float bias[4] = {0, 0, 0.5f, 0};
  const float x[2] = {2.0f, 1.0f};  // s = σ(2), σ(1), 0.5, 0.5; c(2) = 1.0 is the largest
  int32_t idx[2];
  float w[2];
  RouteToken(c.Gate(), bias, c.d, x, idx, w);
  ASSERT_EQ(idx[0], 2);  // descending selection score
  ASSERT_EQ(idx[1], 0);
  const double S = 0.5 + Sig(2.0);
  EXPECT_NEAR(w[0], 0.5 / S, 1e-6);  // weights from the UNBIASED sigmoid, renormalised
  EXPECT_NEAR(w[1], Sig(2.0) / S, 1e-6);
}

TEST(Router, RoutedScaleAfterRenormAndNoRenormOption) {
  RouterCase c;
  const float bias[4] = {0, 0, 0, 0};
  const float x[2] = {2.0f, 1.0f};
  int32_t idx[2];
  float w[2];
  c.d.routed_scale = 2.5f;
  RouteToken(c.Gate(), bias, c.d, x, idx, w);
  EXPECT_NEAR(w[0] + w[1], 2.5, 1e-6);
  c.d.moe_renorm = false;
  c.d.routed_scale = 1.0f;
  RouteToken(c.Gate(), bias, c.d, x, idx, w);
  EXPECT_NEAR(w[0], Sig(2.0), 1e-6);
  EXPECT_NEAR(w[1], Sig(1.0), 1e-6);
}

TEST(Router, Bf16GateIsWidenedExactly) {
  RouterCase c;
  std::vector<uint16_t> g16;
  for (float v : c.gate) g16.push_back(kernels::F32ToBf16RoundNearestEven(v));
  kernels::Matrix m = c.Gate();
  m.type = kernels::WeightType::kBF16;
  m.data = g16.data();
  const float bias[4] = {0, 0, 0, 0};
  const float x[2] = {0.75f, 1.25f};
  int32_t i16[2], i32[2];
  float w16[2], w32[2];
  RouteToken(m, bias, c.d, x, i16, w16);
  RouteToken(c.Gate(), bias, c.d, x, i32, w32);
  EXPECT_EQ(i16[0], i32[0]);
  EXPECT_EQ(i16[1], i32[1]);
  EXPECT_EQ(w16[0], w32[0]);
  EXPECT_EQ(w16[1], w32[1]);
}

// The selection against a stable sort by (c descending, index ascending), with scores drawn from
// a few values so that ties are everywhere, ±0 among them, at k from 1 to N; and, when a score
// is NaN, against the k-pass scan (each pass: the first untaken expert no later one beats).
TEST(Router, SelectionIsTheStableSortsFirstKAndTheScanWithNaN) {
  uint64_t state = 12345;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state >> 33);
  };
  const float kBias[] = {0.0f, -0.0f, 0.25f, -0.5f, 0.125f};
  const double kLogit[] = {-1.0, 0.0, -0.0, 2.0, 0.5, -30.0};
  for (int round = 0; round < 400; ++round) {
    Dims d;
    d.n_experts = 1 + next() % 70;
    d.topk = 1 + next() % d.n_experts;
    d.moe_renorm = false;
    const size_t N = static_cast<size_t>(d.n_experts);
    std::vector<double> logits(N);
    std::vector<float> bias(N);
    for (size_t e = 0; e < N; ++e) {
      logits[e] = kLogit[next() % 6];
      bias[e] = kBias[next() % 5];
    }
    const bool with_nan = round % 4 == 3;
    if (with_nan) logits[next() % N] = std::nan("");
    std::vector<float> c(N);
    for (size_t e = 0; e < N; ++e) c[e] = Sigmoid(static_cast<float>(logits[e])) + bias[e];
    std::vector<int32_t> want;
    if (!with_nan) {
      std::vector<int32_t> order(N);
      for (size_t e = 0; e < N; ++e) order[e] = static_cast<int32_t>(e);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return c[a] > c[b]; });
      want.assign(order.begin(), order.begin() + d.topk);
    } else {
      std::vector<bool> taken(N, false);
      for (int64_t j = 0; j < d.topk; ++j) {
        int64_t best = -1;
        for (size_t e = 0; e < N; ++e) {
          if (taken[e]) continue;
          if (best < 0 || c[e] > c[static_cast<size_t>(best)]) best = static_cast<int64_t>(e);
        }
        taken[static_cast<size_t>(best)] = true;
        want.push_back(static_cast<int32_t>(best));
      }
    }
    std::vector<int32_t> idx(static_cast<size_t>(d.topk));
    std::vector<float> w(static_cast<size_t>(d.topk));
    SelectExperts(logits.data(), bias.data(), d, idx.data(), w.data());
    ASSERT_EQ(idx, want) << "round " << round << ", N " << N << ", k " << d.topk;
    for (size_t j = 0; j < idx.size(); ++j) {
      const float sj = Sigmoid(static_cast<float>(logits[static_cast<size_t>(idx[j])]));
      ASSERT_EQ(std::memcmp(&w[j], &sj, 4), 0) << "weight " << j << " of round " << round;
    }
  }
}

// Grouped in one pass, each expert's slot rows are what RowsOf finds by scanning for it: for
// every id in and around the routed ones, on routings with repeats, gaps and a negative id.
TEST(Moe, SlotsByExpertAppendWhatRowsOfAppends) {
  uint64_t state = 777;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state >> 33);
  };
  for (int round = 0; round < 50; ++round) {
    Routing r;
    r.T = 1 + next() % 9;
    r.topk = 1 + next() % 5;
    const int32_t lo = round % 5 == 0 ? -3 : 0, spread = 1 + next() % 40;
    for (int64_t s = 0; s < r.T * r.topk; ++s) {
      r.idx.push_back(lo + static_cast<int32_t>(next() % static_cast<uint32_t>(spread)));
    }
    const SlotsByExpert slots(r);
    for (int32_t e = lo - 2; e < lo + spread + 2; ++e) {
      std::vector<int64_t> want = {-1}, got = {-1};  // both append after what is there
      RowsOf(r, e, &want);
      slots.AppendRowsOf(e, &got);
      ASSERT_EQ(got, want) << "round " << round << ", expert " << e;
    }
  }
  const Routing empty;
  const SlotsByExpert none(empty);
  std::vector<int64_t> rows;
  none.AppendRowsOf(0, &rows);
  EXPECT_TRUE(rows.empty());
  Routing wide;  // ids far apart
  wide.T = 3;
  wide.topk = 1;
  wide.idx = {1 << 25, 0, 1 << 25};
  const SlotsByExpert spread(wide);
  spread.AppendRowsOf(1 << 25, &rows);
  spread.AppendRowsOf(0, &rows);
  EXPECT_EQ(rows, (std::vector<int64_t>{0, 2, 1}));
}

}  // namespace
}  // namespace k3::ops
