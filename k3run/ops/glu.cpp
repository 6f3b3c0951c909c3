#include "k3run/ops/glu.h"

#include <algorithm>
#include <vector>

#include "k3run/kernels/thread_pool.h"
#include "k3run/ops/activation.h"

namespace k3::ops {

void GluMlp(const GluWeights& w, float beta1, float beta2, const float* x, int64_t T, float* y) {
  if (T <= 0) return;
  const int64_t W = w.gate.rows;
  std::vector<float> g(static_cast<size_t>(T * W)), u(static_cast<size_t>(T * W));
  kernels::MatMul(w.gate, x, T, g.data());
  kernels::MatMul(w.up, x, T, u.data());
  // Elementwise, so chunks on the compute threads give the same bits; its tanh and sigmoid
  // calls cost about as much as the shared expert's matmuls.
  constexpr int64_t kChunk = 256;
  const int64_t n = T * W;
  kernels::ParallelChunks(kernels::Threads(), (n + kChunk - 1) / kChunk, [&](int64_t c) {
    const int64_t i0 = c * kChunk, len = std::min(kChunk, n - i0);
    SituGlu(g.data() + i0, u.data() + i0, len, beta1, beta2, g.data() + i0);
  });
  kernels::MatMul(w.down, g.data(), T, y);
}

}  // namespace k3::ops
