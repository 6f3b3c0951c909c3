// kernels/argmax.h: ArgMax gives exactly the defining loop's index, for the edge cases that loop
// defines (NaN, ±0, ±inf, ties, lengths around the 16-wide blocks) and for random rows.
#include "k3run/kernels/argmax.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace k3::kernels {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

int32_t Both(const std::vector<float>& x) {
  const int32_t want = ArgMaxReference(x.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(ArgMax(x.data(), static_cast<int64_t>(x.size())), want);
  return want;
}

TEST(ArgMax, EdgeCasesAsTheDefiningLoop) {
  EXPECT_EQ(Both({3.0f}), 0);
  EXPECT_EQ(Both({kNan, 1.0f, 2.0f}), 0);        // a NaN first is never beaten
  EXPECT_EQ(Both({1.0f, kNan, 2.0f, kNan}), 2);  // later NaNs are never chosen
  EXPECT_EQ(Both({-0.0f, 0.0f}), 0);             // equal: the first
  EXPECT_EQ(Both({-1.0f, 0.0f, -0.0f}), 1);
  EXPECT_EQ(Both({-kInf, -kInf, -kInf}), 0);
  EXPECT_EQ(Both({1.0f, kInf, 2.0f, kInf}), 1);
  // Ties and a maximum in the tail, past the last whole block of 16, and in the last block.
  for (int64_t n : {15, 16, 17, 31, 32, 33, 100, 163840}) {
    for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
      std::vector<float> x(static_cast<size_t>(n), -1.0f);
      x[static_cast<size_t>(at)] = 5.0f;
      EXPECT_EQ(Both(x), at) << n << " " << at;
      x[static_cast<size_t>(n - 1)] = 5.0f;  // a tie after it: still the first
      EXPECT_EQ(Both(x), at) << n << " " << at;
    }
  }
}

TEST(ArgMax, RandomRowsWithSpecialValuesAsTheDefiningLoop) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  const float specials[] = {kNan, 0.0f, -0.0f, kInf, -kInf, 1.5f};
  for (int t = 0; t < 4000; ++t) {
    std::vector<float> x(static_cast<size_t>(1 + rng() % 300));
    for (float& v : x) {
      v = normal(rng);
      if (rng() % 20 == 0) v = specials[rng() % 6];
    }
    if (t % 9 == 0) x[0] = kNan;
    Both(x);
  }
  std::vector<float> vocab(163840);  // the released vocabulary
  for (float& v : vocab) v = normal(rng);
  Both(vocab);
}

}  // namespace
}  // namespace k3::kernels
