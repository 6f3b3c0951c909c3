// Router logits: the scalar body and the dispatch over ISAs and threads (see router_dot.h).
#include "k3run/kernels/router_dot.h"

#include <algorithm>

#include "k3run/kernels/kernels_internal.h"
#include "k3run/kernels/thread_pool.h"

namespace k3::kernels {
namespace internal {
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

}  // namespace

void RouterRowsScalar(const Matrix& w, const float* x, int64_t T, double* out, int64_t r0,
                      int64_t r1) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * w.cols;
    double* ot = out + t * w.rows;
    if (w.type == WeightType::kBF16) {
      Rows(static_cast<const uint16_t*>(w.data), w.cols, xt, r0, r1, ot,
           [](uint16_t v) { return Bf16ToF32(v); });
    } else {
      Rows(static_cast<const float*>(w.data), w.cols, xt, r0, r1, ot, [](float v) { return v; });
    }
  }
}

}  // namespace internal

namespace {

internal::RouterRowsFn RouterRowsFor(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return internal::RouterRowsAvx512;
    case Isa::kAvx2:
      return internal::RouterRowsAvx2;
    case Isa::kScalar:
      break;
  }
  return internal::RouterRowsScalar;
}

}  // namespace

void RouterLogits(const Matrix& w, const float* x, double* out) {
  RouterLogitsRows(w, x, 1, out);
}

void RouterLogitsRows(const Matrix& w, const float* x, int64_t T, double* out) {
  if (T <= 0) return;
  const internal::RouterRowsFn rows_fn = RouterRowsFor(ActiveIsa());
  // A multiple of every body's row group (AVX-512 and AVX2: 16, scalar: 8), so a chunk is
  // whole groups and the split over threads is the single-thread split cut at group borders.
  constexpr int64_t kRowsPerChunk = 64;
  const int64_t chunks = (w.rows + kRowsPerChunk - 1) / kRowsPerChunk;
  // A chunk's activation rows in blocks that stay in L2 while its rows read them (MatMul's
  // cache tiles, kernels_internal.h): each sum is still whole in one body call, same bits.
  const int64_t tb = internal::ActivationBlockRows(w.cols);
  ParallelChunks(Threads(), chunks, [&](int64_t c) {
    const int64_t r0 = c * kRowsPerChunk, r1 = std::min(w.rows, r0 + kRowsPerChunk);
    for (int64_t t = 0; t < T; t += tb) {
      rows_fn(w, x + t * w.cols, std::min(tb, T - t), out + t * w.rows, r0, r1);
    }
  });
}

void RouterLogitsOnThisThread(const Matrix& w, const float* x, int64_t T, double* out) {
  if (T <= 0) return;
  RouterRowsFor(ActiveIsa())(w, x, T, out, 0, w.rows);
}

}  // namespace k3::kernels
