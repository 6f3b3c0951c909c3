// k3_bench_vision: the vision tower + projector at released dims on one image, against its FLOP
// floor at this machine's measured FMA peak (docs/PERFORMANCE.md "Vision tower").
//
//   k3_bench_vision [--width 1024 --height 768 | --grid GHxGW] [--layers N] [--threads N]
//                   [--reps N]
//
// The grid follows the preprocessing rule (spec/VISION-AND-TOOLS.md): s = min(1,
// sqrt(65536 / (max(1, w//14)·max(1, h//14))), 7168/w, 7168/h), new side = min(max(1,
// floor(side·s)), 7168), padded up to a multiple of 28 px: 1024×768 → 1036×784 px → 56×74 patches.
// Weights are random bf16 (the release's dtype), patches random in [−1, 1].
// Work counted: 2 FLOPs per weight per row that passes it (patch embed and blocks: n rows;
// projector: n/4 rows) + attention 4·n²·qkv per layer (QKᵀ and P·V); not counted: softmax exps,
// norms, GELUs, RoPE. Yardsticks, measured in the same run on the same threads:
//   FMA peak: independent FMA chains in registers of the active path (as k3_bench_kernels),
//   MatMul peak: kernels::MatMul on an L2-resident 1536×1024 bf16 matrix, T = 64.
#include <immintrin.h>

#include <algorithm>
#include <time.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "k3run/kernels/matmul.h"
#include "k3run/kernels/thread_pool.h"
#include "k3run/vision/vision_tower.h"

namespace k3::vision {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// CPU seconds of the whole process (all threads): on a shared machine the wall time also counts
// the time other programs held the cores; the CPU time does not (a thread spinning while it
// waits for another is counted, which only makes the per-CPU-second rate lower).
double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// ---- yardsticks ----

float FmaChainsScalar(int64_t iters, float m, float c) {
  float a[16];
  for (int k = 0; k < 16; ++k) a[k] = 0.001f * static_cast<float>(k);
  for (int64_t i = 0; i < iters; ++i) {
    for (int k = 0; k < 16; ++k) a[k] = std::fmaf(a[k], m, c);
  }
  float s = 0;
  for (float v : a) s += v;
  return s;
}

__attribute__((target("avx2,fma"))) float FmaChainsAvx2(int64_t iters, float m, float c) {
  __m256 a[12];
  for (int k = 0; k < 12; ++k) a[k] = _mm256_set1_ps(0.001f * static_cast<float>(k));
  const __m256 mv = _mm256_set1_ps(m), cv = _mm256_set1_ps(c);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < 12; ++k) a[k] = _mm256_fmadd_ps(a[k], mv, cv);
  }
  for (int k = 1; k < 12; ++k) a[0] = _mm256_add_ps(a[0], a[k]);
  return _mm256_cvtss_f32(a[0]);
}

__attribute__((target("avx512f"))) float FmaChainsAvx512(int64_t iters, float m, float c) {
  __m512 a[16];
  for (int k = 0; k < 16; ++k) a[k] = _mm512_set1_ps(0.001f * static_cast<float>(k));
  const __m512 mv = _mm512_set1_ps(m), cv = _mm512_set1_ps(c);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) a[k] = _mm512_fmadd_ps(a[k], mv, cv);
  }
  for (int k = 1; k < 16; ++k) a[0] = _mm512_add_ps(a[0], a[k]);
  return _mm512_cvtss_f32(a[0]);
}

// A rate measured two ways: by wall time, and by CPU time scaled to `threads` busy threads (what
// the wall rate would be if no other program shared the cores).
struct Rate {
  double wall = 0, cpu = 0;
};

// GFLOP/s (2 per lane-FMA) of the active path's FMA chains on `threads` threads, best of 5.
Rate FmaPeakGflops(int threads) {
  const kernels::Isa isa = kernels::ActiveIsa();
  const int64_t iters = isa == kernels::Isa::kScalar ? 2'000'000 : 20'000'000;
  const double lanes = isa == kernels::Isa::kAvx512 ? 256 : isa == kernels::Isa::kAvx2 ? 96 : 16;
  const int64_t chunks = 4 * threads;
  std::vector<float> sink(static_cast<size_t>(chunks));
  volatile float m = 0.999f, c = 0.001f;
  Rate best;
  for (int pass = 0; pass < 5; ++pass) {
    const auto t0 = Clock::now();
    const double c0 = ProcessCpuSeconds();
    kernels::ParallelChunks(threads, chunks, [&](int64_t k) {
      float r = 0;
      switch (isa) {
        case kernels::Isa::kAvx512: r = FmaChainsAvx512(iters, m, c); break;
        case kernels::Isa::kAvx2: r = FmaChainsAvx2(iters, m, c); break;
        case kernels::Isa::kScalar: r = FmaChainsScalar(iters, m, c); break;
      }
      sink[static_cast<size_t>(k)] = r;
    });
    const double work = 2.0 * lanes * static_cast<double>(iters * chunks) / 1e9;
    best.wall = std::max(best.wall, work / Since(t0));
    best.cpu = std::max(best.cpu, work / (ProcessCpuSeconds() - c0) * threads);
  }
  float s = 0;
  for (float v : sink) s += v;
  if (s == 12345.0f) std::printf(" ");
  return best;
}

