// Router logits in double (MODEL.md §3.6): out[r] = Σ_i double(w[r][i]) · double(x[i]), summed in
// ascending i, one accumulator per row starting at +0.0, each term one rounding of
// acc + w·x. Unlike MatMul's 16-lane contract, the order inside a row is the model's own: no
// reordering, splitting or tree reduction of a row, on any path.
//
// Goals: those bits on every ISA path and thread count (tested against an independent loop);
// speed only from working on many rows at once. Non-goals: other weight types than BF16 and F32
// (the caller validates the gate), NaN payloads (not compared), sharing MatMul's kernels.
//
// Design. One dispatch point (kernels::ActiveIsa(), like MatMul) picks the row body:
//  - scalar (K3_ISA=scalar, CPUs without AVX2): 8 rows interleaved, 8 scalar accumulators;
//  - AVX-512F (router_dot_avx512.cpp): lane l of a zmm accumulator is one row; 2 groups of 8
//    rows advance through the columns together, so 2 independent add chains hide the latency;
//    the 8 rows' values of a column reach one vector by an in-register dword transpose (bf16
//    columns 2m and 2m+1 share a dword: `<< 16` and `& 0xFFFF0000` widen them exactly to fp32),
//    then cvtps_pd. Each column is one fma per vector: the product of a bf16/f32 and an f32
//    is exact in double, so fma(w, x, acc) is the same single rounding as acc + w·x;
//  - AVX2+FMA (router_dot_avx2.cpp): the same with each 8-row group in two ymm accumulators.
// Ragged ends: rows past the last whole 8-row group go to the scalar body, columns past the last
// whole step of 8 are finished per row with scalar code, in order. Rows are cut into chunks of
// 64 (whole groups of every body) that the compute threads claim (thread_pool.h); each row is
// computed the same way by whichever thread owns it, so the thread count never changes a bit.
//
// Measured (AMD EPYC with AVX-512, 2 cores shared with other jobs; k3_bench_kernels
// --benchmark_filter=Router --benchmark_repetitions=5, medians, ns per call, BF16, 1 thread):
//   [896][768] (bench preset, 92 calls per token): scalar 308,100  AVX2 90,900  AVX-512 80,400
//   (3.8x); [896][7168] (released model): scalar 2,839,500  AVX2 825,800  AVX-512 737,100 (3.9x).
// Two threads halve each figure when the second core is free (896x768 AVX-512: 42,000 vs scalar
// 154,900, one case per process); with another job on that core they gain nothing. The
// scalar body is the code all paths ran before (303,700 / 2,885,500 ns at 1 thread, measured
// before this change).
// The earlier AVX-512 attempt (one 8-row group at a time, 8×8 transposes of doubles) was no
// faster than scalar: one dependent add chain and about twice the shuffle work per element.
// At -O2 GCC neither inlines the transpose helper nor unrolls the short loops of these bodies
// unless told to, and then keeps the accumulators in memory (hence always_inline and the unroll
// pragmas there).
#pragma once

#include "k3run/kernels/matmul.h"

namespace k3::kernels {

// w: BF16 or F32 [rows][cols] (validated by the caller); out [rows].
void RouterLogits(const Matrix& w, const float* x, double* out);
// T activation rows x [T][cols] → out [T][rows]: row t's sums are exactly RouterLogits(w, x_t)
// (the same bits on every path), with the weights read once for all T (AVX-512: each 8-row
// group's transposed columns feed up to 4 activation rows; AVX2 and scalar: row after row).
void RouterLogitsRows(const Matrix& w, const float* x, int64_t T, double* out);
// RouterLogitsRows's sums, same bits, on the calling thread only: for callers that spread
// independent products over the compute threads themselves (MLA's scores over the latent cache:
// the queries of a group of heads against one sequence's cache, k3run/ops/mla.h). Safe to call
// from inside ParallelChunks.
void RouterLogitsOnThisThread(const Matrix& w, const float* x, int64_t T, double* out);

}  // namespace k3::kernels
