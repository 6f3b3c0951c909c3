// formats/mxfp4: hand-computed encodings and exact decodes (MODEL.md §4, DESIGN.md §8).
#include "formats/mxfp4.h"

#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

namespace k3::mxfp4 {
namespace {

struct Encoded {
  uint8_t packed[kBytesPerGroup];
  uint8_t scale;
};

Encoded Encode(const float (&x)[kGroupSize]) {
  Encoded e{};
  EncodeGroup(x, e.packed, &e.scale);
  return e;
}

TEST(Mxfp4, LowNibbleIsEvenElement) {
  float x[kGroupSize] = {};
  x[0] = 4.0f;  // amax 4 → floor(log2 4) − 2 = 0 → scale 127, code 6
  x[1] = 0.5f;  // code 1
  x[2] = -1.0f; // code 2 | sign = 10
  x[3] = 6.0f;  // code 7 (amax now 6 → still exponent 0)
  const Encoded e = Encode(x);
  EXPECT_EQ(e.scale, 127);
  EXPECT_EQ(e.packed[0], 0x16);  // low 6 (element 0), high 1 (element 1)
  EXPECT_EQ(e.packed[1], 0x7A);  // low 0xA (element 2), high 7 (element 3)
  for (int i = 2; i < kBytesPerGroup; ++i) EXPECT_EQ(e.packed[i], 0) << i;
}

TEST(Mxfp4, DecodeReadsLowNibbleAsEvenElement) {
  const uint8_t packed[kBytesPerGroup] = {0x16};
  const uint8_t scale[1] = {127};
  EXPECT_EQ(DecodeElement(packed, scale, 0), 4.0f);
  EXPECT_EQ(DecodeElement(packed, scale, 1), 0.5f);
}

TEST(Mxfp4, TiesGoToTheLowerCode) {
  // amax 4 keeps the scale at 2^0, so every magnitude below is compared as written.
  float x[kGroupSize] = {};
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 4.0f};
  for (int i = 0; i < 8; ++i) x[i] = ties[i];
  const Encoded e = Encode(x);
  ASSERT_EQ(e.scale, 127);
  // Expected codes: 0 (0), 1 (0.5), 2 (1), 3 (1.5), 4 (2), 5 (3), 6 (4), 6 (4).
  EXPECT_EQ(e.packed[0], 0x10);
  EXPECT_EQ(e.packed[1], 0x32);
  EXPECT_EQ(e.packed[2], 0x54);
  EXPECT_EQ(e.packed[3], 0x66);
}

TEST(Mxfp4, JustAboveATieRoundsUp) {
  EXPECT_EQ(NearestMagnitudeCode(std::nextafter(0.25f, 1.0f)), 1);
  EXPECT_EQ(NearestMagnitudeCode(std::nextafter(5.0f, 6.0f)), 7);
  EXPECT_EQ(NearestMagnitudeCode(100.0f), 7);  // saturates at 6
}

TEST(Mxfp4, ScaleFromGroupMaxIsFloorLog2MinusTwo) {
  EXPECT_EQ(ScaleForAmax(4.0f), 127);        // log2 4 = 2 → 0
  EXPECT_EQ(ScaleForAmax(7.99f), 127);       // floor(log2 7.99) = 2
  EXPECT_EQ(ScaleForAmax(8.0f), 128);        // 3 − 2 = 1
  EXPECT_EQ(ScaleForAmax(1.0f), 125);        // 0 − 2 = −2
  EXPECT_EQ(ScaleForAmax(0.02f), 119);       // floor(log2 0.02) = −6 → −8
  EXPECT_EQ(ScaleForAmax(std::ldexp(1.0f, -140)), 0);  // −142 clamps to byte 0
  EXPECT_EQ(ScaleForAmax(3.0e38f), 252);     // largest finite floats stay below 254
}

TEST(Mxfp4, ScaledGroupEncodesRelativeToItsScale) {
  float x[kGroupSize] = {};
  x[0] = 8.0f;   // amax 8 → scale 128 (2^1): 8/2 = 4 → code 6
  x[1] = -3.0f;  // −3/2 = −1.5 → code 3 | 8 = 0xB
  const Encoded e = Encode(x);
  EXPECT_EQ(e.scale, 128);
  EXPECT_EQ(e.packed[0], 0xB6);
  EXPECT_EQ(DecodeElement(e.packed, &e.scale, 0), 8.0f);
  EXPECT_EQ(DecodeElement(e.packed, &e.scale, 1), -3.0f);
}

TEST(Mxfp4, AllZeroGroupGetsScale127AndZeroCodes) {
  const float x[kGroupSize] = {};
  const Encoded e = Encode(x);
  EXPECT_EQ(e.scale, 127);
  for (uint8_t b : e.packed) EXPECT_EQ(b, 0);
}

TEST(Mxfp4, NegativeValueRoundingToZeroIsCodeZeroNotMinusZero) {
  float x[kGroupSize] = {};
  x[0] = 4.0f;
  x[1] = -0.1f;  // magnitude 0.1 ≤ 0.25 → 0, written as +0
  const Encoded e = Encode(x);
  EXPECT_EQ(e.packed[0], 0x06);
}

TEST(Mxfp4, ScaleByte255DecodesToZeros) {
  const uint8_t packed[kBytesPerGroup] = {0x77, 0xFF, 0x16};
  const uint8_t scale[1] = {kScaleNaN};
  float out[kGroupSize];
  DecodeRow(packed, scale, kGroupSize, out);
  for (float v : out) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(ScaleValue(kScaleNaN), 0.0f);
}

TEST(Mxfp4, ScaleValuesAreExactPowersOfTwo) {
  EXPECT_EQ(ScaleValue(127), 1.0f);
  EXPECT_EQ(ScaleValue(0), std::ldexp(1.0f, -127));  // subnormal, exact
  EXPECT_EQ(ScaleValue(254), std::ldexp(1.0f, 127));
  // Smallest product: 0.5 · 2^−127 = 2^−128 is still exact.
  const uint8_t packed[1] = {0x01};
  const uint8_t scale[1] = {0};
  EXPECT_EQ(DecodeElement(packed, scale, 0), std::ldexp(1.0f, -128));
}

TEST(Mxfp4, EncoderNeverWritesScale255) {
  float x[kGroupSize];
  for (float big : {1e38f, 3.4e38f, INFINITY, NAN}) {
    for (float& v : x) v = big;
    const Encoded e = Encode(x);
    EXPECT_NE(e.scale, kScaleNaN) << big;
  }
}

TEST(Mxfp4, RepresentableValuesRoundTripExactly) {
  float x[kGroupSize];
  for (int i = 0; i < kGroupSize; ++i) x[i] = kE2M1[static_cast<size_t>(i % 16)] * 0.25f;
  x[8] = 0.0f;  // −0 encodes as +0 by design
  uint8_t packed[kBytesPerGroup];
  uint8_t scale = 0;
  EncodeGroup(x, packed, &scale);
  EXPECT_EQ(scale, 125);  // amax 1.5 → floor(log2 1.5) − 2 = −2
  float out[kGroupSize];
  DecodeRow(packed, &scale, kGroupSize, out);
  for (int i = 0; i < kGroupSize; ++i) EXPECT_EQ(out[i], x[i]) << i;
}

}  // namespace
}  // namespace k3::mxfp4
