// MXFP4 decoding (MODEL.md §4) as seen through MatMul on every path: every (scale byte, code)
// value exact, the low nibble is the even element, scale byte 255 zeroes its group.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tests/k3run/kernels/kernel_test_util.h"

namespace k3::kernels::testing {
namespace {

std::vector<Isa> SupportedIsas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (IsaSupported(isa)) out.push_back(isa);
  }
  return out;
}

// One 32-column MXFP4 row per (scale byte, code, position): the code at one position, code 0
// (+0.0) everywhere else. With x = all ones, y = fmaf(w, 1, +0) + zeros = w exactly, so y
// shows the kernel's fp32 weight. Positions cover both nibbles and both 16-element halves.
TEST(Mxfp4Decode, EveryScaleByteAndCodeIsExact) {
  const int kPositions[] = {0, 1, 17, 30};
  OwnedMatrix m;
  m.type = WeightType::kMXFP4;
  m.cols = 32;
  m.rows = 256 * 16 * 4;
  m.packed.assign(static_cast<size_t>(m.rows) * 16, 0);
  m.scales.assign(static_cast<size_t>(m.rows), 0);
  std::vector<float> want(static_cast<size_t>(m.rows));
  size_t r = 0;
  for (int s = 0; s < 256; ++s) {
    for (int c = 0; c < 16; ++c) {
      for (int pos : kPositions) {
        m.scales[r] = static_cast<uint8_t>(s);
        m.packed[r * 16 + static_cast<size_t>(pos / 2)] =
            static_cast<uint8_t>(pos % 2 == 0 ? c : c << 4);
        const double exact = DequantMxfp4(static_cast<uint8_t>(c), static_cast<uint8_t>(s));
        // fp32 cannot hold |w| >= 2^128 (scale bytes 253, 254 with the large codes): ±inf.
        const bool overflows = std::fabs(exact) >= 0x1p128;
        const float inf = std::numeric_limits<float>::infinity();
        want[r] = overflows ? (exact > 0 ? inf : -inf) : static_cast<float>(exact);
        if (!overflows) {
          ASSERT_EQ(static_cast<double>(want[r]), exact) << "test bug: inexact";
        }
        ++r;
      }
    }
  }
  const std::vector<float> x(32, 1.0f);
  for (Isa isa : SupportedIsas()) {
    const std::vector<float> y = RunMatMul(m, x, 1, isa, 2);
    for (size_t k = 0; k < y.size(); ++k) {
      ASSERT_EQ(y[k], want[k]) << IsaName(isa) << ": scale byte " << k / 64 << " code "
                               << (k / 4) % 16 << " element " << kPositions[k % 4];
    }
  }
}

// Element 0 is the LOW nibble of byte 0. Codes 1 (0.5) and 2 (1.0) with x = [1, 10]:
// 0.5·1 + 1·10 = 10.5; the swapped reading would give 1·1 + 0.5·10 = 6.
TEST(Mxfp4Decode, LowNibbleIsTheEvenElement) {
  OwnedMatrix m;
  m.type = WeightType::kMXFP4;
  m.rows = 1;
  m.cols = 32;
  m.packed.assign(16, 0);
  m.packed[0] = 0x21;  // low nibble 1 → element 0, high nibble 2 → element 1
  m.scales.assign(1, 127);
  std::vector<float> x(32, 0.0f);
  x[0] = 1.0f;
  x[1] = 10.0f;
  for (Isa isa : SupportedIsas()) {
    EXPECT_EQ(RunMatMul(m, x, 1, isa, 1)[0], 10.5f) << IsaName(isa);
  }
}

// A group with scale byte 255 contributes exactly what a group of +0.0 weights does, whatever
// its codes: the same bits as the matrix with that group's codes zeroed.
TEST(Mxfp4Decode, ScaleByte255GroupContributesZeros) {
  OwnedMatrix m = RandomMatrix(WeightType::kMXFP4, 24, 128, 5);
  OwnedMatrix zeroed = m;
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t g : {0, 2}) {
      m.scales[static_cast<size_t>(r * 4 + g)] = 255;
      zeroed.scales[static_cast<size_t>(r * 4 + g)] = 127;
      for (int64_t b = 0; b < 16; ++b) zeroed.packed[static_cast<size_t>(r * 64 + g * 16 + b)] = 0;
    }
  }
  const std::vector<float> x = RandomActivations(3, 128, 6);
  for (Isa isa : SupportedIsas()) {
    EXPECT_EQ(FirstBitDifference(RunMatMul(zeroed, x, 3, isa, 1), RunMatMul(m, x, 3, isa, 1), 24),
              "")
        << IsaName(isa);
  }
}

// The documented decision: a 255 group's zero weights are multiplied, not skipped, so an inf
// activation there gives NaN (as a dense product over the dequantised matrix would).
TEST(Mxfp4Decode, ScaleByte255TimesInfIsNaN) {
  OwnedMatrix m = RandomMatrix(WeightType::kMXFP4, 4, 64, 9);
  for (int64_t r = 0; r < 4; ++r) m.scales[static_cast<size_t>(r * 2)] = 255;
  std::vector<float> x = RandomActivations(1, 64, 10);
  x[3] = std::numeric_limits<float>::infinity();
  for (Isa isa : SupportedIsas()) {
    for (float v : RunMatMul(m, x, 1, isa, 1)) EXPECT_TRUE(std::isnan(v)) << IsaName(isa);
  }
}

}  // namespace
}  // namespace k3::kernels::testing
