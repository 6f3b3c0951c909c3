#include "common/align.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace k3 {
namespace {

TEST(Align, AlignUpRoundsToTheNextMultiple) {
  EXPECT_EQ(AlignUp(0, 4096), 0u);
  EXPECT_EQ(AlignUp(1, 4096), 4096u);
  EXPECT_EQ(AlignUp(4096, 4096), 4096u);
  EXPECT_EQ(AlignUp(4097, 4096), 8192u);
  EXPECT_EQ(AlignUp(65, 64), 128u);
}

TEST(Align, AlignDownRoundsToThePreviousMultiple) {
  EXPECT_EQ(AlignDown(0, 4096), 0u);
  EXPECT_EQ(AlignDown(4095, 4096), 0u);
  EXPECT_EQ(AlignDown(4096, 4096), 4096u);
  EXPECT_EQ(AlignDown(8191, 4096), 4096u);
}

TEST(Align, AnyPositiveAlignmentNotOnlyPowersOfTwo) {
  EXPECT_EQ(AlignUp(10, 3), 12u);
  EXPECT_EQ(AlignDown(10, 3), 9u);
  EXPECT_EQ(AlignUp(7, 1), 7u);
}

TEST(Align, LargestValueInsideThePrecondition) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  // v <= UINT64_MAX - (a - 1): the largest v AlignUp accepts for a = 4096 rounds without wrapping.
  EXPECT_EQ(AlignUp(kMax - 4095, 4096), kMax - 4095);
  EXPECT_EQ(AlignUp(uint64_t{1} << 50, 4096), uint64_t{1} << 50);
  EXPECT_EQ(AlignDown(kMax, 4096), kMax - 4095);
}

TEST(Align, UsableInConstantExpressions) {
  static_assert(AlignUp(100, 64) == 128);
  static_assert(AlignDown(100, 64) == 64);
}

}  // namespace
}  // namespace k3
