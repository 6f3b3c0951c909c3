// RouterLogits: every thread count (under every ISA setting) gives the bits of a plain double
// loop in ascending index order (MODEL.md §3.6), for BF16 and F32 gates, on shapes that exercise
// the 8-row groups, the 64-row thread chunks and their remainders.
#include "k3run/kernels/router_dot.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace k3::kernels {
namespace {

// The definition, written independently of the kernel: one row at a time, one term at a time.
std::vector<double> Reference(WeightType t, const void* data, int64_t rows, int64_t cols,
                              const std::vector<float>& x) {
  std::vector<double> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    double acc = 0.0;
    for (int64_t i = 0; i < cols; ++i) {
      float w;
      if (t == WeightType::kBF16) {
        const uint32_t bits = uint32_t{static_cast<const uint16_t*>(data)[r * cols + i]} << 16;
        std::memcpy(&w, &bits, sizeof w);
      } else {
        w = static_cast<const float*>(data)[r * cols + i];
      }
      acc += static_cast<double>(w) * static_cast<double>(x[static_cast<size_t>(i)]);
    }
    out[static_cast<size_t>(r)] = acc;
  }
  return out;
}

struct Shape {
  int64_t rows, cols;
};

class RouterDot : public ::testing::TestWithParam<Shape> {};

TEST_P(RouterDot, EveryIsaAndThreadCountMatchesTheAscendingDoubleLoopBitForBit) {
  const Shape sh = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(sh.rows * 1000 + sh.cols));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(sh.cols)), wf(static_cast<size_t>(sh.rows * sh.cols));
  for (float& v : x) v = nd(rng);
  for (float& v : wf) v = nd(rng) * 0.05f;
  std::vector<uint16_t> wb(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) wb[i] = F32ToBf16RoundNearestEven(wf[i]);

  const Isa saved_isa = ActiveIsa();
  std::string unsupported;
  const int saved_threads = Threads();
  for (WeightType t : {WeightType::kBF16, WeightType::kF32}) {
    const void* data = t == WeightType::kBF16 ? static_cast<const void*>(wb.data())
                                              : static_cast<const void*>(wf.data());
    const Matrix m{t, sh.rows, sh.cols, data, nullptr};
    ASSERT_TRUE(ValidateMatrix(m, "router").ok());
    const std::vector<double> want = Reference(t, data, sh.rows, sh.cols, x);
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
      if (!IsaSupported(isa)) {
        unsupported = IsaName(isa);
        continue;
      }
      SetIsa(isa);
      for (int threads : {1, 2, 3}) {
        SetThreads(threads);
        std::vector<double> got(static_cast<size_t>(sh.rows), -1.0);
        RouterLogits(m, x.data(), got.data());
        EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(double)))
            << IsaName(isa) << ", " << threads << " threads, rows " << sh.rows << ", cols "
            << sh.cols << (t == WeightType::kBF16 ? ", bf16" : ", f32");
      }
    }
  }
  SetIsa(saved_isa);
  SetThreads(saved_threads);
  if (!unsupported.empty()) GTEST_SKIP() << unsupported << " not supported by this CPU (the others passed)";
}

INSTANTIATE_TEST_SUITE_P(Shapes, RouterDot,
                         ::testing::Values(Shape{1, 1}, Shape{7, 5}, Shape{8, 8}, Shape{13, 37},
                                           Shape{64, 128}, Shape{130, 71}, Shape{896, 768}));

}  // namespace
}  // namespace k3::kernels
