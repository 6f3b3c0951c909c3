#include "k3run/ops/router.h"

#include <algorithm>
#include <vector>

#include "k3run/kernels/thread_pool.h"
#include "k3run/ops/math.h"

namespace k3::ops {

namespace {

// logits[r] = Σ_i w[r][i]·x[i] in double, ascending i, one accumulator per row (MODEL.md §3.6):
// rows are independent, so eight are interleaved to hide the add latency and row blocks are
// spread over the compute threads; each row still sees exactly the same operations in the same
// order, so the result never depends on either.
template <typename Elem, typename Widen>
void RouterRows(const Elem* w, int64_t cols, const float* x, int64_t r0, int64_t r1,
                double* out, Widen widen) {
  constexpr int64_t kGroup = 8;
  int64_t r = r0;
  for (; r + kGroup <= r1; r += kGroup) {
    double acc[kGroup] = {};
    for (int64_t i = 0; i < cols; ++i) {
      const double xi = static_cast<double>(x[i]);
      for (int64_t g = 0; g < kGroup; ++g) {
        acc[g] += static_cast<double>(widen(w[(r + g) * cols + i])) * xi;
      }
    }
    for (int64_t g = 0; g < kGroup; ++g) out[r + g] = acc[g];
  }
  for (; r < r1; ++r) {
    double acc = 0.0;
    for (int64_t i = 0; i < cols; ++i) {
      acc += static_cast<double>(widen(w[r * cols + i])) * static_cast<double>(x[i]);
    }
    out[r] = acc;
  }
}

void RouterLogits(const Matrix& w, const float* x, double* out) {
  constexpr int64_t kRowsPerChunk = 64;
  const int64_t chunks = (w.rows + kRowsPerChunk - 1) / kRowsPerChunk;
  kernels::ParallelChunks(kernels::Threads(), chunks, [&](int64_t c) {
    const int64_t r0 = c * kRowsPerChunk, r1 = std::min(w.rows, r0 + kRowsPerChunk);
    if (w.type == kernels::WeightType::kBF16) {
      RouterRows(static_cast<const uint16_t*>(w.data), w.cols, x, r0, r1, out,
                 [](uint16_t v) { return kernels::Bf16ToF32(v); });
    } else {  // kF32 (ValidateLayerWeights refuses MXFP4 routers)
      RouterRows(static_cast<const float*>(w.data), w.cols, x, r0, r1, out,
                 [](float v) { return v; });
    }
  });
}

}  // namespace

void RouteToken(const Matrix& gate, const float* bias, const Dims& d, const float* x,
                int32_t* idx, float* weight) {
  const int64_t N = d.n_experts, k = d.topk;
  std::vector<float> s(static_cast<size_t>(N)), c(static_cast<size_t>(N));
  std::vector<bool> taken(static_cast<size_t>(N), false);
  std::vector<double> logits(static_cast<size_t>(N));
  RouterLogits(gate, x, logits.data());
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
