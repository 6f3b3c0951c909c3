// k3_bench_roofline: the weight × activation kernels (k3run/kernels/matmul.h) against a roofline
// this binary measures on this machine in the same run, per shape, ISA path, activation rows T
// and thread count. Never run by CTest; no figure in here comes from another machine or day.
//
//   k3_bench_roofline [--threads=N (all: kernels::Threads())] [--isa=scalar,avx2,avx512 (all
//                     supported)] [--passes=N (5)] [any --benchmark_* flag]
// --benchmark_format=json writes Google Benchmark's JSON on stdout (the yardsticks are in its
// "context", every figure a counter); the yardsticks and the summary table go to stderr, so the
// JSON stays parseable. --benchmark_min_time defaults to 0.1 (s) here.
//
// Yardsticks (measured once before the kernels, best of --passes passes each; both are in the
// JSON "context", and the read is also the benchmark "roofline/read/threads:K"). Under load a
// kernel's mean over 0.1 s and a yardstick's best pass see different shares of the CPU: run it
// on a quiet machine (docs/PERFORMANCE.md).
//   fma is measured per ISA path and thread count; read per thread count:
//   read: STREAM-like read bandwidth: K threads of the kernels' pool (thread_pool.h) XOR-reduce
//     a 512 MiB buffer (16× the 32 MB L3) in 16-byte loads, 8 independent accumulators each.
//   fma: K threads run independent fp32 FMA chains in registers (scalar: std::fmaf as the scalar
//     path calls it; avx2: 12 ymm chains; avx512: 16 zmm chains); G lane-FMA/s.
//   mxfp4 decode (avx512 only): K threads run the avx512 MXFP4 kernel's arithmetic per 16
//     weights (variable shift, permutexvar into the group's table, FMA) in registers; GB/s of
//     MXFP4 weights. Not part of the floor: it is the ceiling the kernel's decode sets, which a
//     T = 1 call cannot pass however its memory behaves (pct_decode says how close it gets).
// The roofline of one call: floor = max(weight bytes ÷ read(K), rows·cols·T ÷ fma(ISA, K)).
//
// Benchmarks: matmul/<type>/<preset>/<rows>x<cols>/T:<T>/<isa>/threads:<K>, one MatMul call per
// iteration (kernels::SetThreads(K); MatMul splits rows over threads as the engine's trunk does).
// The routed experts run one expert per thread through MatMulOnThisThread instead (a wave of
// them per fork/join, k3run/engine/expert_waves.h), which threads:1 measures for one core and
// experts/mxfp4/<preset>/<rows>x<cols>/T:<T>/<isa>/threads:<K> (K > 1) for all of them: an
// iteration is a wave of kWave different copies spread over the K threads. Weights rotate over
// copies in a ≥ 128 MiB pool, so each call reads from DRAM as a freshly loaded expert or a
// streamed trunk layer does. Counters, from the loop's wall time (per matrix for a wave):
//   weight_GB/s    weight bytes one call reads (MXFP4: packed + scales) per second
//   pct_read       weight_GB/s ÷ read(K), in %
//   G_lane_FMA/s   rows·cols·T fp32 multiply-adds per second (the contract's FMAs; the MXFP4
//                  decode, bf16 widening and the reduction tree are not counted)
//   pct_fma        G_lane_FMA/s ÷ fma(ISA, K), in %
//   pct_roofline   floor ÷ time per call, in %: 100 would be running at whichever yardstick binds
//   memory_bound   1 when the floor is the memory term, 0 when it is the FMA term
//   pct_decode     MXFP4 on avx512 only: weight_GB/s ÷ mxfp4 decode(K), in %
// Shapes: MXFP4 experts w1/w3 [moe_inter][latent] and w2 [latent][moe_inter] of the released
// config (3072, 3584), the bench preset (256, 512) and the small preset (128, 128); bf16 trunk
// matrices of the released config (12288×7168, routed_expert_down_proj 3584×7168, up_proj
// 7168×3584) and the bench preset (dense gate 3584×768, down 768×3584, latent down 512×768);
// and two in-L2 shapes that never rotate (Shape::in_cache): the kernels' rate without memory.
// The scalar path (the readable reference, ~50× slower) runs only where rows·cols·T ≤ 2^27.
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/sysinfo.h"
#include "k3run/kernels/matmul.h"
#include "k3run/kernels/thread_pool.h"
#include "tests/support/yardsticks.h"

