// Router logits in double (MODEL.md §3.6): out[r] = Σ_i double(w[r][i]) · double(x[i]), summed in
// ascending i, one accumulator per row, each term a separate multiply then add. Unlike MatMul's
// 16-lane contract, the order inside a row is the model's own; speed comes only from working on
// several rows at once (8 interleaved accumulators hide the add latency) and from spreading row
// blocks over the compute threads, so the thread count never changes a bit (tested).
//
// One portable path for every ISA: an AVX-512 body with 8 rows per vector and in-register 8×8
// transposes was measured no faster on the bench preset (each vector accumulator is still one
// dependent add chain per column), so it was not kept.
#pragma once

#include "k3run/kernels/matmul.h"

namespace k3::kernels {

// w: BF16 or F32 [rows][cols] (validated by the caller); out [rows].
void RouterLogits(const Matrix& w, const float* x, double* out);


}  // namespace k3::kernels
