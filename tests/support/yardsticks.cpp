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

// The avx512 MXFP4 kernel's arithmetic for 16 weights (k3run/kernels/matmul_avx512.cpp,
// Mxfp4Rows::Load and Tile): a variable shift that brings each lane's nibble to its low bits, a
// permutexvar into the group's 16-entry fp32 table, one FMA. The packed words, the table and x
// stay in registers, so nothing here waits on a load; each chain's words feed its next shift.
constexpr int kDecodeChains = 12;

// GCC 12's permutexvar builds its "don't care" operand as `__m512 __Y = __Y;`, which
// -Wuninitialized reports (as in matmul_avx512.cpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"))) float DecodeChainsAvx512(int64_t iters, float m) {
  const __m512i shift =
      _mm512_setr_epi32(0, 0, 4, 4, 8, 8, 12, 12, 16, 16, 20, 20, 24, 24, 28, 28);
  const __m512 table = _mm512_setr_ps(0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -.5f, -1.f,
                                      -1.5f, -2.f, -3.f, -4.f, -6.f);
  const __m512 xv = _mm512_set1_ps(m);
  __m512i q[kDecodeChains];
  __m512 acc[kDecodeChains];
  for (int k = 0; k < kDecodeChains; ++k) {
    q[k] = _mm512_set1_epi64(static_cast<int64_t>(0x0123456789ABCDEFull * (k + 1)));
    acc[k] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < kDecodeChains; ++k) {
      q[k] = _mm512_srlv_epi32(q[k], shift);
      acc[k] = _mm512_fmadd_ps(_mm512_permutexvar_ps(q[k], table), xv, acc[k]);
    }
  }
  for (int k = 1; k < kDecodeChains; ++k) acc[0] = _mm512_add_ps(acc[0], acc[k]);
  return _mm512_cvtss_f32(acc[0]);
}
#pragma GCC diagnostic pop

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

// Best rate of `threads` threads running chain() in 4 chunks each, `work` units per call; the
// chains' results go to a sink so nothing folds.
template <class Chain>
double ChainsRate(int threads, int passes, double work, Chain chain) {
  const int64_t chunks = 4 * threads;
  std::vector<float> part(static_cast<size_t>(chunks));
  const double rate = BestRate(passes, static_cast<double>(chunks) * work, [&] {
    kernels::ParallelChunks(threads, chunks,
                            [&](int64_t k) { part[static_cast<size_t>(k)] = chain(); });
  });
  float sink = 0;
  for (float v : part) sink += v;
  g_fma_sink = sink;
  return rate;
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
  const float m = g_m, c = g_c;
  return ChainsRate(threads, passes, LaneFmasPerCall(isa, iters) / 1e9,
                    [&] { return FmaChains(isa, iters, m, c); });
}

double Mxfp4DecodePeakGBs(int threads, int passes) {
  const float m = g_m;
  // 16 weights a step: 8 packed bytes and half a scale byte (WeightBytes counts both).
  return ChainsRate(threads, passes, kDecodeChains * 8.5 * static_cast<double>(kFmaIters) / 1e9,
                    [&] { return DecodeChainsAvx512(kFmaIters, m); });
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
