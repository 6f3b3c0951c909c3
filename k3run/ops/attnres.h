// Attention-residual aggregation (MODEL.md §3.3 "AttnRes").
//
// Per token: each source's key is its RMSNorm WITHOUT gain, dotted with the folded vector
// fold = norm_w ⊙ proj_w (fp32 product); the scores go through the shared softmax; the output is
// the p-weighted sum of the RAW sources in list order (snapshots oldest first, running prefix
// last), accumulated in fp32.
#pragma once

#include <cstdint>

namespace k3::ops {

// fold_i = norm_i·proj_i (fp32). Done by the caller once per layer (or at load).
void FoldAttnRes(const float* norm, const float* proj, int64_t E, float* fold);

// sources: m pointers to E floats each; out [E] must not alias a source.
//   inv_k = fp32(1/sqrt(Σ s_i²/E + eps)) (double sum), score_k = fp32(Σ double(fp32(s_i·inv_k))·f_i)
void AttnRes(const float* const* sources, int64_t m, const float* fold, int64_t E, float eps,
             float* out);

// AttnRes of R rows that share fold, m sources each: sources [R·m], row r's at [r·m, r·m + m);
// out[r] gets row r's result, the bits of AttnRes on those sources alone. The rows' 2·R·m double
// sums advance together (each a serial chain in its own order), so their adds overlap where one
// row's m sums would wait on the add latency.
void AttnResRows(const float* const* sources, int64_t R, int64_t m, const float* fold, int64_t E,
                 float eps, float* const* out);

}  // namespace k3::ops