uint64_t g_state = 0x9E3779B97F4A7C15ull;
uint64_t Next() {
  g_state ^= g_state << 13;
  g_state ^= g_state >> 7;
  g_state ^= g_state << 17;
  return g_state;
}
// Uniform in ±a, as bf16 bits.
void FillBf16(std::vector<uint16_t>& v, float a) {
  for (uint16_t& b : v) {
    const float u = static_cast<float>(Next() >> 40) / static_cast<float>(1 << 24);
    b = kernels::F32ToBf16RoundNearestEven((2.0f * u - 1.0f) * a);
  }
}

Rate MatMulPeakGflops(int threads) {
  const int64_t rows = 1536, cols = 1024, T = 64;
  std::vector<uint16_t> w(static_cast<size_t>(rows * cols));
  FillBf16(w, 0.05f);
  std::vector<float> x(static_cast<size_t>(T * cols), 0.5f), y(static_cast<size_t>(T * rows));
  const kernels::Matrix m{kernels::WeightType::kBF16, rows, cols, w.data(), nullptr};
  kernels::MatMul(m, x.data(), T, y.data());
  Rate best;
  for (int pass = 0; pass < 5; ++pass) {
    const auto t0 = Clock::now();
    const double c0 = ProcessCpuSeconds();
    for (int r = 0; r < 10; ++r) kernels::MatMul(m, x.data(), T, y.data());
    const double work = 10.0 * 2.0 * static_cast<double>(rows * cols * T) / 1e9;
    best.wall = std::max(best.wall, work / Since(t0));
    best.cpu = std::max(best.cpu, work / (ProcessCpuSeconds() - c0) * threads);
  }
  return best;
}

// ---- the grid of an image ----

void GridFor(int64_t w, int64_t h, int* gh, int* gw) {
  const double s = std::min({1.0,
                             std::sqrt(65536.0 / static_cast<double>(std::max<int64_t>(1, w / 14) *
                                                                     std::max<int64_t>(1, h / 14))),
                             7168.0 / static_cast<double>(w), 7168.0 / static_cast<double>(h)});
  const int64_t nw = std::min<int64_t>(
      std::max<int64_t>(1, static_cast<int64_t>(std::floor(static_cast<double>(w) * s))), 7168);
  const int64_t nh = std::min<int64_t>(
      std::max<int64_t>(1, static_cast<int64_t>(std::floor(static_cast<double>(h) * s))), 7168);
  *gw = static_cast<int>((nw + 27) / 28 * 2);
  *gh = static_cast<int>((nh + 27) / 28 * 2);
}

