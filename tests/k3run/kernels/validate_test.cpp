// ValidateMatrix: one test per rule, each with a malformed matrix, checking the message names
// the tensor and the rule.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "k3run/kernels/matmul.h"

namespace k3::kernels {
namespace {

using ::testing::HasSubstr;

const std::vector<uint8_t> kBytes(4096, 0);

TEST(ValidateMatrix, WellFormedMatricesPass) {
  EXPECT_TRUE(ValidateMatrix({WeightType::kF32, 4, 7, kBytes.data(), nullptr}, "w").ok());
  EXPECT_TRUE(ValidateMatrix({WeightType::kBF16, 4, 7, kBytes.data(), nullptr}, "w").ok());
  EXPECT_TRUE(ValidateMatrix({WeightType::kMXFP4, 4, 64, kBytes.data(), kBytes.data()}, "w").ok());
  EXPECT_TRUE(ValidateMatrix({WeightType::kF32, 0, 7, nullptr, nullptr}, "w").ok());
}

TEST(ValidateMatrix, UnknownWeightType) {
  const Status st =
      ValidateMatrix({static_cast<WeightType>(9), 4, 4, kBytes.data(), nullptr}, "layers.3.mlp.w1");
  EXPECT_EQ(st.code(), Code::kInvalid);
  EXPECT_THAT(st.message(), HasSubstr("layers.3.mlp.w1"));
  EXPECT_THAT(st.message(), HasSubstr("unknown weight type 9"));
}

TEST(ValidateMatrix, NegativeShape) {
  const Status st = ValidateMatrix({WeightType::kF32, -1, 4, kBytes.data(), nullptr}, "q_proj");
  EXPECT_EQ(st.code(), Code::kInvalid);
  EXPECT_THAT(st.message(), HasSubstr("q_proj"));
  EXPECT_THAT(st.message(), HasSubstr("[-1][4]"));
}

TEST(ValidateMatrix, TooManyElements) {
  const Status st = ValidateMatrix(
      {WeightType::kBF16, int64_t{1} << 30, int64_t{1} << 11, kBytes.data(), nullptr}, "lm_head");
  EXPECT_EQ(st.code(), Code::kInvalid);
  EXPECT_THAT(st.message(), HasSubstr("lm_head"));
  EXPECT_THAT(st.message(), HasSubstr("2^40"));
}

TEST(ValidateMatrix, MissingData) {
  const Status st = ValidateMatrix({WeightType::kF32, 2, 3, nullptr, nullptr}, "o_proj");
  EXPECT_EQ(st.code(), Code::kInvalid);
  EXPECT_THAT(st.message(), HasSubstr("o_proj"));
  EXPECT_THAT(st.message(), HasSubstr("no weight data"));
}

TEST(ValidateMatrix, Mxfp4ColsNotMultipleOf32) {
  const Status st =
      ValidateMatrix({WeightType::kMXFP4, 2, 48, kBytes.data(), kBytes.data()}, "experts.5.w2");
  EXPECT_EQ(st.code(), Code::kInvalid);
  EXPECT_THAT(st.message(), HasSubstr("experts.5.w2"));
  EXPECT_THAT(st.message(), HasSubstr("48 columns"));
  EXPECT_THAT(st.message(), HasSubstr("cols % 32 == 0"));
}

TEST(ValidateMatrix, Mxfp4MissingScales) {
  const Status st =
      ValidateMatrix({WeightType::kMXFP4, 2, 64, kBytes.data(), nullptr}, "experts.0.w1");
  EXPECT_EQ(st.code(), Code::kInvalid);
  EXPECT_THAT(st.message(), HasSubstr("experts.0.w1"));
  EXPECT_THAT(st.message(), HasSubstr("no E8M0 scales"));
}

TEST(ValidateMatrix, MatMulAbortsOnAnInvalidMatrix) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // OpenMP may have started threads
  std::vector<float> x(48), y(2);
  const Matrix bad{WeightType::kMXFP4, 2, 48, kBytes.data(), kBytes.data()};
  EXPECT_DEATH(MatMul(bad, x.data(), 1, y.data()), "not a multiple of the group size 32");
}

TEST(WeightBytes, CountsPackedAndScales) {
  EXPECT_EQ(WeightBytes({WeightType::kF32, 3, 5, nullptr, nullptr}), 60);
  EXPECT_EQ(WeightBytes({WeightType::kBF16, 3, 5, nullptr, nullptr}), 30);
  // w1 of one K3 expert: 3072·1792 packed + 3072·112 scales (MODEL.md §4).
  EXPECT_EQ(WeightBytes({WeightType::kMXFP4, 3072, 3584, nullptr, nullptr}), 5505024 + 344064);
}

}  // namespace
}  // namespace k3::kernels
