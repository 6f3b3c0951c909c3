// One MLA layer at the released dims (H 96, nope 128, rope 64, v 128, kv_lora 512, q_lora 1536,
// hidden 7168), decoding one token after N cached positions: the latent path (k3run/ops/mla.h,
// the only MLA path) against the expanded-cache path it replaced (kept here, verbatim in its
// arithmetic, as the yardstick), same run, same weights. Prints ms per token, the cache bytes a
// token reads, and the ratios (DESIGN.md §11.2: latent does 3.4× the attention arithmetic per
// position and reads 43× fewer cache bytes).
//   build/tests/k3run/ops/k3_bench_mla [positions...]   (default 512 4096 32768)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "k3run/kernels/matmul.h"
#include "k3run/ops/math.h"
#include "k3run/ops/mla.h"
#include "k3run/ops/norm.h"
#include "tests/k3run/ops/random_model.h"

namespace k3::ops {
namespace {

Dims ReleasedMla() {
  Dims d;
  d.hidden = 7168;
  d.n_heads = 96;
  d.q_lora = 1536;
  d.kv_lora = 512;
  d.qk_nope = 128;
  d.qk_rope = 64;
  d.v_head = 128;
  d.dense_inter = 16;  // the layer's FFN is not run here
  return d;
}

// The previous path: the cache holds every head's expanded k_nope ‖ v and the rope key.
struct ExpandedCache {
  int64_t len = 0;
  std::vector<float> kv, rope_k;
};

void ExpandedMla(const MlaWeights& w, const Dims& d, const float* x, ExpandedCache* cache,
                 float* out) {
  const int64_t Hm = d.n_heads, nope = d.qk_nope, rope = d.qk_rope, vh = d.v_head;
  const int64_t qh = d.qk_head(), kvd = d.kv_head(), kvl = d.kv_lora;
  std::vector<float> qa(size_t(d.q_lora)), q(size_t(Hm * qh)), c(size_t(kvl + rope)),
      latent = std::vector<float>(size_t(kvl));
  kernels::MatMul(w.q_a_proj, x, 1, qa.data());
  RmsNorm(qa.data(), w.q_a_layernorm.data(), d.q_lora, d.mla_latent_eps, qa.data());
  kernels::MatMul(w.q_b_proj, qa.data(), 1, q.data());
  kernels::MatMul(w.kv_a_proj_with_mqa, x, 1, c.data());
  RmsNorm(c.data(), w.kv_a_layernorm.data(), kvl, d.mla_latent_eps, latent.data());
  const int64_t p = cache->len;
  kernels::MatMul(w.kv_b_proj, latent.data(), 1, cache->kv.data() + p * Hm * kvd);
  std::copy(c.begin() + kvl, c.end(), cache->rope_k.begin() + p * rope);
  cache->len = p + 1;
  const float scale = 1.0f / std::sqrt(static_cast<float>(qh));
  std::vector<float> o(size_t(Hm * vh)), score(size_t(p + 1));
  for (int64_t h = 0; h < Hm; ++h) {
    const float* qv = q.data() + h * qh;
    for (int64_t s = 0; s <= p; ++s) {
      const float* kn = cache->kv.data() + (s * Hm + h) * kvd;
      const float* kr = cache->rope_k.data() + s * rope;
      double acc = 0.0;
      for (int64_t i = 0; i < nope; ++i) acc += double(qv[i]) * double(kn[i]);
      for (int64_t i = 0; i < rope; ++i) acc += double(qv[nope + i]) * double(kr[i]);
      score[size_t(s)] = static_cast<float>(acc) * scale;
    }
    Softmax(score.data(), p + 1, score.data());
    float* oh = o.data() + h * vh;
    for (int64_t s = 0; s <= p; ++s) {
      const float* vs = cache->kv.data() + (s * Hm + h) * kvd + nope;
      for (int64_t j = 0; j < vh; ++j) oh[j] += score[size_t(s)] * vs[j];
    }
  }
  std::vector<float> gate(size_t(Hm * vh));
  kernels::MatMul(w.g_proj, x, 1, gate.data());
  for (size_t i = 0; i < o.size(); ++i) o[i] = o[i] * Sigmoid(gate[i]);
  kernels::MatMul(w.o_proj, o.data(), 1, out);
}

template <typename F>
double BestSeconds(int reps, F f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

void Row(const MlaWeights& w, const Dims& d, int64_t n, const std::vector<float>& x,
         std::mt19937* rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  MlaCache latent = MlaCache::Make(d, n + 1);
  for (float& v : latent.data) v = g(*rng);
  ExpandedCache expanded;
  expanded.kv.resize(size_t((n + 1) * d.n_heads * d.kv_head()));
  expanded.rope_k.resize(size_t((n + 1) * d.qk_rope));
  for (float& v : expanded.kv) v = g(*rng) * 0.05f;
  for (float& v : expanded.rope_k) v = g(*rng);
  std::vector<float> out(size_t(d.hidden));
  const int reps = n >= 32768 ? 2 : 4;
  const double tl = BestSeconds(reps, [&] {
    latent.len = n;
    (void)MlaLayer(w, d, x.data(), 1, &latent, out.data());
  });
  const double te = BestSeconds(reps, [&] {
    expanded.len = n;
    ExpandedMla(w, d, x.data(), &expanded, out.data());
  });
  const double lb = double(n + 1) * double(d.kv_lora + d.qk_rope) * 4;
  const double eb = double(n + 1) * (double(d.n_heads * d.kv_head()) + double(d.qk_rope)) * 4;
  std::printf("%8lld | %10.2f | %12.2f | %6.2f | %10.1f | %12.1f | %5.1f\n",
              static_cast<long long>(n), tl * 1e3, te * 1e3, tl / te, lb / 1e6, eb / 1e6, eb / lb);
}

}  // namespace
}  // namespace k3::ops

int main(int argc, char** argv) {
  using namespace k3::ops;
  std::vector<int64_t> positions;
  for (int i = 1; i < argc; ++i) positions.push_back(std::atoll(argv[i]));
  if (positions.empty()) positions = {512, 4096, 32768};
  const Dims d = ReleasedMla();
  testing::RandomModel m(d);
  const LayerWeights w = m.Layer(true, true);
  const std::vector<float> x = m.Activations(d.hidden);
  std::mt19937 rng(11);
  std::printf("one MLA layer at released dims, decode of 1 token, %s, %d threads\n",
              k3::kernels::IsaName(k3::kernels::ActiveIsa()), k3::kernels::Threads());
  std::printf("cached N | latent ms | expanded ms | ratio | latent MB | expanded MB | bytes ÷\n");
  for (int64_t n : positions) Row(w.mla, d, n, x, &rng);
  return 0;
}
