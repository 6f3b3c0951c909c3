// k3_bench_kernels: weight × activation kernels at real K3 shapes, each reported as a share of
// two yardsticks this binary measures on this machine in the same run. Never run by CTest; no
// figure in here comes from another machine or another day.
//
//   k3_bench_kernels [--threads=N (2)] [--isa=scalar,avx2,avx512 (all supported)]
//                    [--yardstick-passes=N (5)] [any --benchmark_* flag]
// With --benchmark_repetitions=N the summary takes each kernel's best repetition.
//
// Yardsticks, measured before the kernels and again after them (best of N passes each; the
// denominator is the best of both, so a share is never flattered by a slow moment):
//   memory read bandwidth: the kernels' own threads (thread_pool.h, --threads of them) stream a
//     1 GiB buffer (32× the 32 MB L3), XOR-reducing 16-byte loads: what a memory-bound matvec
//     can hope for;
//   FMA peak, per ISA path: the same threads run independent fp32 FMA chains in registers
//     (scalar: std::fmaf, called as the scalar path calls it; avx2: 12 ymm chains; avx512: 16 zmm
//     chains). Unit: G lane-FMA/s, one fp32 multiply-add = 2 flops.
//
// Shapes: bf16 matvec 12288×7168 (the largest trunk projection), MXFP4 3072×3584 (expert w1)
// and 3584×3072 (w2), each at T = 1, 4, 16 activation rows. Weight GB/s counts the bytes one
// call reads (packed + scales for MXFP4). The work counted is rows·cols·T lane-FMAs: one fp32
// multiply-add per weight per activation row, as the numerics contract does them (per 32
// weights and activation row: 2 zmm FMAs on avx512, 4 ymm FMAs on avx2). NOT counted: the MXFP4
// decode that precedes them (per 32 weights, avx512: 3 loads + 2 variable shifts + 2 permutes
// from the scaled LUT row; avx2: 4 loads + 28 unpack/widen/shift/and/permute/xor ops), the x
// permute of the avx512 MXFP4 path, bf16 widening, the reduction tree. That overhead is what
// keeps a kernel below the FMA peak; the share says how much of the FMA units' time is the
// contract's multiply-adds. The MXFP4 matrices are rotated over enough copies (≥ 96 MB)
// that each call reads from DRAM, not the L3, as a freshly loaded expert would.
// Router logits (router_dot.h): BF16 gate [896][768] (bench preset, called 92 times per token
// with one x, so it stays cache-resident like here) and [896][7168] (released model), at 1 and 2
// threads whatever --threads says; ns per call, and each path's speed-up over the scalar path
// measured in the same run.
// Absorbed MLA query (ops/mla.h step 2, transposed.h): q̃_h = W_UK[h]ᵀ·q_nope_h for the released
// 96 heads (W_UK[h]: a [128][512] bf16 slice of kv_b_proj [96·256][512]), T = 1, one thread:
// "copy" transposes every head's slice into a buffer and runs MatMul on it (what MlaLayer did
// per call before transposed.h), "columns" reads the slices by columns. Microseconds per call
// and their ratio in the same run.
// Argmax (argmax.h): greedy decoding's choice over a 163,840-entry row, the defining loop and
// the kernel, microseconds per call and their ratio in the same run.
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "k3run/kernels/argmax.h"
#include "k3run/kernels/matmul.h"
#include "k3run/kernels/router_dot.h"
#include "k3run/kernels/thread_pool.h"
#include "k3run/kernels/transposed.h"
#include "tests/support/yardsticks.h"

