// External conformance: every fixture in tests/data/conformance/ops through our operators with
// the MANIFEST tolerance (DESIGN.md §10; field meanings in tests/data/conformance/README.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "fixture.h"
#include "fixture_weights.h"
#include "k3run/ops/activation.h"
#include "k3run/ops/attnres.h"
#include "k3run/ops/conv.h"
#include "k3run/ops/kda.h"
#include "k3run/ops/layer.h"
#include "k3run/ops/mla.h"
#include "k3run/ops/moe.h"
#include "k3run/ops/norm.h"
#include "k3run/ops/router.h"

namespace k3::ops {
namespace {

using testing::AllNear;
using testing::KdaFrom;
using testing::Fixture;
using testing::ManifestDims;
using testing::MaxAbsWithin;
using testing::Tensor;

// The fixtures each test below covers; the meta test checks the directory against this list.
const std::vector<std::string> kCovered = {
    "rmsnorm", "situ_glu", "shortconv", "kda_decay", "kda_recur1", "kda_recur8", "kda_layer1",
    "kda_layer8", "router", "attnres", "mla", "moe", "layer_kda", "layer_mla"};

TEST(Conformance, EveryFixtureFileHasATest) {
  std::set<std::string> on_disk;
  for (const auto& e : std::filesystem::directory_iterator(Fixture::Dir())) {
    if (e.path().extension() == ".json" && e.path().stem() != "MANIFEST")
      on_disk.insert(e.path().stem().string());
  }
  const std::set<std::string> covered(kCovered.begin(), kCovered.end());
  for (const auto& f : on_disk) EXPECT_TRUE(covered.count(f)) << f << ".json has no test";
  for (const auto& f : covered) EXPECT_TRUE(on_disk.count(f)) << f << ".json is missing";
}

std::vector<float> Zeros(int64_t n) { return std::vector<float>(static_cast<size_t>(n), 0.0f); }

TEST(Conformance, rmsnorm) {
  const Fixture f = Fixture::Load("rmsnorm");
  const Tensor& in = f.T("in");
  const int64_t n = in.shape[1];
  std::vector<float> out = Zeros(static_cast<int64_t>(in.data.size()));
  for (int64_t r = 0; r < in.shape[0]; ++r) {
    RmsNorm(in.data.data() + r * n, f.V("weight").data(), n, static_cast<float>(f.Num("eps")),
            out.data() + r * n);
  }
  EXPECT_TRUE(AllNear(f.name(), "out", out.data(), f.T("out").data));
}

TEST(Conformance, situ_glu) {
  const Fixture f = Fixture::Load("situ_glu");
  const Tensor& in = f.T("in");  // [rows][gate n | up n]
  const int64_t rows = in.shape[0], n = in.shape[1] / 2;
  std::vector<float> out = Zeros(rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    SituGlu(in.data.data() + r * 2 * n, in.data.data() + r * 2 * n + n, n,
            static_cast<float>(f.Num("beta")), static_cast<float>(f.Num("linear_beta")),
            out.data() + r * n);
  }
  EXPECT_TRUE(AllNear(f.name(), "out", out.data(), f.T("out").data));
  const double cap = f.Num("max_abs") + 1e-2;
  for (size_t i = 0; i < out.size(); ++i)
    EXPECT_LE(std::fabs(out[i]), cap) << "situ_glu.out[" << i << "] exceeds beta*linear_beta";
}

TEST(Conformance, shortconv) {
  const Fixture f = Fixture::Load("shortconv");
  const int64_t C = static_cast<int64_t>(f.Num("channels")), K = static_cast<int64_t>(f.Num("kernel"));
  const Tensor& in = f.T("in");
  const int64_t T = in.shape[1];
  std::vector<float> hist = Zeros(C * (K - 1)), out = Zeros(T * C), out_next = Zeros(C);
  ShortConv(in.data.data(), T, C, K, f.V("weight").data(), hist.data(), out.data());
  EXPECT_TRUE(AllNear(f.name(), "out", out.data(), f.T("out").data));
  EXPECT_TRUE(AllNear(f.name(), "state_after", hist.data(), f.T("state_after").data));
  // Continuation from the carried history.
  ShortConv(f.T("in_next").data.data(), 1, C, K, f.V("weight").data(), hist.data(),
            out_next.data());
  EXPECT_TRUE(AllNear(f.name(), "out_next", out_next.data(), f.T("out_next").data));
}

TEST(Conformance, kda_decay) {
  const Fixture f = Fixture::Load("kda_decay");
  const Tensor& z = f.T("z");  // [1][T][P]
  const int64_t T = z.shape[1], P = z.shape[2];
  const int64_t H = f.T("A_log").shape[0], D = P / H;
  std::vector<float> g = Zeros(T * P), alpha = Zeros(T * P);
  for (int64_t t = 0; t < T; ++t) {
    KdaDecay(z.data.data() + t * P, f.V("A_log").data(), f.V("dt_bias").data(), H, D,
             static_cast<float>(f.Num("lower_bound")), g.data() + t * P, alpha.data() + t * P);
  }
  EXPECT_TRUE(MaxAbsWithin(f.name(), "g", g.data(), f.T("g").data, 1e-5));
  EXPECT_TRUE(MaxAbsWithin(f.name(), "alpha", alpha.data(), f.T("alpha").data, 1e-5));
  // α = 1 exactly is legal; the range is (e^lb, 1].
  for (size_t i = 0; i < alpha.size(); ++i) {
    EXPECT_GT(alpha[i], std::exp(f.Num("lower_bound")) * (1 - 1e-6)) << "alpha[" << i << "]";
    EXPECT_LE(alpha[i], 1.0f) << "alpha[" << i << "]";
  }
}

// The recurrence alone: q NOT pre-scaled in the fixture (we scale by q_scale), no L2 norm.
void RunKdaRecur(const std::string& name) {
  const Fixture f = Fixture::Load(name);
  const int64_t T = static_cast<int64_t>(f.Num("T")), H = static_cast<int64_t>(f.Num("H"));
  const int64_t D = static_cast<int64_t>(f.Num("d_k"));
  ASSERT_EQ(static_cast<int64_t>(f.Num("d_v")), D) << name << ": d_v != d_k is not a K3 shape";
  const float q_scale = static_cast<float>(f.Num("q_scale"));
  std::vector<float> S = Zeros(H * D * D), out = Zeros(T * H * D), qs = Zeros(D);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t at = (t * H + h) * D;
      for (int64_t i = 0; i < D; ++i) qs[static_cast<size_t>(i)] = f.T("q").data[static_cast<size_t>(at + i)] * q_scale;
      KdaRecurrenceStep(S.data() + h * D * D, qs.data(), f.T("k").data.data() + at,
                        f.T("v").data.data() + at, f.T("alpha").data.data() + at,
                        f.T("beta").data[static_cast<size_t>(t * H + h)], D, out.data() + at);
    }
  }
  EXPECT_TRUE(AllNear(name, "out", out.data(), f.T("out").data));
  EXPECT_TRUE(AllNear(name, "state_out", S.data(), f.T("state_out").data));
}
TEST(Conformance, kda_recur1) { RunKdaRecur("kda_recur1"); }
TEST(Conformance, kda_recur8) { RunKdaRecur("kda_recur8"); }

