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

}  // namespace k3::ops