namespace k3::kernels {
namespace {

constexpr int64_t kReadBytes = int64_t{512} << 20;
constexpr int64_t kPoolBytes = int64_t{128} << 20;  // 4× the L3: every call reads from DRAM
constexpr int64_t kScalarMaxWork = int64_t{1} << 27;
constexpr int kRowCounts[] = {1, 2, 4, 8, 16};
constexpr int64_t kWave = 16;  // matrices an experts/ iteration runs: about a layer's top-k

int g_passes = 5;

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// ---- yardsticks (tests/support/yardsticks.h) ----
using testing::FmaPeakG;
using testing::Mxfp4DecodePeakGBs;
using testing::ReadGBs;

std::map<int, double> g_read_gbs;                  // threads → GB/s
std::map<std::pair<Isa, int>, double> g_fma_g;     // (isa, threads) → G lane-FMA/s
std::map<int, double> g_decode_gbs;                // threads → avx512 MXFP4 decode GB/s

// ---- weights: pools of bytes that rotating copies of a matrix are cut from ----
struct Pools {
  std::vector<uint8_t> packed, scales;  // MXFP4: packed kPoolBytes, scales kPoolBytes / 16
  std::vector<uint16_t> bf16;           // ≥ kPoolBytes and ≥ the largest bf16 matrix
};

uint64_t Mix(uint64_t& s) {  // splitmix64: fast enough to fill a few hundred MB at start-up
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Pools MakePools(int64_t bf16_elements) {
  Pools p;
  uint64_t s = 1;
  p.packed.resize(static_cast<size_t>(kPoolBytes));
  for (size_t i = 0; i < p.packed.size(); i += 8) {
    const uint64_t v = Mix(s);
    std::memcpy(p.packed.data() + i, &v, 8);
  }
  p.scales.resize(static_cast<size_t>(kPoolBytes / 16));
  for (uint8_t& v : p.scales) v = static_cast<uint8_t>(118 + Mix(s) % 8);
  // bf16 of magnitude 2^-7..2^-1 with random sign and mantissa: finite, normal.
  p.bf16.resize(static_cast<size_t>(std::max(bf16_elements, kPoolBytes / 2)));
  for (uint16_t& v : p.bf16) {
    const uint64_t r = Mix(s);
    v = static_cast<uint16_t>(((r & 1) << 15) | ((120 + (r >> 1) % 6) << 7) | ((r >> 8) & 127));
  }
  return p;
}

struct Shape {
  WeightType type;
  const char* preset;  // released | bench | small | in-L2
  const char* what;    // w1/w3, w2, or the trunk tensor
  int64_t rows, cols;
  // One copy, read by every call: it stays in L2, so the call runs at the kernel's own rate
  // with no memory stall. Its weight GB/s against the read yardstick says how far the kernel
  // alone can go; no prefetching can take a DRAM-bound call past it.
  bool in_cache = false;
};

// Copies of `s` cut from the pools at consecutive offsets, as many as fit (at least one; one
// for an in-cache shape).
std::vector<Matrix> Copies(const Pools& p, const Shape& s) {
  std::vector<Matrix> v;
  const int64_t most = s.in_cache ? 1 : INT64_MAX;
  if (s.type == WeightType::kMXFP4) {
    const int64_t pb = s.rows * s.cols / 2, sb = s.rows * s.cols / kMxfp4GroupSize;
    for (int64_t k = 0; k < most && (k + 1) * pb <= kPoolBytes; ++k) {
      v.push_back({s.type, s.rows, s.cols, p.packed.data() + k * pb, p.scales.data() + k * sb});
    }
  } else {
    const int64_t n = s.rows * s.cols;
    for (int64_t k = 0; k < most && (k + 1) * n <= static_cast<int64_t>(p.bf16.size()); ++k) {
      v.push_back({s.type, s.rows, s.cols, p.bf16.data() + k * n, nullptr});
    }
  }
  return v;
}

std::string TypeName(WeightType t) { return t == WeightType::kMXFP4 ? "mxfp4" : "bf16"; }

// kind: "matmul" (one MatMul split over the threads) or "experts" (a wave, one per thread).
std::string Name(const std::string& kind, const Shape& s, int64_t T, Isa isa, int threads) {
  return kind + "/" + TypeName(s.type) + "/" + s.preset + "/" + std::to_string(s.rows) + "x" +
         std::to_string(s.cols) + "/T:" + std::to_string(T) + "/" + IsaName(isa) +
         "/threads:" + std::to_string(threads);
}

// The best (lowest) seconds per call of each matmul benchmark, for the summary.
std::map<std::string, double> g_best_s;

// wave = 0: one MatMul call per iteration; wave > 0: `wave` consecutive copies per iteration,
// each through MatMulOnThisThread on whichever thread claims it (ParallelChunks), as the
// engine runs a wave of routed experts. Counters are per matrix either way.
void BmMatMul(benchmark::State& state, const std::vector<Matrix>* copies, int64_t T, Isa isa,
              int threads, int64_t wave, const std::string& name) {
  SetIsa(isa);
  SetThreads(threads);
  const Matrix& m = (*copies)[0];
  const int64_t outputs = std::max<int64_t>(wave, 1);
  std::vector<float> x(static_cast<size_t>(T * m.cols));
  std::vector<float> y(static_cast<size_t>(outputs * T * m.rows));
  uint64_t s = 2;
  for (float& v : x) v = static_cast<float>(static_cast<int64_t>(Mix(s) % 2001) - 1000) * 1e-3f;
  const int64_t n = static_cast<int64_t>(copies->size());
  int64_t k = 0;
  const auto t0 = Clock::now();
  for (auto _ : state) {
    if (wave == 0) {
      MatMul((*copies)[static_cast<size_t>(k)], x.data(), T, y.data());
      k = k + 1 == n ? 0 : k + 1;
    } else {
      ParallelChunks(threads, wave, [&](int64_t c) {
        MatMulOnThisThread((*copies)[static_cast<size_t>((k + c) % n)], x.data(), T,
                           y.data() + c * T * m.rows);
      });
      k = (k + wave) % n;
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double per_call = Since(t0) / static_cast<double>(state.iterations() * outputs);
  const double bytes = static_cast<double>(WeightBytes(m));
  const double fmas = static_cast<double>(m.rows * m.cols * T);
  const double read = g_read_gbs.at(threads), peak = g_fma_g.at({isa, threads});
  const double mem_floor = bytes / (read * 1e9), fma_floor = fmas / (peak * 1e9);
  state.counters["weight_GB/s"] = bytes / per_call / 1e9;
  state.counters["pct_read"] = 100.0 * bytes / per_call / 1e9 / read;
  state.counters["G_lane_FMA/s"] = fmas / per_call / 1e9;
  state.counters["pct_fma"] = 100.0 * fmas / per_call / 1e9 / peak;
  state.counters["pct_roofline"] = 100.0 * std::max(mem_floor, fma_floor) / per_call;
  state.counters["memory_bound"] = mem_floor >= fma_floor ? 1 : 0;
  if (m.type == WeightType::kMXFP4 && isa == Isa::kAvx512) {
    state.counters["pct_decode"] = 100.0 * bytes / per_call / 1e9 / g_decode_gbs.at(threads);
  }
  const auto [it, fresh] = g_best_s.emplace(name, per_call);
  if (!fresh && per_call < it->second) it->second = per_call;
}

// One row of the summary: a cell per T, "GB/s · % of read · % of roofline"; nothing when no
// benchmark of that kind ran for (s, isa, th).
void PrintSummaryRow(const std::string& kind, const Shape& s, Isa isa, int th) {
  std::string line = "| " + TypeName(s.type) + " " + s.preset + " " + s.what + " " +
                     std::to_string(s.rows) + "×" + std::to_string(s.cols) +
                     (kind == "experts" ? ", one per thread" : "") + " | " + IsaName(isa) +
                     " | " + std::to_string(th) + " |";
  bool any = false;
  for (int T : kRowCounts) {
    const auto it = g_best_s.find(Name(kind, s, T, isa, th));
    if (it == g_best_s.end()) {
      line += " – |";
      continue;
    }
    any = true;
    const Matrix m{s.type, s.rows, s.cols, nullptr, nullptr};
    const double bytes = static_cast<double>(WeightBytes(m));
    const double fmas = static_cast<double>(s.rows * s.cols * T);
    const double gbs = bytes / it->second / 1e9;
    const double mem_s = bytes / (g_read_gbs.at(th) * 1e9);
    const double fma_s = fmas / (g_fma_g.at({isa, th}) * 1e9);
    char cell[96];
    std::snprintf(cell, sizeof cell, " %.1f · %.0f%% · %.0f%%%s |", gbs,
                  100.0 * gbs / g_read_gbs.at(th), 100.0 * std::max(mem_s, fma_s) / it->second,
                  mem_s >= fma_s ? "" : "ᶠ");
    line += cell;
  }
  if (any) std::fprintf(stderr, "%s\n", line.c_str());
}

// One table for every weight type: a row per (shape, isa, threads, kind).
void PrintSummary(const std::vector<Shape>& shapes, const std::vector<Isa>& isas,
                  const std::vector<int>& thread_counts) {
  std::fprintf(stderr, "\n| matrix | isa | threads |");
  for (int T : kRowCounts) std::fprintf(stderr, " T = %d |", T);
  std::fprintf(stderr, "\n|---|---|---|");
  for (int T : kRowCounts) std::fprintf(stderr, "---|%s", T == 16 ? "\n" : "");
  for (const Shape& s : shapes) {
    for (Isa isa : isas) {
      for (int th : thread_counts) {
        PrintSummaryRow("matmul", s, isa, th);
        PrintSummaryRow("experts", s, isa, th);
      }
    }
  }
  std::fprintf(stderr,
               "cells: weight GB/s · %% of the read yardstick at that thread count · %% of the "
               "roofline floor (ᶠ: the FMA term binds, else memory)\n");
  for (const auto& [th, gbs] : g_decode_gbs) {
    std::fprintf(stderr,
                 "avx512 MXFP4 decode ceiling, %d thread%s: %.1f GB/s = %.0f%% of the read "
                 "yardstick (a T = 1 call cannot stream its weights faster)\n",
                 th, th == 1 ? "" : "s", gbs, 100.0 * gbs / g_read_gbs.at(th));
  }
}

}  // namespace
}  // namespace k3::kernels

int main(int argc, char** argv) {
  using namespace k3::kernels;
  std::vector<Isa> isas;
  int all_threads = Threads();
  std::vector<char*> rest;
  bool min_time_given = false;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      all_threads = std::atoi(argv[i] + 10);
    } else if (std::strncmp(argv[i], "--passes=", 9) == 0) {
      g_passes = std::atoi(argv[i] + 9);
    } else if (std::strncmp(argv[i], "--isa=", 6) == 0) {
      k3::Result<std::vector<Isa>> parsed = k3::testing::ParseIsaList(argv[i] + 6);
      if (!parsed.ok()) {
        std::fprintf(stderr, "error: --isa: %s\n", parsed.status().message().c_str());
        return 2;
      }
      isas = *parsed;
    } else {
      if (std::strncmp(argv[i], "--benchmark_min_time", 20) == 0) min_time_given = true;
      rest.push_back(argv[i]);
    }
  }
  if (all_threads < 1 || all_threads > kMaxThreads || g_passes < 1) {
    std::fprintf(stderr, "error: --threads must be in [1, %d], --passes >= 1\n", kMaxThreads);
    return 2;
  }
  if (isas.empty()) {
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
      if (IsaSupported(isa)) isas.push_back(isa);
    }
  }
  static char min_time[] = "--benchmark_min_time=0.1";
  if (!min_time_given) rest.push_back(min_time);
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  if (benchmark::ReportUnrecognizedArguments(rest_argc, rest.data())) return 2;

