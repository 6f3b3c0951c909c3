// Bit-identity of every SIMD path with the scalar reference, and of every thread count and
// batch size T with the single-threaded matvec (DESIGN.md §7). Paths this CPU lacks skip.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "k3run/kernels/kernels_internal.h"
#include "tests/k3run/kernels/kernel_test_util.h"

namespace k3::kernels::testing {
namespace {

struct Shape {
  int64_t rows, cols;
};

// cols covers < 16, exact 16/32 multiples and ragged ends (F32/BF16 only for the latter).
const Shape kF32Shapes[] = {{1, 1},  {3, 7},    {5, 15},    {9, 16},   {17, 17},   {33, 31},
                            {7, 33}, {40, 100}, {203, 257}, {64, 515}, {18, 1024}, {301, 515}};
const Shape kMxfp4Shapes[] = {{1, 32},    {3, 64},   {9, 96},   {17, 160},
                              {203, 256}, {64, 512}, {13, 1024}};
const int64_t kTs[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};  // T = 1..16: every tile mix
const int kThreads[] = {1, 2, 3};

std::vector<Shape> ShapesFor(WeightType type) {
  if (type == WeightType::kMXFP4) return {std::begin(kMxfp4Shapes), std::end(kMxfp4Shapes)};
  return {std::begin(kF32Shapes), std::end(kF32Shapes)};
}

class PathTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!IsaSupported(GetParam())) {
      GTEST_SKIP() << "this CPU lacks the " << IsaName(GetParam())
                   << " path: its bit-identity is NOT tested on this machine";
    }
  }

  // Every shape × T × thread count of `type` against the scalar path, bit for bit.
  void CheckAgainstScalar(WeightType type, int scale_lo, int scale_hi) {
    uint64_t seed = 1000;
    for (const Shape& s : ShapesFor(type)) {
      const OwnedMatrix m = RandomMatrix(type, s.rows, s.cols, ++seed, scale_lo, scale_hi);
      for (int64_t T : kTs) {
        const std::vector<float> x = RandomActivations(T, s.cols, ++seed);
        const std::vector<float> want = RunMatMul(m, x, T, Isa::kScalar, 1);
        for (int threads : kThreads) {
          const std::vector<float> got = RunMatMul(m, x, T, GetParam(), threads);
          ASSERT_EQ(FirstBitDifference(want, got, s.rows), "")
              << TypeName(type) << " [" << s.rows << "][" << s.cols << "] T=" << T
              << " threads=" << threads << " path=" << IsaName(GetParam());
        }
      }
    }
  }
};

TEST_P(PathTest, F32MatchesScalarBits) { CheckAgainstScalar(WeightType::kF32, 0, 0); }
TEST_P(PathTest, Bf16MatchesScalarBits) { CheckAgainstScalar(WeightType::kBF16, 0, 0); }
TEST_P(PathTest, Mxfp4MatchesScalarBits) { CheckAgainstScalar(WeightType::kMXFP4, 110, 140); }

// Rows over 4 KiB at T ≥ 12 run in tiles of 6 activations and one of the rest (matmul_avx512.cpp
// Rows): every remainder 0..5, four-row blocks and a leftover row, and a ragged end.
TEST_P(PathTest, LongRowsAtPrefillWidthsMatchScalarBits) {
  uint64_t seed = 5000;
  for (WeightType type : {WeightType::kF32, WeightType::kBF16}) {
    const OwnedMatrix m = RandomMatrix(type, 9, 4130, ++seed, 0, 0);
    for (int64_t T : {12, 13, 14, 15, 16, 17, 23}) {
      const std::vector<float> x = RandomActivations(T, 4130, ++seed);
      const std::vector<float> want = RunMatMul(m, x, T, Isa::kScalar, 1);
      for (int threads : {1, 2}) {
        const std::vector<float> got = RunMatMul(m, x, T, GetParam(), threads);
        ASSERT_EQ(FirstBitDifference(want, got, 9), "")
            << TypeName(type) << " T=" << T << " threads=" << threads
            << " path=" << IsaName(GetParam());
      }
    }
  }
}

// Every scale byte, 0 (subnormal scale) to 255 (zero group), incl. 253/254 whose large codes
// overflow to inf (and produce NaN sums): still the same bits on every path.
TEST_P(PathTest, Mxfp4AllScaleBytesMatchScalarBits) {
  CheckAgainstScalar(WeightType::kMXFP4, 0, 255);
}

