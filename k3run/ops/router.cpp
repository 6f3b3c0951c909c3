#include "k3run/ops/router.h"

#include <algorithm>
#include <vector>

#include "k3run/kernels/router_dot.h"
#include "k3run/ops/math.h"

namespace k3::ops {

void RouteToken(const Matrix& gate, const float* bias, const Dims& d, const float* x,
                int32_t* idx, float* weight) {
  const int64_t N = d.n_experts, k = d.topk;
  std::vector<float> s(static_cast<size_t>(N)), c(static_cast<size_t>(N));
  std::vector<bool> taken(static_cast<size_t>(N), false);
  std::vector<double> logits(static_cast<size_t>(N));
  // In double, ascending index per row (MODEL.md §3.6); every ISA path and thread count gives
  // the same bits (kernels/router_dot.h).
  kernels::RouterLogits(gate, x, logits.data());
  for (int64_t e = 0; e < N; ++e) {
    s[static_cast<size_t>(e)] = Sigmoid(static_cast<float>(logits[static_cast<size_t>(e)]));
    c[static_cast<size_t>(e)] = s[static_cast<size_t>(e)] + bias[e];
  }
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < N; ++e) {
      if (taken[static_cast<size_t>(e)]) continue;
      if (best < 0 || c[static_cast<size_t>(e)] > c[static_cast<size_t>(best)]) best = e;
    }
    taken[static_cast<size_t>(best)] = true;
    idx[j] = static_cast<int32_t>(best);
    weight[j] = s[static_cast<size_t>(best)];
  }
  if (d.moe_renorm && k > 1) {
    double S = 0.0;
    for (int64_t j = 0; j < k; ++j) S += static_cast<double>(weight[j]);
    const float inv = static_cast<float>(1.0 / (S + kRouterRenormEps));
    for (int64_t j = 0; j < k; ++j) weight[j] = weight[j] * inv;
  }
  for (int64_t j = 0; j < k; ++j) weight[j] = weight[j] * d.routed_scale;
}

}  // namespace k3::ops