  std::vector<int> thread_counts = {1};
  if (all_threads > 1) thread_counts.push_back(all_threads);

  const std::vector<Shape> shapes = {
      {WeightType::kMXFP4, "released", "w1/w3", 3072, 3584},
      {WeightType::kMXFP4, "released", "w2", 3584, 3072},
      {WeightType::kMXFP4, "bench", "w1/w3", 256, 512},
      {WeightType::kMXFP4, "bench", "w2", 512, 256},
      {WeightType::kMXFP4, "small", "w1/w2/w3", 128, 128},
      {WeightType::kBF16, "released", "trunk", 12288, 7168},
      {WeightType::kBF16, "released", "latent down", 3584, 7168},
      {WeightType::kBF16, "released", "latent up", 7168, 3584},
      {WeightType::kBF16, "bench", "dense gate", 3584, 768},
      {WeightType::kBF16, "bench", "dense down", 768, 3584},
      {WeightType::kBF16, "bench", "latent down", 512, 768},
      // The kernels' own ceilings: 68 KB of MXFP4 and 384 KB of bf16, in the 1 MB L2.
      {WeightType::kMXFP4, "in-L2", "w1/w3 bench", 256, 512, true},
      {WeightType::kBF16, "in-L2", "dense gate slice", 256, 768, true},
  };

