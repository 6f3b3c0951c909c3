// The block-level operators (KDA layer, MLA with a KV cache, LatentMoE) against float64
// reimplementations written here from MODEL.md §3.4–3.6. Weights are the random BF16 / MXFP4
// ones of RandomModel, decoded here independently of the kernels (MODEL.md §4).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "k3run/ops/kda.h"
#include "k3run/ops/mla.h"
#include "k3run/ops/moe.h"
#include "random_model.h"

namespace k3::ops {
namespace {

using testing::RandomDims;
using testing::RandomModel;
using V = std::vector<double>;

double Sig(double z) { return 1.0 / (1.0 + std::exp(-z)); }

// Element (r, c) of a weight matrix as a double.
double At(const Matrix& m, int64_t r, int64_t c) {
  switch (m.type) {
    case kernels::WeightType::kF32:
      return static_cast<const float*>(m.data)[r * m.cols + c];
    case kernels::WeightType::kBF16: {
      const uint16_t b = static_cast<const uint16_t*>(m.data)[r * m.cols + c];
      uint32_t u = static_cast<uint32_t>(b) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    case kernels::WeightType::kMXFP4: {
      static const double kE2M1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
      const uint8_t byte = static_cast<const uint8_t*>(m.data)[r * (m.cols / 2) + c / 2];
      const int nib = (c % 2 == 0) ? (byte & 15) : (byte >> 4);  // low nibble = even element
      const uint8_t s = m.scales[r * (m.cols / 32) + c / 32];
      const double mag = kE2M1[nib & 7] * (s == 255 ? 0.0 : std::ldexp(1.0, s - 127));
      return (nib & 8) ? -mag : mag;
    }
  }
  return 0;
}

V Mul(const Matrix& m, const V& x) {
  V y(static_cast<size_t>(m.rows), 0.0);
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t c = 0; c < m.cols; ++c) y[static_cast<size_t>(r)] += At(m, r, c) * x[static_cast<size_t>(c)];
  return y;
}

V RmsNorm64(const V& x, const Vec& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  V y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = w[i] * x[i] * inv;
  return y;
}

V Situ64(const V& g, const V& u, double b1, double b2) {
  V y(g.size());
  for (size_t i = 0; i < g.size(); ++i)
    y[i] = b1 * std::tanh(g[i] / b1) * Sig(g[i]) * b2 * std::tanh(u[i] / b2);
  return y;
}

V Row(const std::vector<float>& x, int64_t t, int64_t n) {
  return V(x.begin() + t * n, x.begin() + (t + 1) * n);
}

::testing::AssertionResult Close(const char* what, const std::vector<float>& got, const V& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= 1e-5 + 1e-4 * std::fabs(want[i])))
      return ::testing::AssertionFailure() << what << "[" << i << "]: got " << got[i] << " want "
                                           << want[i];
  }
  return ::testing::AssertionSuccess();
}

constexpr int64_t kT = 4;

