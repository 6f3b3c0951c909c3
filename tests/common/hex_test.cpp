#include "common/hex.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace k3 {
namespace {

TEST(Hex, EncodeIsLowercaseInMemoryOrder) {
  const uint8_t bytes[] = {0x00, 0x01, 0xab, 0xCD, 0xff, 0x10};
  EXPECT_EQ(HexEncode(bytes, sizeof(bytes)), "0001abcdff10");
  EXPECT_EQ(HexEncode(bytes, 0), "");
}

TEST(Hex, AppendHexByteLowerByDefaultUpperOnRequest) {
  std::string out = "%";
  AppendHexByte(out, 0x2f);
  AppendHexByte(out, 0xe9, HexCase::kUpper);
  AppendHexByte(out, 0x0a);
  EXPECT_EQ(out, "%2fE90a");
}

TEST(Hex, UintIsZeroPaddedToTheWidthAndKeepsOnlyItsLowBits) {
  EXPECT_EQ(HexUint(0x3f80, 4), "3f80");
  EXPECT_EQ(HexUint(0x1, 8), "00000001");
  EXPECT_EQ(HexUint(0xfedcba9876543210, 16), "fedcba9876543210");
  EXPECT_EQ(HexUint(0x12345, 4), "2345");
  EXPECT_EQ(HexUint(0xff, 0), "");
}

TEST(Hex, IsLowerHexNeedsTheExactLengthAndLowercase) {
  EXPECT_TRUE(IsLowerHex("0123456789abcdef", 16));
  EXPECT_FALSE(IsLowerHex("0123456789abcdef", 15));
  EXPECT_FALSE(IsLowerHex("0123456789ABCDEF", 16));
  EXPECT_FALSE(IsLowerHex("0123456789abcdeg", 16));
  EXPECT_TRUE(IsLowerHex("", 0));
}

TEST(Hex, ParseRoundTripsHexUint) {
  for (const uint64_t v : {uint64_t{0}, uint64_t{1}, uint64_t{0xdeadbeef}, ~uint64_t{0}}) {
    uint64_t back = 7;
    ASSERT_TRUE(ParseHexUint(HexUint(v, 16), 16, &back));
    EXPECT_EQ(back, v);
  }
  uint64_t bits = 0;
  ASSERT_TRUE(ParseHexUint("3f80", 4, &bits));
  EXPECT_EQ(bits, 0x3f80u);
}

TEST(Hex, ParseRefusesOtherLengthsCaseAndCharactersLeavingTheOutputAlone) {
  uint64_t v = 42;
  EXPECT_FALSE(ParseHexUint("3f80", 8, &v));      // width says another element size
  EXPECT_FALSE(ParseHexUint("3F80", 4, &v));      // uppercase is not how k3 writes it
  EXPECT_FALSE(ParseHexUint("3f8x", 4, &v));
  EXPECT_FALSE(ParseHexUint("", 0, &v));
  EXPECT_FALSE(ParseHexUint("00000000000000000", 17, &v));  // more than 64 bits
  EXPECT_EQ(v, 42u);
}

}  // namespace
}  // namespace k3