namespace k3::kernels {
namespace {

constexpr int64_t kMemBytes = int64_t{1} << 30;
// Targets, as shares of the yardsticks above.
constexpr double kTargetBf16MemoryShare = 0.70;  // bf16 matvec, T = 1: of memory bandwidth
constexpr double kTargetMxfp4Share = 0.70;       // MXFP4 matvec, T = 1: of its roofline floor

int g_threads = 2;
int g_yardstick_passes = 5;

// ---- yardsticks (tests/support/yardsticks.h: read bandwidth, FMA peak per path) ----
struct Yardsticks {
  double mem_gbs = 0;
  std::map<Isa, double> fma_g;  // G lane-FMA/s per path
};

Yardsticks MeasureYardsticks(const std::vector<uint64_t>& mem, const std::vector<Isa>& isas) {
  Yardsticks y;
  y.mem_gbs = testing::ReadGBs(mem, g_threads, g_yardstick_passes);
  for (Isa isa : isas) y.fma_g[isa] = testing::FmaPeakG(isa, g_threads, g_yardstick_passes);
  return y;
}

void PrintYardsticks(const char* when, const Yardsticks& y) {
  std::printf("yardsticks %s (%d threads, best of %d): memory read %.1f GB/s", when, g_threads,
              g_yardstick_passes, y.mem_gbs);
  for (const auto& [isa, g] : y.fma_g) {
    std::printf("; FMA peak %s %.2f G lane-FMA/s", IsaName(isa), g);
  }
  std::printf("\n");
  std::fflush(stdout);
}

// ---- data ----
struct Weights {
  Matrix m{};
  std::vector<uint16_t> bf16;
  std::vector<uint8_t> packed, scales;
};

Weights MakeBf16(int64_t rows, int64_t cols) {
  Weights w;
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  w.bf16.resize(static_cast<size_t>(rows * cols));
  for (uint16_t& v : w.bf16) v = F32ToBf16RoundNearestEven(normal(rng));
  w.m = {WeightType::kBF16, rows, cols, w.bf16.data(), nullptr};
  return w;
}

Weights MakeMxfp4(int64_t rows, int64_t cols, uint64_t seed) {
  Weights w;
  std::mt19937_64 rng(seed);
  w.packed.resize(static_cast<size_t>(rows * cols / 2));
  for (uint8_t& v : w.packed) v = static_cast<uint8_t>(rng());
  w.scales.resize(static_cast<size_t>(rows * cols / 32));
  for (uint8_t& v : w.scales) v = static_cast<uint8_t>(118 + rng() % 8);
  w.m = {WeightType::kMXFP4, rows, cols, w.packed.data(), w.scales.data()};
  return w;
}

std::vector<float> Activations(int64_t T, int64_t cols) {
  std::mt19937_64 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(T * cols));
  for (float& v : x) v = normal(rng);
  return x;
}

// ---- benchmarks ----
void SetCounters(benchmark::State& state, const Matrix& m, int64_t T) {
  const double calls = static_cast<double>(state.iterations());
  state.counters["weight_GB/s"] = benchmark::Counter(
      calls * static_cast<double>(WeightBytes(m)) / 1e9, benchmark::Counter::kIsRate);
  state.counters["G_lane-FMA/s"] = benchmark::Counter(
      calls * static_cast<double>(m.rows * m.cols * T) / 1e9, benchmark::Counter::kIsRate);
}

void BmMatMul(benchmark::State& state, Isa isa, const std::vector<Weights>* copies, int64_t T) {
  SetIsa(isa);
  SetThreads(g_threads);
  const Matrix& first = (*copies)[0].m;
  const std::vector<float> x = Activations(T, first.cols);
  std::vector<float> y(static_cast<size_t>(T * first.rows));
  size_t k = 0;
  for (auto _ : state) {
    MatMul((*copies)[k].m, x.data(), T, y.data());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
    k = (k + 1) % copies->size();
  }
  SetCounters(state, first, T);
}

// T activation rows through RouterLogitsRows (T = 1 is RouterLogits's path): ns per call.
void BmRouter(benchmark::State& state, Isa isa, const Weights* w, int threads, int64_t T) {
  SetIsa(isa);
  SetThreads(threads);
  const std::vector<float> x = Activations(T, w->m.cols);
  std::vector<double> out(static_cast<size_t>(T * w->m.rows));
  for (auto _ : state) {
    RouterLogitsRows(w->m, x.data(), T, out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 2.0 *
                             static_cast<double>(T * w->m.rows * w->m.cols) / 1e9,
                         benchmark::Counter::kIsRate);
}

std::string RouterName(int64_t rows, int64_t cols, int threads, Isa isa) {
  return "Router/" + std::to_string(rows) + "x" + std::to_string(cols) + "/bf16/threads:" +
         std::to_string(threads) + "/" + IsaName(isa);
}

// Remembers each benchmark's time per call (the unit it registered) for the summary.
class Recorder : public benchmark::ConsoleReporter {
 public:
  Recorder() : ConsoleReporter(OO_Tabular) {}  // no colour codes: the output goes into docs
  std::map<std::string, double> time;
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.run_type == Run::RT_Iteration) {
        // Registered names plus the "/real_time" suffix UseRealTime() adds.
        std::string name = run.benchmark_name();
        const std::string suffix = "/real_time";
        if (name.size() > suffix.size() && name.ends_with(suffix)) {
          name.resize(name.size() - suffix.size());
        }
        // With --benchmark_repetitions the best repetition, as the yardsticks keep their best.
        const double t = run.GetAdjustedRealTime();
        const auto [it, fresh] = time.emplace(name, t);
        if (!fresh && t < it->second) it->second = t;
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

std::string Name(const char* what, int64_t rows, int64_t cols, int64_t T, Isa isa) {
  return std::string(what) + "/" + std::to_string(rows) + "x" + std::to_string(cols) +
         "/T:" + std::to_string(T) + "/" + IsaName(isa);
}

struct Case {
  const char* what;
  const std::vector<Weights>* w;
};

// One line per measured matmul: its rates and their shares of the yardsticks. For MXFP4 also
// the roofline floor max(bytes ÷ memory bandwidth, lane-FMAs ÷ FMA peak) and time ÷ it.
void PrintMatMulSummary(const Recorder& rec, const std::vector<Isa>& isas,
                        const std::vector<Case>& cases, const Yardsticks& y) {
  std::printf("\nsummary (%d threads; memory read %.1f GB/s; FMA peak per path as above)\n",
              g_threads, y.mem_gbs);
  std::printf("  %-6s %-24s %3s %9s %8s %8s %9s %8s  %s\n", "isa", "matrix", "T", "ms/call",
              "GB/s", "% mem", "G FMA/s", "% FMA", "time / roofline floor (bound)");
  for (Isa isa : isas) {
    const double peak = y.fma_g.at(isa);
    for (const Case& c : cases) {
      const Matrix& m = (*c.w)[0].m;
      for (int64_t T : {1, 4, 16}) {
        const auto it = rec.time.find(Name(c.what, m.rows, m.cols, T, isa));
        if (it == rec.time.end()) continue;
        const double s = it->second / 1e3;  // registered in ms
        const double bytes = static_cast<double>(WeightBytes(m));
        const double fmas = static_cast<double>(m.rows * m.cols * T);
        const double gbs = bytes / s / 1e9, gfma = fmas / s / 1e9;
        const double mem_floor = bytes / (y.mem_gbs * 1e9), fma_floor = fmas / (peak * 1e9);
        const std::string shape = std::string(c.what) + " " + std::to_string(m.rows) + "x" +
                                  std::to_string(m.cols);
        std::printf("  %-6s %-24s %3lld %9.3f %8.2f %7.1f%% %9.2f %7.1f%%  %.2f (%s)\n",
                    IsaName(isa), shape.c_str(), static_cast<long long>(T), s * 1e3, gbs,
                    100.0 * gbs / y.mem_gbs, gfma, 100.0 * gfma / peak,
                    s / std::max(mem_floor, fma_floor), mem_floor >= fma_floor ? "memory" : "FMA");
      }
    }
  }
  for (Isa isa : isas) {
    const auto bf = rec.time.find(Name("bf16", 12288, 7168, 1, isa));
    if (bf != rec.time.end()) {
      const double gbs = 12288.0 * 7168 * 2 / (bf->second * 1e6);
      std::printf(
          "  isa %-6s bf16 matvec 12288x7168 moves %.2f GB/s = %.1f %% of measured memory "
          "bandwidth (target >= %.0f %%)\n",
          IsaName(isa), gbs, 100.0 * gbs / y.mem_gbs, 100 * kTargetBf16MemoryShare);
    }
    const auto mx = rec.time.find(Name("mxfp4_w1", 3072, 3584, 1, isa));
    if (mx != rec.time.end()) {
      const double s = mx->second / 1e3;
      const Matrix m{WeightType::kMXFP4, 3072, 3584, nullptr, nullptr};
      const double bytes = static_cast<double>(WeightBytes(m)), fmas = 3072.0 * 3584;
      const double floor_s = std::max(bytes / (y.mem_gbs * 1e9), fmas / (y.fma_g.at(isa) * 1e9));
      std::printf(
          "  isa %-6s mxfp4 matvec 3072x3584 does %.2f G lane-FMA/s = %.1f %% of measured %s FMA "
          "peak, moves %.2f GB/s = %.1f %% of memory bandwidth; %.1f %% of its roofline floor "
          "(target >= %.0f %%)\n",
          IsaName(isa), fmas / s / 1e9, 100.0 * fmas / s / 1e9 / y.fma_g.at(isa), IsaName(isa),
          bytes / s / 1e9, 100.0 * bytes / s / 1e9 / y.mem_gbs, 100.0 * floor_s / s,
          100 * kTargetMxfp4Share);
    }
  }
}

}  // namespace
}  // namespace k3::kernels

std::string AbsorbedName(bool copy, k3::kernels::Isa isa) {
  return std::string("absorbed_query/96x128x512/") + k3::kernels::IsaName(isa) +
         (copy ? "/copy" : "/columns");
}

int main(int argc, char** argv) {
  using namespace k3::kernels;
  std::vector<Isa> isas;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      g_threads = std::atoi(argv[i] + 10);
    } else if (std::strncmp(argv[i], "--yardstick-passes=", 19) == 0) {
      g_yardstick_passes = std::atoi(argv[i] + 19);
    } else if (std::strncmp(argv[i], "--isa=", 6) == 0) {
      k3::Result<std::vector<Isa>> parsed = k3::testing::ParseIsaList(argv[i] + 6);
      if (!parsed.ok()) {
        std::fprintf(stderr, "error: --isa: %s\n", parsed.status().message().c_str());
        return 2;
      }
      isas = *parsed;
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (g_threads < 1 || g_threads > kMaxThreads) {
    std::fprintf(stderr, "error: --threads must be in [1, %d]\n", kMaxThreads);
    return 2;
  }
  if (g_yardstick_passes < 1) {
    std::fprintf(stderr, "error: --yardstick-passes must be >= 1\n");
    return 2;
  }
  if (isas.empty()) {
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
      if (IsaSupported(isa)) isas.push_back(isa);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());

  // Inputs: 176 MB bf16, and MXFP4 copies well past the L3 (see the header comment).
  const std::vector<Weights> bf16 = [] {
    std::vector<Weights> v;
    v.push_back(MakeBf16(12288, 7168));
    return v;
  }();
  auto mxfp4_copies = [](int64_t rows, int64_t cols) {
    std::vector<Weights> v;
    const int64_t bytes = rows * (cols / 2 + cols / 32);
    for (int64_t total = 0; total < (int64_t{96} << 20); total += bytes) {
      v.push_back(MakeMxfp4(rows, cols, 10 + v.size()));
    }
    return v;
  };
  const std::vector<Weights> w1 = mxfp4_copies(3072, 3584);
  const std::vector<Weights> w2 = mxfp4_copies(3584, 3072);
  std::vector<uint64_t> mem(static_cast<size_t>(kMemBytes / 8));
  for (size_t i = 0; i < mem.size(); ++i) mem[i] = i * 0x9E3779B97F4A7C15ull;

  SetThreads(g_threads);
  const Yardsticks before = MeasureYardsticks(mem, isas);
  PrintYardsticks("before", before);

  benchmark::AddCustomContext("k3_threads", std::to_string(g_threads));
  benchmark::AddCustomContext("k3_default_isa", IsaName(ActiveIsa()));
  const std::vector<Case> cases = {{"bf16", &bf16}, {"mxfp4_w1", &w1}, {"mxfp4_w2", &w2}};
  for (Isa isa : isas) {
    for (int64_t T : {1, 4, 16}) {
      for (const Case& c : cases) {
        const Matrix& m = (*c.w)[0].m;
        // The scalar path is a readable reference, ~50× slower: T = 1 says enough about it.
        if (isa == Isa::kScalar && T > 1) continue;
        benchmark::RegisterBenchmark(
            Name(c.what, m.rows, m.cols, T, isa).c_str(),
            [isa, w = c.w, T](benchmark::State& s) { BmMatMul(s, isa, w, T); })
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }

  const std::vector<Weights> routers = [] {
    std::vector<Weights> v;
    v.push_back(MakeBf16(896, 768));
    v.push_back(MakeBf16(896, 7168));
    return v;
  }();
  for (const Weights& w : routers) {
    for (int threads : {1, 2}) {
      for (Isa isa : isas) {
        benchmark::RegisterBenchmark(
            RouterName(w.m.rows, w.m.cols, threads, isa).c_str(),
            [isa, w = &w, threads](benchmark::State& s) { BmRouter(s, isa, w, threads, 1); })
            ->UseRealTime()
            ->Unit(benchmark::kNanosecond);
        // A decode pass of 8 sequences routes 8 rows per layer with one read of the gate; a
        // prefill chunk many more (AVX-512: panels from T = 8 on).
        for (int64_t T : {8, 64}) {
          benchmark::RegisterBenchmark(
              (RouterName(w.m.rows, w.m.cols, threads, isa) + "/T:" + std::to_string(T)).c_str(),
              [isa, w = &w, threads, T](benchmark::State& s) { BmRouter(s, isa, w, threads, T); })
              ->UseRealTime()
              ->Unit(benchmark::kNanosecond);
        }
      }
    }
  }

  // Greedy decoding's argmax over a released-vocabulary row (kernels/argmax.h), cache-resident
  // as a row just written by lm_head is: the defining loop and the kernel.
  std::vector<float> logits(163840);
  {
    std::mt19937 rng(3);
    std::normal_distribution<float> normal;
    for (float& v : logits) v = normal(rng);
  }
  for (bool reference : {true, false}) {
    benchmark::RegisterBenchmark(reference ? "argmax/163840/reference" : "argmax/163840/kernel",
                                 [&logits, reference](benchmark::State& s) {
                                   for (auto _ : s) {
                                     const int64_t n = static_cast<int64_t>(logits.size());
                                     benchmark::DoNotOptimize(
                                         reference ? ArgMaxReference(logits.data(), n)
                                                   : ArgMax(logits.data(), n));
                                   }
                                 })
        ->Unit(benchmark::kMicrosecond);
  }

  // The absorbed MLA query at released dims, on one thread (see the header comment).
  const Weights kvb = MakeBf16(96 * 256, 512);
  std::vector<float> q_nope(96 * 192, 0.5f), q_tilde(96 * 512);
  std::vector<uint16_t> transposed(96 * 512 * 128);
  for (Isa isa : isas) {
    for (bool copy : {true, false}) {
      benchmark::RegisterBenchmark(
          AbsorbedName(copy, isa).c_str(),
          [&, isa, copy](benchmark::State& s) {
            const Isa isa_before = ActiveIsa();
            SetIsa(isa);
            for (auto _ : s) {
              for (int64_t h = 0; h < 96; ++h) {
                const uint16_t* slice = kvb.bf16.data() + h * 256 * 512;
                if (copy) {
                  uint16_t* t = transposed.data() + h * 512 * 128;
                  for (int64_t i = 0; i < 128; ++i) {
                    for (int64_t j = 0; j < 512; ++j) t[j * 128 + i] = slice[i * 512 + j];
                  }
                  MatMulOnThisThread({WeightType::kBF16, 512, 128, t, nullptr},
                                     q_nope.data() + h * 192, 1, q_tilde.data() + h * 512);
                } else {
                  MatMulTransposedOnThisThread({WeightType::kBF16, 128, 512, slice, nullptr},
                                               q_nope.data() + h * 192, 192, 1,
                                               q_tilde.data() + h * 512);
                }
              }
              benchmark::DoNotOptimize(q_tilde.data());
            }
            SetIsa(isa_before);
          })
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }

  Recorder recorder;
  benchmark::RunSpecifiedBenchmarks(&recorder);
  benchmark::Shutdown();

  SetThreads(g_threads);
  const Yardsticks after = MeasureYardsticks(mem, isas);
  PrintYardsticks("after ", after);
  Yardsticks best = before;
  best.mem_gbs = std::max(before.mem_gbs, after.mem_gbs);
  for (auto& [isa, g] : best.fma_g) g = std::max(g, after.fma_g.at(isa));

  PrintMatMulSummary(recorder, isas, cases, best);
  // Router: the recorder holds nanoseconds for these (their unit).
  for (const Weights& w : routers) {
    for (int threads : {1, 2}) {
      const auto scalar = recorder.time.find(RouterName(w.m.rows, w.m.cols, threads, Isa::kScalar));
      for (Isa isa : isas) {
        const auto it_r = recorder.time.find(RouterName(w.m.rows, w.m.cols, threads, isa));
        if (it_r == recorder.time.end()) continue;
        std::printf("  router bf16 %lldx%lld, %d thread%s, isa %-6s: %9.0f ns/call",
                    static_cast<long long>(w.m.rows), static_cast<long long>(w.m.cols), threads,
                    threads == 1 ? " " : "s", IsaName(isa), it_r->second);
        if (scalar != recorder.time.end()) {
          std::printf(" (%.2fx scalar, same run)", scalar->second / it_r->second);
        }
        std::printf("\n");
      }
    }
  }
  for (Isa isa : isas) {
    const auto copy = recorder.time.find(AbsorbedName(true, isa));
    const auto cols = recorder.time.find(AbsorbedName(false, isa));
    if (copy == recorder.time.end() || cols == recorder.time.end()) continue;
    std::printf("  absorbed MLA query, 96 heads 128x512 bf16, 1 thread, isa %-6s: transpose + "
                "MatMul %.0f us, by columns %.0f us (%.2fx, same run)\n", IsaName(isa),
                copy->second, cols->second, copy->second / cols->second);
  }
  const auto ref = recorder.time.find("argmax/163840/reference");
  const auto ker = recorder.time.find("argmax/163840/kernel");
  if (ref != recorder.time.end() && ker != recorder.time.end()) {
    std::printf("  argmax over 163840 logits: reference loop %.1f us, kernel %.1f us (%.2fx, "
                "same run)\n", ref->second, ker->second, ref->second / ker->second);
  }
  return 0;
}
