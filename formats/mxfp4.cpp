#include "formats/mxfp4.h"

#include <cmath>

namespace k3::mxfp4 {

float ScaleValue(uint8_t scale) {
  if (scale == kScaleNaN) return 0.0f;
  // ldexp of 1 by an integer in [-127, 127] is exact in fp32 (2^-127 is subnormal but exact).
  return std::ldexp(1.0f, static_cast<int>(scale) - 127);
}

float DecodeElement(const uint8_t* packed_row, const uint8_t* scale_row, size_t i) {
  const uint8_t byte = packed_row[i / 2];
  const uint8_t code = (i % 2 == 0) ? (byte & 0x0F) : (byte >> 4);
  return kE2M1[code] * ScaleValue(scale_row[i / kGroupSize]);
}

void DecodeRow(const uint8_t* packed_row, const uint8_t* scale_row, size_t cols, float* out) {
  for (size_t i = 0; i < cols; ++i) out[i] = DecodeElement(packed_row, scale_row, i);
}

uint8_t NearestMagnitudeCode(float m) {
  // Midpoints between consecutive E2M1 magnitudes; `<=` sends an exact tie to the lower code.
  // Branch-free: the code is the number of midpoints strictly below m (NaN counts as 0).
  return static_cast<uint8_t>((m > 0.25f) + (m > 0.75f) + (m > 1.25f) + (m > 1.75f) +
                              (m > 2.5f) + (m > 3.5f) + (m > 5.0f));
}

uint8_t ScaleForAmax(float amax) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return kScaleOne;
  int e = 0;
  std::frexp(amax, &e);  // amax = f · 2^e, f in [0.5, 1): floor(log2(amax)) = e − 1 exactly
  const int biased = (e - 1) - 2 + 127;
  if (biased < 0) return 0;
  if (biased > kScaleMax) return kScaleMax;
  return static_cast<uint8_t>(biased);
}

void EncodeGroup(const float* x, uint8_t* packed16, uint8_t* scale) {
  float amax = 0.0f;
  for (int i = 0; i < kGroupSize; ++i) {
    const float a = std::isfinite(x[i]) ? std::fabs(x[i]) : 0.0f;
    if (a > amax) amax = a;
  }
  const uint8_t s = ScaleForAmax(amax);
  *scale = s;
  // Multiplying by the power of two 2^−exponent (exponent in −127..127, so the factor is a
  // normal float) is exact here: amax · 2^−exponent < 8, and results that fall into the
  // subnormal range are far below the first midpoint 0.25. The tie tests see the true ratio.
  const float inv = std::ldexp(1.0f, 127 - static_cast<int>(s));
  for (int i = 0; i < kGroupSize; i += 2) {
    uint8_t codes[2];
    for (int j = 0; j < 2; ++j) {
      const float v = std::isfinite(x[i + j]) ? x[i + j] : 0.0f;
      const uint8_t mag = NearestMagnitudeCode(std::fabs(v) * inv);
      codes[j] = static_cast<uint8_t>(mag | ((v < 0.0f && mag != 0) ? 0x8 : 0x0));
    }
    packed16[i / 2] = static_cast<uint8_t>(codes[0] | (codes[1] << 4));
  }
}

void EncodeRow(const float* x, size_t cols, uint8_t* packed_row, uint8_t* scale_row) {
  for (size_t g = 0; g < cols / kGroupSize; ++g) {
    EncodeGroup(x + g * kGroupSize, packed_row + g * kBytesPerGroup, scale_row + g);
  }
}

}  // namespace k3::mxfp4