  // Yardsticks first, on a quiet pool.
  std::vector<uint64_t> mem(static_cast<size_t>(kReadBytes / 8));
  for (size_t i = 0; i < mem.size(); ++i) mem[i] = i * 0x9E3779B97F4A7C15ull;
  {
    for (int th : thread_counts) {
      g_read_gbs[th] = ReadGBs(mem, th, g_passes);
      std::fprintf(stderr, "roofline read, %d thread%s: %.2f GB/s (best of %d)\n", th,
                   th == 1 ? "" : "s", g_read_gbs[th], g_passes);
      benchmark::AddCustomContext("roofline_read_GB/s_threads:" + std::to_string(th),
                                  std::to_string(g_read_gbs[th]));
      for (Isa isa : isas) {
        g_fma_g[{isa, th}] = FmaPeakG(isa, th, g_passes);
        std::fprintf(stderr, "roofline fma %s, %d thread%s: %.2f G lane-FMA/s\n", IsaName(isa),
                     th, th == 1 ? "" : "s", g_fma_g[{isa, th}]);
        benchmark::AddCustomContext(
            std::string("roofline_fma_G/s_") + IsaName(isa) + "_threads:" + std::to_string(th),
            std::to_string(g_fma_g[{isa, th}]));
        if (isa == Isa::kAvx512) {
          g_decode_gbs[th] = Mxfp4DecodePeakGBs(th, g_passes);
          std::fprintf(stderr, "mxfp4 decode ceiling avx512, %d thread%s: %.2f GB/s\n", th,
                       th == 1 ? "" : "s", g_decode_gbs[th]);
          benchmark::AddCustomContext(
              "mxfp4_decode_GB/s_avx512_threads:" + std::to_string(th),
              std::to_string(g_decode_gbs[th]));
        }
      }
    }
    // The yardsticks as benchmarks too (one pass per iteration), so the JSON lists them.
    for (int th : thread_counts) {
      benchmark::RegisterBenchmark(("roofline/read/threads:" + std::to_string(th)).c_str(),
                                   [th, &mem](benchmark::State& st) {
                                     double best = 0;
                                     for (auto _ : st) best = std::max(best, ReadGBs(mem, th, 1));
                                     st.counters["GB/s"] = best;
                                   })
          ->Iterations(3)
          ->UseRealTime();
    }
  }

