// bf16 ⇄ fp32 conversions (matmul.h): widening is exact; narrowing rounds to nearest even.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "k3run/kernels/matmul.h"

namespace k3::kernels {
namespace {

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(Bf16, WideningPutsBitsInTheHighHalf) {
  EXPECT_EQ(Bf16ToF32(0x3F80), 1.0f);
  EXPECT_EQ(Bf16ToF32(0xC000), -2.0f);
  EXPECT_EQ(Bf16ToF32(0x0001), FromBits(0x00010000u));  // a subnormal stays exact
  EXPECT_TRUE(std::isinf(Bf16ToF32(0x7F80)));
  EXPECT_TRUE(std::isnan(Bf16ToF32(0x7FC1)));
}

TEST(Bf16, NarrowingRoundsToNearestEven) {
  EXPECT_EQ(F32ToBf16RoundNearestEven(1.0f), 0x3F80);
  EXPECT_EQ(F32ToBf16RoundNearestEven(FromBits(0x3F807FFFu)), 0x3F80);  // below half: down
  EXPECT_EQ(F32ToBf16RoundNearestEven(FromBits(0x3F808001u)), 0x3F81);  // above half: up
  EXPECT_EQ(F32ToBf16RoundNearestEven(FromBits(0x3F808000u)), 0x3F80);  // tie, even: stays
  EXPECT_EQ(F32ToBf16RoundNearestEven(FromBits(0x3F818000u)), 0x3F82);  // tie, odd: up
  EXPECT_EQ(F32ToBf16RoundNearestEven(-0.0f), 0x8000);
}

TEST(Bf16, NarrowingOverflowsToInfAndKeepsNaN) {
  EXPECT_EQ(F32ToBf16RoundNearestEven(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(F32ToBf16RoundNearestEven(-std::numeric_limits<float>::infinity()), 0xFF80);
  // A NaN whose payload sits only in the low half must not round into inf.
  const uint16_t nan = F32ToBf16RoundNearestEven(FromBits(0x7F800001u));
  EXPECT_TRUE(std::isnan(Bf16ToF32(nan))) << std::hex << nan;
  EXPECT_EQ(F32ToBf16RoundNearestEven(FromBits(0xFFC00000u)), 0xFFC0);
}

TEST(Bf16, RoundTripOfEveryBf16IsIdentity) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    if (std::isnan(Bf16ToF32(h))) continue;
    ASSERT_EQ(F32ToBf16RoundNearestEven(Bf16ToF32(h)), h) << std::hex << b;
  }
}

}  // namespace
}  // namespace k3::kernels
