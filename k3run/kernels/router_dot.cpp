// Router logits over row groups and threads (see router_dot.h).
#include "k3run/kernels/router_dot.h"

#include <algorithm>

#include "k3run/kernels/thread_pool.h"

namespace k3::kernels {
namespace {

// Eight rows interleaved: independent accumulators hide the add latency; each row still sees
// exactly acc = acc + double(w)·double(x) in ascending i.
template <typename Elem, typename Widen>
void Rows(const Elem* w, int64_t cols, const float* x, int64_t r0, int64_t r1, double* out,
          Widen widen) {
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

void RouterRows(const Matrix& w, const float* x, double* out, int64_t r0, int64_t r1) {
  if (w.type == WeightType::kBF16) {
    Rows(static_cast<const uint16_t*>(w.data), w.cols, x, r0, r1, out,
         [](uint16_t v) { return Bf16ToF32(v); });
  } else {
    Rows(static_cast<const float*>(w.data), w.cols, x, r0, r1, out, [](float v) { return v; });
  }
}

}  // namespace

void RouterLogits(const Matrix& w, const float* x, double* out) {
  constexpr int64_t kRowsPerChunk = 64;
  const int64_t chunks = (w.rows + kRowsPerChunk - 1) / kRowsPerChunk;
  ParallelChunks(Threads(), chunks, [&](int64_t c) {
    const int64_t r0 = c * kRowsPerChunk, r1 = std::min(w.rows, r0 + kRowsPerChunk);
    RouterRows(w, x, out, r0, r1);
  });
}

}  // namespace k3::kernels
