// Router logits in double (MODEL.md §3.6): out[r] = Σ_i double(w[r][i]) · double(x[i]), summed in
// ascending i, one accumulator per row, each term a separate multiply then add. Unlike MatMul's
// 16-lane contract, the order inside a row is the model's own; speed comes only from doing
// several ROWS at once (SIMD lanes = rows) and from spreading row blocks over the compute
// threads, so every ISA path and thread count gives the same bits (tested).
#pragma once

#include "k3run/kernels/matmul.h"

namespace k3::kernels {

// w: BF16 or F32 [rows][cols] (validated by the caller); out [rows].
void RouterLogits(const Matrix& w, const float* x, double* out);

namespace internal {
// Rows [r0, r1). The AVX-512 body lanes 8 rows and transposes 8×8 blocks in registers; AVX2
// machines use the scalar body (same bits).
void RouterRowsScalar(const Matrix& w, const float* x, double* out, int64_t r0, int64_t r1);
void RouterRowsAvx512(const Matrix& w, const float* x, double* out, int64_t r0, int64_t r1);
}  // namespace internal

}  // namespace k3::kernels