TEST(Ref64, KdaLayer) {
  const Dims d = RandomDims();
  RandomModel m(d, 11);
  const KdaWeights w = m.Layer(false, false).kda;
  const std::vector<float> x = m.Activations(kT * d.hidden);
  KdaState st = KdaState::Zero(d);
  std::vector<float> got(x.size());
  KdaLayer(w, d, x.data(), kT, &st, got.data());

  const int64_t H = d.kda_heads, D = d.kda_head_dim, P = H * D, K = d.conv_k, E = d.hidden;
  V S(static_cast<size_t>(H * D * D), 0.0), want;
  std::vector<V> raw_q, raw_k, raw_v;  // pre-conv inputs of every token so far
  for (int64_t t = 0; t < kT; ++t) {
    const V xt = Row(x, t, E);
    raw_q.push_back(Mul(w.q_proj, xt));
    raw_k.push_back(Mul(w.k_proj, xt));
    raw_v.push_back(Mul(w.v_proj, xt));
    auto conv = [&](const std::vector<V>& raw, const Vec& taps) {
      V y(static_cast<size_t>(P));
      for (int64_t c = 0; c < P; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < K; ++j) {  // tap j sees x_{t-(K-1)+j}; zeros before the start
          const int64_t s = t - (K - 1) + j;
          if (s >= 0) acc += taps[static_cast<size_t>(c * K + j)] * raw[static_cast<size_t>(s)][static_cast<size_t>(c)];
        }
        y[static_cast<size_t>(c)] = acc * Sig(acc);
      }
      return y;
    };
    V q = conv(raw_q, w.q_conv), k = conv(raw_k, w.k_conv), v = conv(raw_v, w.v_conv);
    const V b = Mul(w.b_proj, xt), z = Mul(w.f_b_proj, Mul(w.f_a_proj, xt)), g = Mul(w.g_proj, xt);
    V o(static_cast<size_t>(P));
    for (int64_t h = 0; h < H; ++h) {
      double qs = 0, ks = 0;
      for (int64_t i = 0; i < D; ++i) {
        qs += q[static_cast<size_t>(h * D + i)] * q[static_cast<size_t>(h * D + i)];
        ks += k[static_cast<size_t>(h * D + i)] * k[static_cast<size_t>(h * D + i)];
      }
      V qh(static_cast<size_t>(D)), kh(static_cast<size_t>(D)), al(static_cast<size_t>(D));
      for (int64_t i = 0; i < D; ++i) {
        qh[static_cast<size_t>(i)] = q[static_cast<size_t>(h * D + i)] / std::sqrt(qs + 1e-6) / std::sqrt(static_cast<double>(D));
        kh[static_cast<size_t>(i)] = k[static_cast<size_t>(h * D + i)] / std::sqrt(ks + 1e-6);
        const double u = std::exp(static_cast<double>(w.A_log[static_cast<size_t>(h)])) *
                         (z[static_cast<size_t>(h * D + i)] + w.dt_bias[static_cast<size_t>(h * D + i)]);
        al[static_cast<size_t>(i)] = std::exp(d.gate_lb * Sig(u));
      }
      const double beta = Sig(b[static_cast<size_t>(h)]);
      double* Sh = S.data() + h * D * D;
      V u(static_cast<size_t>(D), 0.0), oh(static_cast<size_t>(D), 0.0);
      for (int64_t i = 0; i < D; ++i)
        for (int64_t j = 0; j < D; ++j) Sh[i * D + j] *= al[static_cast<size_t>(i)];
      for (int64_t i = 0; i < D; ++i)
        for (int64_t j = 0; j < D; ++j) u[static_cast<size_t>(j)] += kh[static_cast<size_t>(i)] * Sh[i * D + j];
      for (int64_t i = 0; i < D; ++i)
        for (int64_t j = 0; j < D; ++j)
          Sh[i * D + j] += kh[static_cast<size_t>(i)] * beta * (v[static_cast<size_t>(h * D + j)] - u[static_cast<size_t>(j)]);
      for (int64_t i = 0; i < D; ++i)
        for (int64_t j = 0; j < D; ++j) oh[static_cast<size_t>(j)] += qh[static_cast<size_t>(i)] * Sh[i * D + j];
      const V on = RmsNorm64(oh, w.o_norm, d.rms_eps);
      for (int64_t j = 0; j < D; ++j)
        o[static_cast<size_t>(h * D + j)] = on[static_cast<size_t>(j)] * Sig(g[static_cast<size_t>(h * D + j)]);
    }
    const V out = Mul(w.o_proj, o);
    want.insert(want.end(), out.begin(), out.end());
  }
  EXPECT_TRUE(Close("kda out", got, want));
  EXPECT_TRUE(Close("kda S", st.S, S));
}

