// The short causal depthwise convolution of KDA (MODEL.md §3.4 step 2), with carried history.
#pragma once

#include <cstdint>

namespace k3::ops {

// x [T][C] raw inputs, taps w [C][K], history hist [C][K−1] (each channel's K−1 previous RAW
// inputs, oldest first; zeros at sequence start), y [T][C].
// acc = w[c][K−1]·x_t + Σ_{j<K−1} w[c][j]·hist[c][j] (fp32, current tap first, then j ascending),
// y = SiLU(acc); then hist shifts left and takes x_t. Running T rows at once or one row at a time
// gives the same bits. y may alias x.
void ShortConv(const float* x, int64_t T, int64_t C, int64_t K, const float* w, float* hist,
               float* y);
// ShortConv of channels [c0, c1) only (rows still C apart): the same bits for those channels,
// the others untouched, so disjoint ranges can run on different threads.
void ShortConvChannels(const float* x, int64_t T, int64_t C, int64_t K, const float* w,
                       float* hist, float* y, int64_t c0, int64_t c1);

// The history update of ShortConv alone: hist as ShortConv over the same x leaves it.
void ShortConvPush(const float* x, int64_t T, int64_t C, int64_t K, float* hist);

}  // namespace k3::ops