void RunKdaLayer(const std::string& name) {
  const Fixture f = Fixture::Load(name);
  Dims d = ManifestDims();
  d.kda_heads = static_cast<int64_t>(f.Num("H"));
  d.kda_head_dim = static_cast<int64_t>(f.Num("d_k"));
  d.conv_k = static_cast<int64_t>(f.Num("conv_k"));
  d.gate_lb = static_cast<float>(f.Num("lower_bound"));
  d.rms_eps = static_cast<float>(f.Num("rms_eps"));
  const Tensor& in = f.T("in");
  const int64_t T = static_cast<int64_t>(f.Num("T"));
  d.hidden = in.shape[2];
  KdaState st = KdaState::Zero(d);
  std::vector<float> out = Zeros(T * d.hidden);
  KdaLayer(KdaFrom(f, false), d, in.data.data(), T, &st, out.data());
  EXPECT_TRUE(AllNear(name, "out", out.data(), f.T("out").data));
  EXPECT_TRUE(AllNear(name, "state_out", st.S.data(), f.T("state_out").data));
}
TEST(Conformance, kda_layer1) { RunKdaLayer("kda_layer1"); }
TEST(Conformance, kda_layer8) { RunKdaLayer("kda_layer8"); }

TEST(Conformance, router) {
  const Fixture f = Fixture::Load("router");
  Dims d = ManifestDims();
  d.topk = static_cast<int64_t>(f.Num("top_k"));
  d.n_experts = static_cast<int64_t>(f.Num("n_experts"));
  const Tensor& in = f.T("in");
  const int64_t rows = in.shape[0], E = in.shape[1], k = d.topk;
  const Tensor& want_idx = f.T("topk_idx");
  const Tensor& want_w = f.T("topk_weight");
  std::vector<int32_t> idx(static_cast<size_t>(k));
  std::vector<float> w(static_cast<size_t>(k));
  for (int64_t r = 0; r < rows; ++r) {
    RouteToken(f.F32("gate_weight"), f.V("bias").data(), d, in.data.data() + r * E, idx.data(),
               w.data());
    std::set<int32_t> got_set(idx.begin(), idx.end()), want_set;
    for (int64_t j = 0; j < k; ++j)
      want_set.insert(static_cast<int32_t>(std::lround(want_idx.data[static_cast<size_t>(r * k + j)])));
    ASSERT_EQ(got_set, want_set) << "router.topk_idx row " << r << ": selected expert sets differ";
    // Weights matched by expert id (the reference top-k is unsorted).
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = static_cast<int32_t>(std::lround(want_idx.data[static_cast<size_t>(r * k + j)]));
      const auto pos = std::find(idx.begin(), idx.end(), e) - idx.begin();
      std::vector<float> want1 = {want_w.data[static_cast<size_t>(r * k + j)]};
      EXPECT_TRUE(AllNear("router", "topk_weight[row " + std::to_string(r) + ", expert " +
                                        std::to_string(e) + "]",
                          &w[static_cast<size_t>(pos)], want1));
    }
  }
}