  int64_t largest_bf16 = 0;
  for (const Shape& s : shapes) {
    if (s.type == WeightType::kBF16) largest_bf16 = std::max(largest_bf16, s.rows * s.cols);
  }
  const Pools pools = MakePools(largest_bf16);
  std::vector<std::vector<Matrix>> copies;
  copies.reserve(shapes.size());
  for (const Shape& s : shapes) copies.push_back(Copies(pools, s));

  benchmark::AddCustomContext("k3_all_threads", std::to_string(all_threads));
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    for (Isa isa : isas) {
      for (int th : thread_counts) {
        for (int T : kRowCounts) {
          if (isa == Isa::kScalar && s.rows * s.cols * T > kScalarMaxWork) continue;
          // A wave needs distinct copies: MXFP4 experts that rotate, on more than one thread.
          const bool waves = s.type == WeightType::kMXFP4 && !s.in_cache && th > 1 &&
                             static_cast<int64_t>(copies[i].size()) >= kWave;
          for (const int64_t wave : {int64_t{0}, kWave}) {
            if (wave > 0 && !waves) continue;
            const std::string name = Name(wave > 0 ? "experts" : "matmul", s, T, isa, th);
            benchmark::RegisterBenchmark(
                name.c_str(),
                [c = &copies[i], T, isa, th, wave, name](benchmark::State& st) {
                  BmMatMul(st, c, T, isa, th, wave, name);
                })
                ->UseRealTime()
                ->Unit(benchmark::kMicrosecond);
          }
        }
      }
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  PrintSummary(shapes, isas, thread_counts);
  return 0;
}
