#include "k3run/ops/router.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "k3run/kernels/router_dot.h"
#include "k3run/ops/math.h"
#include "k3run/ops/norm.h"

namespace k3::ops {

void RouteToken(const Matrix& gate, const float* bias, const Dims& d, const float* x,
                int32_t* idx, float* weight) {
  std::vector<double> logits(static_cast<size_t>(d.n_experts));
  // In double, ascending index per row (MODEL.md §3.6); every ISA path and thread count gives
  // the same bits (kernels/router_dot.h).
  kernels::RouterLogits(gate, x, logits.data());
  SelectExperts(logits.data(), bias, d, idx, weight);
}

namespace {

// The top k of c by (value descending, index ascending), appended in that order: the first k of
// the stable sort, what the scan below picks when no c is NaN. One compare rejects most experts
// (k ≪ N), where the scan made k passes over all N.
void TopKNoNaN(const std::vector<float>& c, int64_t k, int32_t* idx) {
  if (k <= 0) return;
  int64_t n = 0;  // idx[0, n) sorted
  for (int64_t e = 0; e < static_cast<int64_t>(c.size()); ++e) {
    const float v = c[static_cast<size_t>(e)];
    if (n == k && !(v > c[static_cast<size_t>(idx[k - 1])])) continue;
    // e after every kept expert with c >= v: those have lower indices and win ties
    int64_t at = n < k ? n : k - 1;
    while (at > 0 && c[static_cast<size_t>(idx[at - 1])] < v) {
      idx[at] = idx[at - 1];
      --at;
    }
    idx[at] = static_cast<int32_t>(e);
    if (n < k) ++n;
  }
}

}  // namespace

K3_ELEMENTWISE_CLONES void RouterScores(const double* logits, const float* bias, int64_t n,
                                        float* s, float* c) {
  for (int64_t e = 0; e < n; ++e) {
    s[e] = Sigmoid(static_cast<float>(logits[e]));
    c[e] = s[e] + bias[e];
  }
}

void SelectExperts(const double* logits, const float* bias, const Dims& d, int32_t* idx,
                   float* weight) {
  const int64_t N = d.n_experts, k = d.topk;
  std::vector<float> s(static_cast<size_t>(N)), c(static_cast<size_t>(N));
  RouterScores(logits, bias, N, s.data(), c.data());
  const bool any_nan = std::any_of(c.begin(), c.end(), [](float v) { return std::isnan(v); });
  if (!any_nan) {
    TopKNoNaN(c, k, idx);
  } else {
    // k passes, each taking the first untaken expert no later one beats: a NaN it starts on
    // stays (nothing compares greater), the order the reference's scan gives garbage input.
    std::vector<bool> taken(static_cast<size_t>(N), false);
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < N; ++e) {
        if (taken[static_cast<size_t>(e)]) continue;
        if (best < 0 || c[static_cast<size_t>(e)] > c[static_cast<size_t>(best)]) best = e;
      }
      taken[static_cast<size_t>(best)] = true;
      idx[j] = static_cast<int32_t>(best);
    }
  }
  for (int64_t j = 0; j < k; ++j) weight[j] = s[static_cast<size_t>(idx[j])];
  if (d.moe_renorm && k > 1) {
    double S = 0.0;
    for (int64_t j = 0; j < k; ++j) S += static_cast<double>(weight[j]);
    const float inv = static_cast<float>(1.0 / (S + kRouterRenormEps));
    for (int64_t j = 0; j < k; ++j) weight[j] = weight[j] * inv;
  }
  for (int64_t j = 0; j < k; ++j) weight[j] = weight[j] * d.routed_scale;
}

std::vector<int32_t> GuessExperts(const LayerWeights& next, const Dims& d, const float* h,
                                  int64_t T, int64_t count) {
  count = std::min(count, d.n_experts);
  if (next.is_dense || count <= 0 || T <= 0) return {};
  T = std::min(T, count);
  Dims ranked_dims = d;
  ranked_dims.topk = count;
  std::vector<float> x(static_cast<size_t>(d.hidden));
  std::vector<int32_t> ranked(static_cast<size_t>(T * count));
  std::vector<float> weight(static_cast<size_t>(count));
  for (int64_t t = 0; t < T; ++t) {
    RmsNorm(h + t * d.hidden, next.post_attention_layernorm.data(), d.hidden, d.rms_eps, x.data());
    RouteToken(next.moe.gate, next.moe.score_bias.data(), ranked_dims, x.data(),
               ranked.data() + t * count, weight.data());
  }
  std::vector<int32_t> guesses;
  std::vector<char> seen(static_cast<size_t>(d.n_experts), 0);
  for (int64_t j = 0; j < count; ++j) {
    for (int64_t t = 0; t < T; ++t) {
      const int32_t e = ranked[static_cast<size_t>(t * count + j)];
      if (seen[static_cast<size_t>(e)]) continue;
      seen[static_cast<size_t>(e)] = 1;
      guesses.push_back(e);
    }
  }
  return guesses;
}

}  // namespace k3::ops
