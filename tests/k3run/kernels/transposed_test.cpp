// MatMulTransposedOnThisThread (kernels/transposed.h): on every ISA path this CPU supports, the
// bits of the scalar MatMul of the explicit transpose, for F32 and BF16, on shapes whose rows
// (the summed index) are not whole 16-lane steps and whose cols are not whole 8- or 16-column
// SIMD blocks, with spaced activation rows; plus values that fail if a lane starts at −0.0, if
// the lanes are assigned by anything but i mod 16, or if the tree is reordered.
#include "k3run/kernels/transposed.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "tests/k3run/kernels/kernel_test_util.h"

namespace k3::kernels {
namespace {

using testing::FirstBitDifference;
using testing::OwnedMatrix;
using testing::RandomActivations;
using testing::RandomMatrix;

// The explicit transpose of m, in m's dtype.
OwnedMatrix Transpose(const OwnedMatrix& m) {
  OwnedMatrix t;
  t.type = m.type;
  t.rows = m.cols;
  t.cols = m.rows;
  for (int64_t j = 0; j < m.cols; ++j) {
    for (int64_t i = 0; i < m.rows; ++i) {
      if (m.type == WeightType::kF32) t.f32.push_back(m.f32[size_t(i * m.cols + j)]);
      if (m.type == WeightType::kBF16) t.bf16.push_back(m.bf16[size_t(i * m.cols + j)]);
    }
  }
  return t;
}

// x rows of `rows` floats spaced `stride` apart (the gaps hold NaN: never read).
std::vector<float> Spaced(const std::vector<float>& dense, int64_t T, int64_t rows, int64_t stride) {
  std::vector<float> x(size_t(T * stride), std::numeric_limits<float>::quiet_NaN());
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(x.data() + t * stride, dense.data() + t * rows, size_t(rows) * 4);
  }
  return x;
}

std::vector<float> RunTransposed(const OwnedMatrix& m, const std::vector<float>& x, int64_t stride,
                                 int64_t T, Isa isa) {
  const Isa before = ActiveIsa();
  SetIsa(isa);
  std::vector<float> y(size_t(T * m.cols), -1.0f);
  MatMulTransposedOnThisThread(m.view(), x.data(), stride, T, y.data());
  SetIsa(before);
  return y;
}

TEST(MatMulTransposed, EveryPathEqualsMatMulOfTheTranspose) {
  uint64_t seed = 1;
  for (WeightType type : {WeightType::kF32, WeightType::kBF16}) {
    for (int64_t rows : {1, 7, 15, 16, 17, 33, 128}) {
      for (int64_t cols : {1, 5, 8, 9, 16, 17, 31, 64, 72}) {
        for (int64_t T : {1, 3}) {
          const OwnedMatrix m = RandomMatrix(type, rows, cols, seed++);
          const std::vector<float> dense = RandomActivations(T, rows, seed++);
          const std::vector<float> want =
              testing::RunMatMul(Transpose(m), dense, T, Isa::kScalar, 1);
          const int64_t stride = rows + 3;
          const std::vector<float> x = Spaced(dense, T, rows, stride);
          for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
            if (!IsaSupported(isa)) {
              if (rows == 1 && cols == 1 && T == 1) {
                std::printf("[ SKIPPED  ] %s: this CPU lacks the path\n", IsaName(isa));
              }
              continue;
            }
            const std::vector<float> got = RunTransposed(m, x, stride, T, isa);
            ASSERT_EQ(FirstBitDifference(want, got, cols), "")
                << testing::TypeName(type) << " " << rows << "x" << cols << " T=" << T << " "
                << IsaName(isa);
          }
        }
      }
    }
  }
}

// Hand-made columns whose fp32 sums depend on the order: an all −0.0 column sums to +0.0 only
// when the lanes start at +0.0f; ±1e8 at i = 0 and 16 cancel exactly only when both land in lane
// 0, before the small terms of lanes 1..15 meet them; and a term of j·2^24 at i = 32 (lane 0
// again) absorbs the small sums differently for another tree.
TEST(MatMulTransposed, OrderSensitiveColumns) {
  const int64_t rows = 33, cols = 19;
  OwnedMatrix m;
  m.type = WeightType::kF32;
  m.rows = rows;
  m.cols = cols;
  m.f32.assign(size_t(rows * cols), 0.0f);
  auto at = [&](int64_t i, int64_t j) -> float& { return m.f32[size_t(i * cols + j)]; };
  for (int64_t i = 0; i < rows; ++i) at(i, 0) = -0.0f;
  for (int64_t j = 1; j < cols; ++j) {
    at(0, j) = 1e8f;
    at(16, j) = -1e8f;
    for (int64_t i = 1; i < 16; ++i) at(i, j) = j % 2 ? 1.0f : 0.5f;
    at(32, j) = float(j) * std::ldexp(1.0f, 24);
  }
  std::vector<float> x(size_t(rows), 1.0f);
  const std::vector<float> want = testing::RunMatMul(Transpose(m), x, 1, Isa::kScalar, 1);
  EXPECT_FALSE(std::signbit(want[0]));  // +0.0: the lanes start at +0.0f
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) continue;
    const std::vector<float> got = RunTransposed(m, x, rows, 1, isa);
    EXPECT_EQ(FirstBitDifference(want, got, cols), "") << IsaName(isa);
  }
}

TEST(MatMulTransposedDeathTest, Mxfp4AndShortStridesAreCallerBugs) {
  const OwnedMatrix q = RandomMatrix(WeightType::kMXFP4, 4, 32, 3);
  std::vector<float> x(64), y(128);
  EXPECT_DEATH(MatMulTransposedOnThisThread(q.view(), x.data(), 4, 1, y.data()), "MXFP4");
  const OwnedMatrix f = RandomMatrix(WeightType::kF32, 4, 8, 4);
  EXPECT_DEATH(MatMulTransposedOnThisThread(f.view(), x.data(), 3, 1, y.data()), "x_stride");
}

}  // namespace
}  // namespace k3::kernels