int Main(int argc, char** argv) {
  int64_t width = 1024, height = 768;
  int gh = 0, gw = 0, reps = 1, threads = kernels::Threads();
  VisionDims d = VisionDims::Released();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--width") width = std::atoll(v);
    else if (a == "--height") height = std::atoll(v);
    else if (a == "--grid") std::sscanf(v, "%dx%d", &gh, &gw);
    else if (a == "--layers") d.layers = std::atoll(v);
    else if (a == "--threads") threads = std::atoi(v);
    else if (a == "--reps") reps = std::atoi(v);
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (gh == 0) GridFor(width, height, &gh, &gw);
  kernels::SetThreads(threads);
  const int64_t n = int64_t{gh} * gw, H = d.hidden, Q = d.qkv(), M = d.merged();

  // Random bf16 weights, one allocation per tensor kind; norms 1.
  auto mat = [](int64_t rows, int64_t cols, std::vector<std::vector<uint16_t>>& own) {
    own.emplace_back(static_cast<size_t>(rows * cols));
    FillBf16(own.back(), std::sqrt(3.0f / static_cast<float>(cols)));
    return kernels::Matrix{kernels::WeightType::kBF16, rows, cols, own.back().data(), nullptr};
  };
  std::vector<std::vector<uint16_t>> own;
  own.reserve(static_cast<size_t>(8 + 4 * d.layers));
  std::vector<float> ones(static_cast<size_t>(std::max(d.text_hidden, H)), 1.0f);
  VisionWeights w;
  w.patch_proj = mat(H, d.patch_dim(), own);
  w.pos_emb = mat(d.pos_h * d.pos_w, H, own);
  for (int64_t l = 0; l < d.layers; ++l) {
    VisionBlockWeights b;
    b.norm0 = b.norm1 = ones.data();
    b.wqkv = mat(3 * Q, H, own);
    b.wo = mat(H, Q, own);
    b.fc0 = mat(d.mlp, H, own);
    b.fc1 = mat(H, d.mlp, own);
    w.blocks.push_back(b);
  }
  w.final_norm = ones.data();
  w.proj0 = mat(M, M, own);
  w.proj2 = mat(d.text_hidden, M, own);
  w.post_norm = ones.data();
  std::vector<float> patches(static_cast<size_t>(n * d.patch_dim()));
  for (float& p : patches) p = static_cast<float>(Next() >> 40) / static_cast<float>(1 << 23) - 1;
  std::vector<float> out(static_cast<size_t>(n / 4 * d.text_hidden));

  const double params_rows =
      static_cast<double>(n) *
          static_cast<double>(H * d.patch_dim() + d.layers * (3 * Q * H + H * Q + 2 * d.mlp * H)) +
      static_cast<double>(n / 4) * static_cast<double>(M * M + d.text_hidden * M);
  const double weight_flops = 2.0 * params_rows;
  const double attn_flops = 4.0 * static_cast<double>(n) * static_cast<double>(n) *
                            static_cast<double>(Q) * static_cast<double>(d.layers);
  const double flops = weight_flops + attn_flops;

  const Rate fma_peak = FmaPeakGflops(threads);
  const Rate matmul_peak = MatMulPeakGflops(threads);
  std::printf("k3_bench_vision: isa %s, %d threads, grid %dx%d (%lld patches, %lld tokens), "
              "%lld layers, scratch %.1f MB\n",
              kernels::IsaName(kernels::ActiveIsa()), threads, gh, gw, static_cast<long long>(n),
              static_cast<long long>(n / 4), static_cast<long long>(d.layers),
              static_cast<double>(VisionScratchBytes(d, gh, gw, threads)) / 1e6);
  std::printf("work: %.1f GFLOP (weights %.1f, attention %.1f)\n", flops / 1e9,
              weight_flops / 1e9, attn_flops / 1e9);
  std::printf("yardsticks (best of 5; by wall time | by CPU time x %d threads): FMA peak %.1f | "
              "%.1f GFLOP/s; MatMul bf16 1536x1024 T=64 %.1f | %.1f GFLOP/s\n",
              threads, fma_peak.wall, fma_peak.cpu, matmul_peak.wall, matmul_peak.cpu);
  double best = 1e300, best_cpu = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    const double c0 = ProcessCpuSeconds();
    const Status st = RunVisionTower(w, d, patches.data(), gh, gw, out.data());
    const double s = Since(t0), cpu = ProcessCpuSeconds() - c0;
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
    std::printf("run %d: %.2f s wall, %.2f CPU-s (%.2f of %d threads busy), %.1f GFLOP/s\n", r, s,
                cpu, cpu / s, threads, flops / s / 1e9);
    best = std::min(best, s);
    best_cpu = std::min(best_cpu, cpu);
  }
  auto report = [&](const char* basis, double seconds, const Rate& fma, const Rate& mm, bool cpu) {
    const double f = flops / ((cpu ? fma.cpu : fma.wall) * 1e9);
    const double m = flops / ((cpu ? mm.cpu : mm.wall) * 1e9);
    std::printf("%s: %.2f s = %.1f GFLOP/s; FLOP floor at the FMA peak %.2f s (time / floor "
                "%.2f); at the MatMul peak %.2f s (time / floor %.2f)\n",
                basis, seconds, flops / seconds / 1e9, f, seconds / f, m, seconds / m);
  };
  report("by wall time", best, fma_peak, matmul_peak, false);
  // CPU time / threads: the run's time had every thread had a core to itself, against the
  // yardsticks measured the same way.
  report("by CPU time", best_cpu / threads, fma_peak, matmul_peak, true);
  return 0;
}

}  // namespace
}  // namespace k3::vision

int main(int argc, char** argv) { return k3::vision::Main(argc, argv); }