TEST(Conformance, attnres) {
  const Fixture f = Fixture::Load("attnres");
  const Tensor& prefix = f.T("prefix_sum");    // [T][E], the last source
  const Tensor& blocks = f.T("block_residual");  // [T][nb][E]
  const int64_t T = prefix.shape[0], E = prefix.shape[1], nb = blocks.shape[1];
  ASSERT_EQ(nb + 1, static_cast<int64_t>(f.Num("n_sources")));
  std::vector<float> fold = Zeros(E), out = Zeros(T * E);
  FoldAttnRes(f.V("norm_weight").data(), f.V("proj_weight").data(), E, fold.data());
  EXPECT_TRUE(AllNear("attnres", "fold_hint", fold.data(), f.T("fold_hint").data));
  std::vector<const float*> src(static_cast<size_t>(nb + 1));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < nb; ++k) src[static_cast<size_t>(k)] = blocks.data.data() + (t * nb + k) * E;
    src[static_cast<size_t>(nb)] = prefix.data.data() + t * E;
    AttnRes(src.data(), nb + 1, fold.data(), E, static_cast<float>(f.Num("eps")),
            out.data() + t * E);
  }
  EXPECT_TRUE(AllNear("attnres", "out", out.data(), f.T("out").data));
}

}  // namespace
}  // namespace k3::ops