TEST(Ref64, MlaOverAKvCacheAcrossTwoCalls) {
  const Dims d = RandomDims();
  RandomModel m(d, 12);
  const MlaWeights w = m.Layer(true, false).mla;
  const std::vector<float> x = m.Activations(kT * d.hidden);
  MlaCache cache = MlaCache::Make(d, kT);
  std::vector<float> got(x.size());
  ASSERT_TRUE(MlaLayer(w, d, x.data(), 2, &cache, got.data()).ok());  // prefill 2
  ASSERT_TRUE(MlaLayer(w, d, x.data() + 2 * d.hidden, kT - 2, &cache, got.data() + 2 * d.hidden).ok());

  const int64_t Hm = d.n_heads, nope = d.qk_nope, rope = d.qk_rope, vh = d.v_head, E = d.hidden;
  const int64_t qh = d.qk_head(), kvd = d.kv_head();
  std::vector<V> kvs, ropes;
  V want;
  for (int64_t t = 0; t < kT; ++t) {
    const V xt = Row(x, t, E);
    const V q = Mul(w.q_b_proj, RmsNorm64(Mul(w.q_a_proj, xt), w.q_a_layernorm, d.mla_latent_eps));
    const V c = Mul(w.kv_a_proj_with_mqa, xt);
    const V lat = RmsNorm64(V(c.begin(), c.begin() + d.kv_lora), w.kv_a_layernorm, d.mla_latent_eps);
    kvs.push_back(Mul(w.kv_b_proj, lat));
    ropes.emplace_back(c.begin() + d.kv_lora, c.end());
    const V g = Mul(w.g_proj, xt);
    V o(static_cast<size_t>(Hm * vh), 0.0);
    for (int64_t h = 0; h < Hm; ++h) {
      V sc(static_cast<size_t>(t + 1));
      for (int64_t s = 0; s <= t; ++s) {
        double acc = 0;
        for (int64_t i = 0; i < nope; ++i) acc += q[static_cast<size_t>(h * qh + i)] * kvs[static_cast<size_t>(s)][static_cast<size_t>(h * kvd + i)];
        for (int64_t i = 0; i < rope; ++i) acc += q[static_cast<size_t>(h * qh + nope + i)] * ropes[static_cast<size_t>(s)][static_cast<size_t>(i)];
        sc[static_cast<size_t>(s)] = acc / std::sqrt(static_cast<double>(qh));
      }
      const double mx = *std::max_element(sc.begin(), sc.end());
      double Z = 0;
      for (double& v : sc) Z += (v = std::exp(v - mx));
      for (int64_t s = 0; s <= t; ++s)
        for (int64_t j = 0; j < vh; ++j)
          o[static_cast<size_t>(h * vh + j)] += sc[static_cast<size_t>(s)] / Z * kvs[static_cast<size_t>(s)][static_cast<size_t>(h * kvd + nope + j)];
    }
    for (size_t i = 0; i < o.size(); ++i) o[i] *= Sig(g[i]);
    const V out = Mul(w.o_proj, o);
    want.insert(want.end(), out.begin(), out.end());
  }
  EXPECT_TRUE(Close("mla out", got, want));
}

TEST(Ref64, LatentMoeWithMxfp4Experts) {
  const Dims d = RandomDims();
  RandomModel m(d, 13);
  const MoeWeights w = m.Layer(false, false).moe;
  const std::vector<float> x = m.Activations(kT * d.hidden, 2.0f);
  std::vector<float> got(x.size());
  MoeStats stats;
  MoeBlock(w, m.Experts(), d, x.data(), kT, got.data(), &stats);

  const int64_t E = d.hidden, N = d.n_experts;
  V want;
  for (int64_t t = 0; t < kT; ++t) {
    const V xt = Row(x, t, E);
    const V logit = Mul(w.gate, xt);
    std::vector<int64_t> order(static_cast<size_t>(N));
    std::iota(order.begin(), order.end(), 0);
    auto c = [&](int64_t e) { return Sig(logit[static_cast<size_t>(e)]) + w.score_bias[static_cast<size_t>(e)]; };
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return c(a) > c(b); });
    double S = 0;
    for (int64_t j = 0; j < d.topk; ++j) S += Sig(logit[static_cast<size_t>(order[static_cast<size_t>(j)])]);
    const V z = Mul(w.down, xt);
    V acc(static_cast<size_t>(d.latent), 0.0);
    for (int64_t j = 0; j < d.topk; ++j) {
      const int64_t e = order[static_cast<size_t>(j)];
      const GluWeights& ew = *m.Experts()[static_cast<size_t>(e)];
      const V y = Mul(ew.down, Situ64(Mul(ew.gate, z), Mul(ew.up, z), d.situ_b1, d.situ_b2));
      const double wj = Sig(logit[static_cast<size_t>(e)]) / S * d.routed_scale;
      for (size_t i = 0; i < acc.size(); ++i) acc[i] += wj * y[i];
    }
    const V routed = Mul(w.up, RmsNorm64(acc, w.norm, d.rms_eps));
    const V shared = Mul(w.shared.down, Situ64(Mul(w.shared.gate, xt), Mul(w.shared.up, xt), d.situ_b1, d.situ_b2));
    for (int64_t i = 0; i < E; ++i) want.push_back(routed[static_cast<size_t>(i)] + shared[static_cast<size_t>(i)]);
  }
  EXPECT_TRUE(Close("moe out", got, want));
}

}  // namespace
}  // namespace k3::ops
