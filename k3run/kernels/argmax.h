// Greedy decoding's argmax over a row of logits: the index of the largest value, the first one
// when several are equal (+0 and −0 are equal), NaN never chosen (a NaN at index 0 makes the
// answer 0, as the plain loop `if (x[i] > x[best]) best = i` gives, which defines the result).
//
// Why a kernel: a server pass of 8 sequences chooses 8 tokens over a 163,840-entry vocabulary
// between two passes, while the engine reads no weight. The plain loop (a load, a compare and a
// branch per entry, dependent on the running best) took 0.17 ms a row, 0.9–1.9 ms of the
// engine's idle time between passes under 8 clients (scripts/bench-serve.sh); this one takes
// 0.04 ms, 4.1x less (`k3_bench_kernels --benchmark_filter=argmax --benchmark_repetitions=3`).
//
// Design: two passes. The first takes the maximum with 4 independent SSE2 max chains
// (_mm_max_ps(x, m) keeps m when x is NaN, so NaNs drop out; max is exact, so the order of the
// chains cannot change the value, and a ±0 tie cannot matter because the second pass compares
// with ==). The second finds the first index equal to it, 4 at a time. SSE2 is part of x86-64,
// so every ISA path runs the same code and no dispatch is needed; other CPUs run the loop.
#pragma once

#include <cstdint>

namespace k3::kernels {

// n ≥ 1.
int32_t ArgMax(const float* x, int64_t n);
// The defining loop, for tests and the benchmark.
int32_t ArgMaxReference(const float* x, int64_t n);

}  // namespace k3::kernels
