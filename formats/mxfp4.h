// MXFP4: the bytes of the routed experts (spec/MODEL.md §4, DESIGN.md §8).
//
// Goals: the one place in k3 that knows how an MXFP4 value is stored. A logical [rows][cols]
// matrix is a U8 `weight_packed` [rows][cols/2] (two E2M1 codes per byte, LOW nibble = EVEN
// element, bit 3 of a code is the sign) plus a U8 E8M0 `weight_scale` [rows][cols/32] (one
// power-of-two scale 2^(byte − 127) per group of 32 consecutive elements of a row).
// Decoding is exact: every value is E2M1[code] · 2^(scale − 127) in fp32; scale byte 255 (NaN in
// the OCP spec) decodes to zeros, so the group contributes nothing.
// Encoding (for synthetic checkpoints) reproduces the quantiser of the original lineage
// (MODEL.md §6.2): exponent = floor(log2(amax)) − 2 computed exactly (frexp), scale byte
// = exponent + 127 clamped to 0..254 (255 is never written), nearest E2M1 magnitude with ties
// going to the LOWER code; an all-zero group gets scale 127 and codes 0.
// Non-goals: matrix kernels (k3run), other micro-scaling formats (MXFP6/8), group sizes other
// than 32. Evolution: a new group size or element type would be a new set of functions, never a
// flag on these.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace k3::mxfp4 {

inline constexpr int kGroupSize = 32;
inline constexpr int kBytesPerGroup = kGroupSize / 2;  // packed bytes of one group
inline constexpr uint8_t kScaleNaN = 255;               // decodes to zero; never written
inline constexpr uint8_t kScaleMax = 254;
inline constexpr uint8_t kScaleOne = 127;               // 2^0: the all-zero group's scale

// E2M1 code → value: 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6; 8..15 the same negated (8 is −0).
inline constexpr std::array<float, 16> kE2M1 = {
    0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// 2^(scale − 127) as an exact fp32 (scale 0 is the subnormal 2^−127); 0 for kScaleNaN.
float ScaleValue(uint8_t scale);

// The exact value of element i of a packed row with per-group scales.
float DecodeElement(const uint8_t* packed_row, const uint8_t* scale_row, size_t i);

// Decodes `cols` elements of one row (cols a multiple of 32).
void DecodeRow(const uint8_t* packed_row, const uint8_t* scale_row, size_t cols, float* out);

// The E2M1 code nearest to `magnitude` (≥ 0, already divided by the group scale), ties to the
// lower code, saturating at 6 (code 7). Returns 0..7.
uint8_t NearestMagnitudeCode(float magnitude);

// The scale byte the encoder chooses for a group whose largest |x| is `amax`: 127 for 0 (and for
// non-finite input, which the encoder treats as 0), else clamp(floor(log2(amax)) − 2 + 127, 0,
// 254).
uint8_t ScaleForAmax(float amax);

// Quantises one group of 32 values into 16 packed bytes and a scale byte. Non-finite inputs
// are treated as 0 (the synthetic generator never produces them). A value whose magnitude
// rounds to 0 gets code 0 (never the −0 code 8).
void EncodeGroup(const float* x, uint8_t* packed16, uint8_t* scale);

// Quantises one row (cols a multiple of 32): packed_row gets cols/2 bytes, scale_row cols/32.
void EncodeRow(const float* x, size_t cols, uint8_t* packed_row, uint8_t* scale_row);

}  // namespace k3::mxfp4
