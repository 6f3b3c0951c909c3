#include "tests/support/yardsticks.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/sysinfo.h"
#include "k3run/kernels/thread_pool.h"

namespace k3::testing {
namespace {

using kernels::Isa;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Keeps results alive without a benchmark library: the sinks are written, never read.
volatile uint64_t g_read_sink = 0;
volatile float g_fma_sink = 0;

// m and c come from outside (volatile) so nothing folds; |m| < 1 keeps the values finite and
// normal.
volatile float g_m = 0.9999f;
volatile float g_c = 1e-4f;
constexpr int64_t kFmaIters = int64_t{1} << 18;

// Independent FMA chains per path: at least latency × pipes on current cores, within the
// register file (avx2: 12 + 2 of 16 ymm; avx512: 16 + 2 of 32 zmm).
constexpr int kScalarChains = 16;
constexpr int kAvx2Chains = 12;
constexpr int kAvx512Chains = 16;

float FmaChainsScalar(int64_t iters, float m, float c) {
  float a[kScalarChains];
  for (int k = 0; k < kScalarChains; ++k) a[k] = 0.001f * static_cast<float>(k);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < kScalarChains; ++k) a[k] = std::fmaf(a[k], m, c);
  }
  float s = 0;
  for (float v : a) s += v;
  return s;
}

__attribute__((target("avx2,fma"))) float FmaChainsAvx2(int64_t iters, float m, float c) {
  constexpr int kChains = kAvx2Chains;
  __m256 a[kChains];
  for (int k = 0; k < kChains; ++k) a[k] = _mm256_set1_ps(0.001f * static_cast<float>(k));
  const __m256 mv = _mm256_set1_ps(m), cv = _mm256_set1_ps(c);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < kChains; ++k) a[k] = _mm256_fmadd_ps(a[k], mv, cv);
  }
  for (int k = 1; k < kChains; ++k) a[0] = _mm256_add_ps(a[0], a[k]);
  return _mm256_cvtss_f32(a[0]);
}

__attribute__((target("avx512f"))) float FmaChainsAvx512(int64_t iters, float m, float c) {
  constexpr int kChains = kAvx512Chains;
  __m512 a[kChains];
  for (int k = 0; k < kChains; ++k) a[k] = _mm512_set1_ps(0.001f * static_cast<float>(k));
  const __m512 mv = _mm512_set1_ps(m), cv = _mm512_set1_ps(c);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < kChains; ++k) a[k] = _mm512_fmadd_ps(a[k], mv, cv);
  }
  for (int k = 1; k < kChains; ++k) a[0] = _mm512_add_ps(a[0], a[k]);
  return _mm512_cvtss_f32(a[0]);
}

// Lane-FMAs one chain call of `isa` performs.
double LaneFmasPerCall(Isa isa, int64_t iters) {
  const double lanes = isa == Isa::kScalar ? kScalarChains
                       : isa == Isa::kAvx2 ? kAvx2Chains * 8.0
                                           : kAvx512Chains * 16.0;
  return lanes * static_cast<double>(iters);
}

float FmaChains(Isa isa, int64_t iters, float m, float c) {
  switch (isa) {
    case Isa::kScalar: return FmaChainsScalar(iters, m, c);
    case Isa::kAvx2: return FmaChainsAvx2(iters, m, c);
    case Isa::kAvx512: return FmaChainsAvx512(iters, m, c);
  }
  return 0;
}

// Best of `passes` timed runs of pass() after a warm-up (worker start, TLB), as work ÷ seconds.
template <class Pass>
double BestRate(int passes, double work, Pass pass) {
  pass();
  double best = 0;
  for (int p = 0; p < passes; ++p) {
    const auto t0 = Clock::now();
    pass();
    best = std::max(best, work / Since(t0));
  }
  return best;
}

}  // namespace

double ReadGBs(const std::vector<uint64_t>& mem, int threads, int passes) {
  const int64_t n = static_cast<int64_t>(mem.size()) / 16;  // 128-byte steps
  const int64_t chunks = 16 * threads;
  std::vector<uint64_t> part(static_cast<size_t>(chunks));
  const __m128i* base = reinterpret_cast<const __m128i*>(mem.data());
  const double gb = static_cast<double>(mem.size() * 8) / 1e9;
  const double rate = BestRate(passes, gb, [&] {
    kernels::ParallelChunks(threads, chunks, [&](int64_t c) {
      __m128i a[8];
      for (__m128i& v : a) v = _mm_setzero_si128();
      for (int64_t i = n * c / chunks; i < n * (c + 1) / chunks; ++i) {
        const __m128i* q = base + 8 * i;
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) a[k] = _mm_xor_si128(a[k], _mm_load_si128(q + k));
      }
      for (int k = 1; k < 8; ++k) a[0] = _mm_xor_si128(a[0], a[k]);
      part[static_cast<size_t>(c)] = static_cast<uint64_t>(_mm_cvtsi128_si64(a[0]));
    });
  });
  uint64_t sink = 0;
  for (uint64_t v : part) sink ^= v;
  g_read_sink = sink;
  return rate;
}

double FmaPeakG(Isa isa, int threads, int passes) {
  // The scalar chains are libm calls, ~10× slower per lane: fewer of them per chunk.
  const int64_t iters = isa == Isa::kScalar ? kFmaIters / 8 : kFmaIters;
  const int64_t chunks = 4 * threads;
  std::vector<float> part(static_cast<size_t>(chunks));
  const float m = g_m, c = g_c;
  const double g = static_cast<double>(chunks) * LaneFmasPerCall(isa, iters) / 1e9;
  const double rate = BestRate(passes, g, [&] {
    kernels::ParallelChunks(threads, chunks, [&](int64_t k) {
      part[static_cast<size_t>(k)] = FmaChains(isa, iters, m, c);
    });
  });
  float sink = 0;
  for (float v : part) sink += v;
  g_fma_sink = sink;
  return rate;
}

Result<std::vector<Isa>> ParseIsaList(const std::string& list) {
  std::vector<Isa> isas;
  const std::string items = list + ",";
  for (size_t p = 0, q; (q = items.find(',', p)) != std::string::npos; p = q + 1) {
    K3_ASSIGN_OR_RETURN(Isa isa, kernels::ResolveIsaRequest(items.substr(p, q - p), DetectCpu()));
    isas.push_back(isa);
  }
  return isas;
}

}  // namespace k3::testing
