// Internals of k3run/kernels shared by the per-ISA bodies and the dispatcher. Not for use
// outside k3run/kernels (and its tests).
//
// Why this header has no inline functions: matmul_avx2.cpp and matmul_avx512.cpp are compiled
// with -mavx2/-mavx512f. An inline function (or template) emitted in those files could be
// picked by the linker for the portable callers too and run AVX code on a CPU without it. So
// shared code lives in portable files and is only declared here, and the ISA files call no
// inline function or template from any header (not even the ones in matmul.h or <algorithm>).
#pragma once

#include <cstdint>
#include <string>

#include "k3run/kernels/matmul.h"

namespace k3::kernels::internal {

// The matmul tiles' prefetch (matmul_avx2.cpp, matmul_avx512.cpp): a tile prefetches the next
// block of rows only if the block fits in kMaxPrefetchBytes, so the prefetched bytes do not
// evict x from L1; longer rows are prefetched in place, kInRowAheadBytes ahead in each row.
// Blocks of short rows (an expert's MXFP4 rows of 256 columns: 128 bytes) are fetched several
// blocks on, at least kShortRowsAheadBytes ahead: one block is less than the DRAM latency.
// Constants, not functions: nothing here is emitted as code.
inline constexpr int64_t kMaxPrefetchBytes = 16 << 10;
inline constexpr int64_t kInRowAheadBytes = 2048;
inline constexpr int64_t kShortRowsAheadBytes = 4096;

// Wide calls (prefill) give the bodies activation rows in blocks of about kActivationBlockBytes
// (at least kMinActivationBlock rows: whole tiles of 4 and of 6), so that a block stays in L2
// while a block of weight rows reads it, instead of streaming all T rows from L3 for every few
// weight rows (matmul.cpp's TiledRows; router_dot.cpp). ActivationBlockRows(cols): that many
// rows of `cols` floats.
inline constexpr int64_t kActivationBlockBytes = 384 << 10;
inline constexpr int64_t kMinActivationBlock = 24;
int64_t ActivationBlockRows(int64_t cols);

// A kernel called against its contract: logs "a bug in the caller: msg" and aborts.
[[noreturn]] void Die(const std::string& msg);

// The exact fp32 MXFP4 weight for every (scale byte, nibble): Mxfp4Lut()[s][c] =
// E2M1[c] · 2^(s−127), [255][c] = E2M1[c]·0. Row c|8 is the bitwise negation of row c (sign
// bit), which the AVX2 path relies on. 64-byte aligned rows so a row is one AVX-512 load.
struct alignas(64) Mxfp4LutRow {
  float v[16];
};
const Mxfp4LutRow* Mxfp4Lut();  // 256 rows, built once, thread-safe

// At least n floats, 64-byte aligned, owned by the calling thread and kept for its next calls
// (so a hot loop allocates nothing): what it held is garbage after the thread's next call. For
// a body's own copy of its activations (the AVX-512 MXFP4 rows take x in their decode's lane
// order); never held across a call to another kernel.
float* MatMulScratch(int64_t n);

// Computes output rows [r_begin, r_end) for all T activation rows, by the contract in
// matmul.h. The Matrix has passed ValidateMatrix. One function per ISA; the dispatcher in
// matmul.cpp is the only caller.
using RowsFn = void (*)(const Matrix& w, const float* x, int64_t T, float* y, int64_t r_begin,
                        int64_t r_end);
void MatMulRowsScalar(const Matrix& w, const float* x, int64_t T, float* y, int64_t r_begin,
                      int64_t r_end);
void MatMulRowsAvx2(const Matrix& w, const float* x, int64_t T, float* y, int64_t r_begin,
                    int64_t r_end);
void MatMulRowsAvx512(const Matrix& w, const float* x, int64_t T, float* y, int64_t r_begin,
                      int64_t r_end);

// Router logits (router_dot.h) for weight rows [r_begin, r_end) and T activation rows x
// [T][cols]: out[t·w.rows + r] = Σ_i double(w[r][i])·double(x[t][i]) in ascending i, one
// accumulator per (t, r). BF16 or F32 weights. One function per ISA; router_dot.cpp is the only
// caller. The SIMD bodies hand rows left over from their row groups to RouterRowsScalar.
using RouterRowsFn = void (*)(const Matrix& w, const float* x, int64_t T, double* out,
                              int64_t r_begin, int64_t r_end);
void RouterRowsScalar(const Matrix& w, const float* x, int64_t T, double* out, int64_t r_begin,
                      int64_t r_end);
void RouterRowsAvx2(const Matrix& w, const float* x, int64_t T, double* out, int64_t r_begin,
                    int64_t r_end);
void RouterRowsAvx512(const Matrix& w, const float* x, int64_t T, double* out, int64_t r_begin,
                      int64_t r_end);

// MatMulTransposedOnThisThread (transposed.h): the scalar reference for columns [j_begin, j_end)
// (the SIMD bodies hand it the columns left over from their 16- or 8-column blocks), and one
// body per ISA for all columns.
void TransposedColsScalar(const Matrix& w, const float* x, int64_t x_stride, int64_t T, float* y,
                          int64_t j_begin, int64_t j_end);
void TransposedColsAvx2(const Matrix& w, const float* x, int64_t x_stride, int64_t T, float* y);
void TransposedColsAvx512(const Matrix& w, const float* x, int64_t x_stride, int64_t T, float* y);

}  // namespace k3::kernels::internal
