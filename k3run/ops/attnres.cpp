#include "k3run/ops/attnres.h"

#include <cmath>
#include <vector>

#include "k3run/ops/math.h"
#include "k3run/ops/mla.h"  // Softmax

namespace k3::ops {

void FoldAttnRes(const float* norm, const float* proj, int64_t E, float* fold) {
  for (int64_t i = 0; i < E; ++i) fold[i] = norm[i] * proj[i];
}

namespace {

// The double sums of AttnRes are serial chains (ascending i, one add each), so one sum runs at
// the add's latency. These bodies advance N independent sums together, each in its own order,
// so their adds overlap: the same operations per sum as one at a time, the same bits.
constexpr int kChains = 8;

// ss[k] = Σ_i double(s_k[i])·double(s_k[i])
template <int N>
void SquaresOf(const float* const* s, int64_t E, double* ss) {
  double acc[N];
  for (int k = 0; k < N; ++k) acc[k] = 0.0;
  for (int64_t i = 0; i < E; ++i) {
#pragma GCC unroll 8
    for (int k = 0; k < N; ++k) {
      const double v = static_cast<double>(s[k][i]);
      acc[k] += v * v;
    }
  }
  for (int k = 0; k < N; ++k) ss[k] = acc[k];
}

// dot[k] = Σ_i double(fp32(s_k[i]·inv_k))·double(fold_i)
template <int N>
void FoldedDotsOf(const float* const* s, const float* inv, const float* fold, int64_t E,
                  double* dot) {
  double acc[N];
  for (int k = 0; k < N; ++k) acc[k] = 0.0;
  for (int64_t i = 0; i < E; ++i) {
    const double f = static_cast<double>(fold[i]);
#pragma GCC unroll 8
    for (int k = 0; k < N; ++k) acc[k] += static_cast<double>(s[k][i] * inv[k]) * f;
  }
  for (int k = 0; k < N; ++k) dot[k] = acc[k];
}

template <int N>
void Group(const float* const* s, const float* inv, const float* fold, int64_t E, double* out) {
  if (inv == nullptr) {
    SquaresOf<N>(s, E, out);
  } else {
    FoldedDotsOf<N>(s, inv, fold, E, out);
  }
}

// n sums, kChains at a time: squares when inv is null, folded dots otherwise.
void Sums(const float* const* s, int64_t n, const float* inv, const float* fold, int64_t E,
          double* out) {
  using Body = void (*)(const float* const*, const float*, const float*, int64_t, double*);
  static constexpr Body kBodies[kChains] = {Group<1>, Group<2>, Group<3>, Group<4>,
                                            Group<5>, Group<6>, Group<7>, Group<8>};
  for (int64_t k = 0; k < n; k += kChains) {
    const int64_t g = n - k < kChains ? n - k : kChains;
    kBodies[g - 1](s + k, inv == nullptr ? nullptr : inv + k, fold, E, out + k);
  }
}

}  // namespace

K3_ELEMENTWISE_CLONES void AttnResRows(const float* const* sources, int64_t R, int64_t m,
                                       const float* fold, int64_t E, float eps,
                                       float* const* out) {
  const int64_t n = R * m;
  std::vector<double> sum(static_cast<size_t>(n));
  std::vector<float> inv(static_cast<size_t>(n)), p(static_cast<size_t>(n));
  Sums(sources, n, nullptr, fold, E, sum.data());
  for (int64_t k = 0; k < n; ++k) {
    inv[static_cast<size_t>(k)] = static_cast<float>(
        1.0 / std::sqrt(sum[static_cast<size_t>(k)] / static_cast<double>(E) +
                        static_cast<double>(eps)));
  }
  Sums(sources, n, inv.data(), fold, E, sum.data());
  for (int64_t k = 0; k < n; ++k) p[static_cast<size_t>(k)] = static_cast<float>(sum[static_cast<size_t>(k)]);
  for (int64_t r = 0; r < R; ++r) {
    float* pr = p.data() + r * m;
    Softmax(pr, m, pr);
    float* o = out[r];
    for (int64_t i = 0; i < E; ++i) o[i] = 0.0f;
    for (int64_t k = 0; k < m; ++k) {
      const float pk = pr[k];
      const float* s = sources[r * m + k];
      for (int64_t i = 0; i < E; ++i) o[i] += pk * s[i];
    }
  }
}

void AttnRes(const float* const* sources, int64_t m, const float* fold, int64_t E, float eps,
             float* out) {
  AttnResRows(sources, 1, m, fold, E, eps, &out);
}

}  // namespace k3::ops
