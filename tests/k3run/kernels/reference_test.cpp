// The scalar path against an independent float64 reference (dequantise, exact double products,
// double sum). Two bounds, both asserted per element:
//  - the contract's tolerance |got − want| ≤ 1e-5 + 1e-4·|want| (DESIGN.md §7);
//  - a rigorous one: each lane is a chain of m = ceil(cols/16) fmaf roundings and the tree adds
//    4 more additions on the path to lane 0, so by the standard recursive-summation bound
//    (Higham, Accuracy and Stability, §4.2, with exact products in each fmaf)
//    |got − want| ≤ γ_k · Σ|w_i·x_i|, k = m + 4, γ_k = k·u/(1 − k·u), u = 2^−24
//    (plus the double reference's own error, ≤ cols·2^−53·Σ|w x|, added in).
//    For cols = 1024 that is ≈ 4e-6 relative to Σ|w x|: far tighter than 1e-4 wherever the
//    sum does not cancel.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tests/k3run/kernels/kernel_test_util.h"

namespace k3::kernels::testing {
namespace {

void CheckAgainstFloat64(WeightType type, int64_t rows, int64_t cols, int64_t T, uint64_t seed) {
  const OwnedMatrix m = RandomMatrix(type, rows, cols, seed);
  const std::vector<float> x = RandomActivations(T, cols, seed + 1);
  const std::vector<float> got = RunMatMul(m, x, T, Isa::kScalar, 1);
  const double u = 0x1p-24;
  const double k = static_cast<double>((cols + 15) / 16 + 4);
  const double gamma = k * u / (1.0 - k * u) + static_cast<double>(cols) * 0x1p-53;
  double worst_ratio = 0.0;  // observed error ÷ rigorous bound, reported for the record
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double want = 0.0, abs_sum = 0.0;
      for (int64_t i = 0; i < cols; ++i) {
        const double p =
            WeightValue(m, r, i) * static_cast<double>(x[static_cast<size_t>(t * cols + i)]);
        want += p;
        abs_sum += std::fabs(p);
      }
      const double y = got[static_cast<size_t>(t * rows + r)];
      const double err = std::fabs(y - want);
      const double rigorous = gamma * abs_sum;
      ASSERT_LE(err, 1e-5 + 1e-4 * std::fabs(want))
          << TypeName(type) << " [" << rows << "][" << cols << "] t=" << t << " r=" << r
          << ": contract tolerance exceeded";
      ASSERT_LE(err, rigorous) << TypeName(type) << " [" << rows << "][" << cols << "] t=" << t
                               << " r=" << r << ": rigorous fp32 summation bound exceeded";
      if (rigorous > 0) worst_ratio = std::max(worst_ratio, err / rigorous);
    }
  }
  ::testing::Test::RecordProperty(std::string(TypeName(type)) + "_worst_error_over_bound",
                                  std::to_string(worst_ratio));
}

TEST(ScalarVsFloat64, F32WithinBounds) {
  CheckAgainstFloat64(WeightType::kF32, 31, 1, 2, 11);
  CheckAgainstFloat64(WeightType::kF32, 31, 45, 3, 12);
  CheckAgainstFloat64(WeightType::kF32, 17, 513, 2, 13);
}

TEST(ScalarVsFloat64, Bf16WithinBounds) {
  CheckAgainstFloat64(WeightType::kBF16, 31, 45, 3, 21);
  CheckAgainstFloat64(WeightType::kBF16, 17, 513, 2, 22);
}

TEST(ScalarVsFloat64, Mxfp4WithinBounds) {
  CheckAgainstFloat64(WeightType::kMXFP4, 31, 64, 3, 31);
  CheckAgainstFloat64(WeightType::kMXFP4, 17, 512, 2, 32);
}

// An exactly representable case with no rounding at all: the kernel must be exact.
TEST(ScalarVsFloat64, SmallIntegersAreExact) {
  OwnedMatrix m;
  m.type = WeightType::kF32;
  m.rows = 2;
  m.cols = 40;
  for (int i = 0; i < 80; ++i) m.f32.push_back(static_cast<float>(i % 7) - 3.0f);
  std::vector<float> x;
  for (int i = 0; i < 40; ++i) x.push_back(static_cast<float>(i % 5));
  const std::vector<float> y = RunMatMul(m, x, 1, Isa::kScalar, 1);
  for (int64_t r = 0; r < 2; ++r) {
    double want = 0;
    for (int64_t i = 0; i < 40; ++i)
      want += m.f32[static_cast<size_t>(r * 40 + i)] * x[static_cast<size_t>(i)];
    EXPECT_EQ(y[static_cast<size_t>(r)], want) << "row " << r;
  }
}

}  // namespace
}  // namespace k3::kernels::testing
