// y = Wᵀ·x without transposing W. The absorbed MLA query (ops/mla.h, step 2) multiplies each
// head's q_nope by W_UK[h]ᵀ, where W_UK[h] is an [n][c] row slice of kv_b_proj: reading the
// slice by columns here replaces a per-call transposed copy of every head (a cache of them
// would cost H·c·n weights per MLA layer of memory instead).
//
// Contract: the MatMul contract of matmul.h with the summed index i running over W's ROWS:
// y[t][j] = 16 fp32 lanes a_l from +0.0f, a_{i mod 16} = fmaf(W[i][j], x[t][i], a_{i mod 16}) for
// i = 0 … rows−1 ascending, then the fixed tree. So MatMulTransposedOnThisThread(W) is bit-identical
// to MatMul of the explicit transpose, on every ISA path (the SIMD paths put 16 or 8 columns j in
// a register and keep the 16 lanes over i in 16 registers).
// F32 and BF16 weights (MXFP4's scales run along rows: a caller bug, message and abort).
// Runs on the calling thread: the MLA spreads heads over the compute threads.
#pragma once

#include <cstdint>

#include "k3run/kernels/matmul.h"

namespace k3::kernels {

// y[t][j] = Σ_{i<rows} W[i][j]·x[t·x_stride + i] for t < T, j < cols; y: [T][cols] fp32, not
// overlapping x or W. x_stride ≥ rows (the rows of x may be spaced, as q_nope is per head).
void MatMulTransposedOnThisThread(const Matrix& w, const float* x, int64_t x_stride, int64_t T,
                                  float* y);

}  // namespace k3::kernels