// The ragged end must leave lanes past cols untouched. −0.0 lanes expose any padding: a padded
// fmaf(0, 0, −0.0) is +0.0, and the sum of all −0.0 lanes is −0.0 only if none was touched.
TEST_P(PathTest, RaggedEndLeavesMissingLanesUntouched) {
  for (int64_t cols : {17, 20, 31, 33}) {
    OwnedMatrix m;
    m.type = WeightType::kF32;
    m.rows = 5;
    m.cols = cols;
    // −2^−149 · 2^−2 rounds to −0.0: every lane an element reaches becomes −0.0.
    m.f32.assign(static_cast<size_t>(m.rows * cols), -0x1p-149f);
    const std::vector<float> x(static_cast<size_t>(cols), 0.25f);
    for (Isa isa : {Isa::kScalar, GetParam()}) {
      const std::vector<float> y = RunMatMul(m, x, 1, isa, 1);
      for (float v : y) {
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        EXPECT_EQ(bits, 0x80000000u)
            << "cols=" << cols << " path=" << IsaName(isa) << ": a lane past the end was touched";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, PathTest, ::testing::Values(Isa::kAvx2, Isa::kAvx512),
                         [](const ::testing::TestParamInfo<Isa>& p) {
                           return std::string(IsaName(p.param));
                         });

// Row t of MatMul(T) equals MatVec of that row alone, on every supported path and thread
// count (the basis of prefill == incremental decode).
TEST(MatMulRows, EachRowEqualsMatVecBits) {
  for (WeightType type : {WeightType::kF32, WeightType::kBF16, WeightType::kMXFP4}) {
    const int64_t rows = 37, cols = type == WeightType::kMXFP4 ? 320 : 301, T = 16;
    const OwnedMatrix m = RandomMatrix(type, rows, cols, 77);
    const std::vector<float> x = RandomActivations(T, cols, 78);
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
      if (!IsaSupported(isa)) continue;  // the path tests above report the skip
      for (int threads : kThreads) {
        const std::vector<float> all = RunMatMul(m, x, T, isa, threads);
        for (int64_t t = 0; t < T; ++t) {
          const std::vector<float> xt(x.begin() + t * cols, x.begin() + (t + 1) * cols);
          const std::vector<float> one = RunMatMul(m, xt, 1, isa, 1);
          const std::vector<float> row(all.begin() + t * rows, all.begin() + (t + 1) * rows);
          ASSERT_EQ(FirstBitDifference(one, row, rows), "")
              << TypeName(type) << " path=" << IsaName(isa) << " threads=" << threads
              << " row t=" << t;
        }
      }
    }
  }
}

// Wide calls (prefill) run in cache tiles of weight rows × activation rows (matmul.cpp's
// TiledRows, internal::ActivationBlockRows): 4128 columns make the activation tile the minimum
// kMinActivationBlock = 24 rows, so T = 53 is two whole tiles and a ragged one; 37 f32/bf16 rows
// (16 a row tile) and 130 MXFP4 rows (112 a row tile) are two row tiles and a ragged one. Each
// row of the wide call equals that row alone, on every path and thread count, and the paths
// equal the scalar one.
TEST(MatMulRows, WideCallsInCacheTilesEqualOneRowCallsBits) {
  constexpr int64_t kCols = 4128, kT = 53;
  static_assert(kT > 2 * internal::kMinActivationBlock);
  ASSERT_EQ(internal::ActivationBlockRows(kCols), internal::kMinActivationBlock);
  uint64_t seed = 9000;
  for (WeightType type : {WeightType::kF32, WeightType::kBF16, WeightType::kMXFP4}) {
    const int64_t rows = type == WeightType::kMXFP4 ? 130 : 37;
    const OwnedMatrix m = RandomMatrix(type, rows, kCols, ++seed, 110, 140);
    const std::vector<float> x = RandomActivations(kT, kCols, ++seed);
    const std::vector<float> scalar = RunMatMul(m, x, kT, Isa::kScalar, 1);
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
      if (!IsaSupported(isa)) continue;  // the path tests above report the skip
      std::vector<float> one_by_one;
      for (int64_t t = 0; t < kT; ++t) {
        const std::vector<float> xt(x.begin() + t * kCols, x.begin() + (t + 1) * kCols);
        const std::vector<float> y = RunMatMul(m, xt, 1, isa, 1);
        one_by_one.insert(one_by_one.end(), y.begin(), y.end());
      }
      ASSERT_EQ(FirstBitDifference(scalar, one_by_one, rows), "")
          << TypeName(type) << " path=" << IsaName(isa) << ": one-row calls against scalar";
      for (int threads : {1, 2}) {
        const std::vector<float> wide = RunMatMul(m, x, kT, isa, threads);
        ASSERT_EQ(FirstBitDifference(one_by_one, wide, rows), "")
            << TypeName(type) << " path=" << IsaName(isa) << " threads=" << threads;
      }
    }
  }
}

}  // namespace
}  // namespace k3::kernels::testing
