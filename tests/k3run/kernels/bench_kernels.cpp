// k3_bench_kernels: weight × activation kernels at real K3 shapes (issue 5 "Performance"), next
// to this machine's memory read bandwidth measured in the same run. Never run by CTest.
//
//   k3_bench_kernels [--threads=N (2)] [--isa=scalar,avx2,avx512 (all supported)]
//                    [any --benchmark_* flag]
//
// Shapes: bf16 matvec 12288×7168 (the largest trunk projection), MXFP4 3072×3584 (expert w1)
// and 3584×3072 (w2), each at T = 1, 4, 16 activation rows. Weight GB/s counts the bytes one
// call reads (packed + scales for MXFP4); GFLOP/s counts 2·rows·cols·T. The MXFP4 matrices
// are rotated over enough copies (≥ 96 MB) that each call reads from DRAM, not the 32 MB L3,
// as a freshly loaded expert would.
// Router logits (router_dot.h): BF16 gate [896][768] (bench preset, called 92 times per token
// with one x, so it stays cache-resident like here) and [896][7168] (released model), at 1 and 2
// threads whatever --threads says; ns per call, and each path's speed-up over scalar.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "k3run/kernels/matmul.h"
#include "k3run/kernels/router_dot.h"

namespace k3::kernels {
namespace {

// The original C99 engine on this machine, 2 threads (issue 5), and the targets.
constexpr double kOriginalBf16Ms = 31.1;
constexpr double kOriginalMxfp4W1Ms = 9.6;

constexpr int64_t kMemBytes = int64_t{1} << 30;

int g_threads = 2;

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
  state.counters["GFLOP/s"] = benchmark::Counter(
      calls * 2.0 * static_cast<double>(m.rows * m.cols * T) / 1e9, benchmark::Counter::kIsRate);
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

void BmRouter(benchmark::State& state, Isa isa, const Weights* w, int threads) {
  SetIsa(isa);
  SetThreads(threads);
  const std::vector<float> x = Activations(1, w->m.cols);
  std::vector<double> out(static_cast<size_t>(w->m.rows));
  for (auto _ : state) {
    RouterLogits(w->m, x.data(), out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 2.0 *
                             static_cast<double>(w->m.rows * w->m.cols) / 1e9,
                         benchmark::Counter::kIsRate);
}

std::string RouterName(int64_t rows, int64_t cols, int threads, Isa isa) {
  return "Router/" + std::to_string(rows) + "x" + std::to_string(cols) + "/bf16/threads:" +
         std::to_string(threads) + "/" + IsaName(isa);
}

// A streaming read of a 1 GiB buffer by g_threads threads: the bandwidth a memory-bound matvec
// can hope for. XOR of 64-bit words vectorises to full-width loads and cannot be skipped.
void BmMemoryRead(benchmark::State& state, const uint64_t* buf) {
  const int64_t n = kMemBytes / 8;
  uint64_t sink = 0;
  for (auto _ : state) {
    uint64_t acc = 0;
#pragma omp parallel for num_threads(g_threads) schedule(static) reduction(^ : acc)
    for (int64_t i = 0; i < n; ++i) acc ^= buf[i];
    sink ^= acc;
  }
  benchmark::DoNotOptimize(sink);
  state.counters["GB/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * static_cast<double>(kMemBytes) / 1e9,
      benchmark::Counter::kIsRate);
}

// Remembers each run's milliseconds per call for the summary.
class Recorder : public benchmark::ConsoleReporter {
 public:
  Recorder() : ConsoleReporter(OO_Tabular) {}  // no colour codes: the output goes into docs
  std::map<std::string, double> ms;
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.run_type == Run::RT_Iteration) {
        // Registered names plus the "/real_time" suffix UseRealTime() adds.
        std::string name = run.benchmark_name();
        const std::string suffix = "/real_time";
        if (name.size() > suffix.size() && name.ends_with(suffix)) {
          name.resize(name.size() - suffix.size());
        }
        ms[name] = run.GetAdjustedRealTime();  // unit: ms (set below)
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

std::string Name(const char* what, int64_t rows, int64_t cols, int64_t T, Isa isa) {
  return std::string(what) + "/" + std::to_string(rows) + "x" + std::to_string(cols) +
         "/T:" + std::to_string(T) + "/" + IsaName(isa);
}

}  // namespace
}  // namespace k3::kernels

int main(int argc, char** argv) {
  using namespace k3::kernels;
  std::vector<Isa> isas;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      g_threads = std::atoi(argv[i] + 10);
    } else if (std::strncmp(argv[i], "--isa=", 6) == 0) {
      std::string list = std::string(argv[i] + 6) + ",";
      for (size_t p = 0, q; (q = list.find(',', p)) != std::string::npos; p = q + 1) {
        k3::Result<Isa> isa = ResolveIsaRequest(list.substr(p, q - p), k3::DetectCpu());
        if (!isa.ok()) {
          std::fprintf(stderr, "error: --isa: %s\n", isa.status().message().c_str());
          return 2;
        }
        isas.push_back(*isa);
      }
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (g_threads < 1) {
    std::fprintf(stderr, "error: --threads must be >= 1\n");
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

  benchmark::AddCustomContext("k3_threads", std::to_string(g_threads));
  benchmark::AddCustomContext("k3_default_isa", IsaName(ActiveIsa()));
  benchmark::RegisterBenchmark("memory_read/1GiB",
                               [&](benchmark::State& s) { BmMemoryRead(s, mem.data()); })
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  for (Isa isa : isas) {
    for (int64_t T : {1, 4, 16}) {
      struct Case {
        const char* what;
        const std::vector<Weights>* w;
      };
      for (const Case& c : {Case{"bf16", &bf16}, Case{"mxfp4_w1", &w1}, Case{"mxfp4_w2", &w2}}) {
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
            [isa, w = &w, threads](benchmark::State& s) { BmRouter(s, isa, w, threads); })
            ->UseRealTime()
            ->Unit(benchmark::kNanosecond);
      }
    }
  }

  Recorder recorder;
  benchmark::RunSpecifiedBenchmarks(&recorder);
  benchmark::Shutdown();

  // Summary against the targets.
  const auto it = recorder.ms.find("memory_read/1GiB");
  const double mem_gbs = it == recorder.ms.end() ? 0.0 : kMemBytes / (it->second * 1e6);
  std::printf("\nsummary (%d threads): memory read %.1f GB/s\n", g_threads, mem_gbs);
  for (Isa isa : isas) {
    const auto bf = recorder.ms.find(Name("bf16", 12288, 7168, 1, isa));
    const auto mx = recorder.ms.find(Name("mxfp4_w1", 3072, 3584, 1, isa));
    if (bf != recorder.ms.end()) {
      const double gbs = 12288.0 * 7168 * 2 / (bf->second * 1e6);
      std::printf(
          "  isa %-6s bf16 matvec 12288x7168: %7.2f ms, %5.1f GB/s = %5.1f %% of memory "
          "bandwidth (target >= 70 %%); %.2fx the original's %.1f ms (target >= 2x)\n",
          IsaName(isa), bf->second, gbs, mem_gbs > 0 ? 100.0 * gbs / mem_gbs : 0.0,
          kOriginalBf16Ms / bf->second, kOriginalBf16Ms);
    }
    if (mx != recorder.ms.end()) {
      std::printf(
          "  isa %-6s mxfp4 matvec 3072x3584: %7.3f ms; %.2fx the original's %.1f ms (target "
          ">= 5x)\n",
          IsaName(isa), mx->second, kOriginalMxfp4W1Ms / mx->second, kOriginalMxfp4W1Ms);
    }
  }
  // Router: the recorder holds nanoseconds for these (their unit).
  for (const Weights& w : routers) {
    for (int threads : {1, 2}) {
      const auto scalar = recorder.ms.find(RouterName(w.m.rows, w.m.cols, threads, Isa::kScalar));
      for (Isa isa : isas) {
        const auto it_r = recorder.ms.find(RouterName(w.m.rows, w.m.cols, threads, isa));
        if (it_r == recorder.ms.end()) continue;
        std::printf("  router bf16 %lldx%lld, %d thread%s, isa %-6s: %9.0f ns/call",
                    static_cast<long long>(w.m.rows), static_cast<long long>(w.m.cols), threads,
                    threads == 1 ? " " : "s", IsaName(isa), it_r->second);
        if (scalar != recorder.ms.end()) {
          std::printf(" (%.2fx scalar)", scalar->second / it_r->second);
        }
        std::printf("\n");
      }
    }
  }
  return 0;
}
