// The dtype table: every safetensors dtype string K3 accepts, its size, and the round trip
// between string and enum. Expected sizes are written out here, not derived from the table.
#include <gtest/gtest.h>

#include <string>

#include "formats/dtype.h"

namespace k3 {
namespace {

struct Expected {
  const char* name;
  DType type;
  uint32_t size;
};

constexpr Expected kExpected[] = {
    {"BOOL", DType::kBOOL, 1},       {"U8", DType::kU8, 1},
    {"I8", DType::kI8, 1},           {"F8_E4M3", DType::kF8_E4M3, 1},
    {"F8_E5M2", DType::kF8_E5M2, 1}, {"F8_E8M0", DType::kF8_E8M0, 1},
    {"I16", DType::kI16, 2},         {"U16", DType::kU16, 2},
    {"F16", DType::kF16, 2},         {"BF16", DType::kBF16, 2},
    {"I32", DType::kI32, 4},         {"U32", DType::kU32, 4},
    {"F32", DType::kF32, 4},         {"F64", DType::kF64, 8},
    {"I64", DType::kI64, 8},         {"U64", DType::kU64, 8},
};

TEST(DTypeTest, ParsesEverySupportedName) {
  for (const Expected& e : kExpected) {
    const std::optional<DType> t = ParseDType(e.name);
    ASSERT_TRUE(t.has_value()) << e.name;
    EXPECT_EQ(*t, e.type) << e.name;
  }
}

TEST(DTypeTest, NamesRoundTrip) {
  for (const Expected& e : kExpected) EXPECT_STREQ(DTypeName(e.type), e.name);
}

TEST(DTypeTest, SizesAreTheElementWidths) {
  for (const Expected& e : kExpected) EXPECT_EQ(DTypeSize(e.type), e.size) << e.name;
}

TEST(DTypeTest, RejectsUnknownAndNearMissNames) {
  for (const char* bad : {"", "bf16", "F4", "F6_E2M3", "C64", "F8_E4M3FNUZ", "BF16 "}) {
    EXPECT_FALSE(ParseDType(bad).has_value()) << "\"" << bad << "\"";
  }
  EXPECT_FALSE(ParseDType(std::string_view("U8\0", 3)).has_value());
}

TEST(DTypeTest, SupportedListNamesEveryDtype) {
  const std::string list(SupportedDTypeList());
  for (const Expected& e : kExpected) {
    EXPECT_NE(list.find(e.name), std::string::npos) << e.name;
  }
}

}  // namespace
}  // namespace k3
