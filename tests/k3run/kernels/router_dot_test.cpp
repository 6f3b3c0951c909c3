// RouterLogits and RouterLogitsRows: every ISA path this CPU supports, at 1, 2 and 3 threads,
// gives the bits of a plain double loop in ascending index order (MODEL.md §3.6), for BF16 and
// F32 gates, on shapes whose rows are not whole SIMD row groups (8 / 16 / 32) or thread chunks (64) and whose cols
// are not whole 8- or 16-column steps; plus hand-computed cases that fail if a row's sum is
// reordered or split, or if an accumulator starts at −0.0.
#include "k3run/kernels/router_dot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "k3run/kernels/kernels_internal.h"

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

// A gate in both dtypes: f32 values and their bf16 rounding.
struct Gate {
  int64_t rows = 0, cols = 0;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  Matrix view(WeightType t) const {
    const void* data = t == WeightType::kBF16 ? static_cast<const void*>(bf16.data())
                                              : static_cast<const void*>(f32.data());
    return Matrix{t, rows, cols, data, nullptr};
  }
};

Gate MakeGate(int64_t rows, int64_t cols, const std::function<float(int64_t, int64_t)>& value) {
  Gate g;
  g.rows = rows;
  g.cols = cols;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < cols; ++i) g.f32.push_back(value(r, i));
  }
  for (float v : g.f32) g.bf16.push_back(F32ToBf16RoundNearestEven(v));
  return g;
}

std::string Bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g (0x%016llx)", d, static_cast<unsigned long long>(u));
  return buf;
}

// "" when bit-identical, else the first differing row with both values' bits.
std::string FirstDifference(const std::vector<double>& want, const std::vector<double>& got) {
  for (size_t r = 0; r < want.size(); ++r) {
    if (std::memcmp(&want[r], &got[r], sizeof(double)) != 0) {
      return "row " + std::to_string(r) + ": want " + Bits(want[r]) + ", got " + Bits(got[r]);
    }
  }
  return "";
}

// Runs `check(isa, threads, type)` under every supported ISA × threads {1, 2, 3} × BF16/F32,
// restoring the process-wide settings; returns the unsupported paths for a visible skip.
std::string ForEveryPath(const std::function<void(Isa, int, WeightType)>& check) {
  const Isa saved_isa = ActiveIsa();
  const int saved_threads = Threads();
  std::string unsupported;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) {
      unsupported += std::string(unsupported.empty() ? "" : ", ") + IsaName(isa);
      continue;
    }
    SetIsa(isa);
    for (int threads : {1, 2, 3}) {
      SetThreads(threads);
      for (WeightType t : {WeightType::kBF16, WeightType::kF32}) check(isa, threads, t);
    }
  }
  SetIsa(saved_isa);
  SetThreads(saved_threads);
  return unsupported;
}

std::string Where(Isa isa, int threads, WeightType t, int64_t rows, int64_t cols) {
  return std::string(IsaName(isa)) + ", " + std::to_string(threads) + " threads, " +
         (t == WeightType::kBF16 ? "bf16" : "f32") + " [" + std::to_string(rows) + "][" +
         std::to_string(cols) + "]";
}

struct Shape {
  int64_t rows, cols;
};

void PrintTo(const Shape& s, std::ostream* os) { *os << s.rows << "x" << s.cols; }

class RouterDot : public ::testing::TestWithParam<Shape> {};

// Random gates in which each add's rounding depends on what came before it: rows of similar
// magnitudes (whole rows scaled up to 1e30 or down to 1e-30, so huge and tiny values are
// covered without one term swamping the rest) and rows mixing magnitudes 1e-3..1e3, with ±0.0
// weights sprinkled in and mixed-sign activations.
TEST_P(RouterDot, EveryIsaAndThreadCountMatchesTheAscendingDoubleLoopBitForBit) {
  const Shape sh = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(sh.rows * 100003 + sh.cols));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 15);
  const float kRowScales[] = {1.0f, 1e30f, 1e-30f};
  const float kMixed[] = {1e-3f, 0.1f, 1.0f, 10.0f, 1e3f};
  auto value = [&](int64_t r, int64_t) {
    const int p = pick(rng);
    if (p == 0) return -0.0f;
    if (p == 1) return 0.0f;
    if (r % 4 == 3) return nd(rng) * kMixed[p % 5];
    return nd(rng) * kRowScales[r % 4];
  };
  const Gate gate = MakeGate(sh.rows, sh.cols, value);
  std::vector<float> x(static_cast<size_t>(sh.cols));
  for (float& v : x) v = pick(rng) == 0 ? -0.0f : nd(rng);

  const std::string unsupported = ForEveryPath([&](Isa isa, int threads, WeightType t) {
    const Matrix m = gate.view(t);
    ASSERT_TRUE(ValidateMatrix(m, "router").ok());
    const std::vector<double> want = Reference(t, m.data, sh.rows, sh.cols, x);
    std::vector<double> got(static_cast<size_t>(sh.rows), -1.0);
    RouterLogits(m, x.data(), got.data());
    EXPECT_EQ("", FirstDifference(want, got)) << Where(isa, threads, t, sh.rows, sh.cols);
  });
  if (!unsupported.empty()) GTEST_SKIP() << unsupported << " not supported by this CPU (the others passed)";
}

// RouterLogitsRows: each of T activation rows (1..17: the AVX-512 tiles of 4, a pair and a single,
// and every remainder; from 8 on the AVX-512 panels of 16 rows, in tiles of 8 and every
// remainder) gets the reference's bits for its own row, on every path and thread count.
TEST_P(RouterDot, ManyActivationRowsEachGetTheirOwnRowsBits) {
  const Shape sh = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(sh.rows * 7919 + sh.cols));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const Gate gate = MakeGate(sh.rows, sh.cols, [&](int64_t r, int64_t) {
    return nd(rng) * (r % 3 == 1 ? 1e20f : 1.0f);
  });
  constexpr int64_t kMaxT = 17;
  // The released shape [901][7168] stops at 9 (17 took 19 s); the smaller shapes cover 10..17.
  const int64_t max_t = sh.rows * sh.cols > 1'000'000 ? 9 : kMaxT;
  std::vector<float> x(static_cast<size_t>(kMaxT * sh.cols));
  for (float& v : x) v = nd(rng);
  const std::string unsupported = ForEveryPath([&](Isa isa, int threads, WeightType t) {
    const Matrix m = gate.view(t);
    for (int64_t T = 1; T <= max_t; ++T) {
      std::vector<double> got(static_cast<size_t>(T * sh.rows), -1.0);
      RouterLogitsRows(m, x.data(), T, got.data());
      for (int64_t a = 0; a < T; ++a) {
        const std::vector<float> xa(x.begin() + a * sh.cols, x.begin() + (a + 1) * sh.cols);
        const std::vector<double> want = Reference(t, m.data, sh.rows, sh.cols, xa);
        const std::vector<double> row(got.begin() + a * sh.rows, got.begin() + (a + 1) * sh.rows);
        EXPECT_EQ("", FirstDifference(want, row))
            << Where(isa, threads, t, sh.rows, sh.cols) << ", T = " << T << ", row " << a;
      }
    }
  });
  if (!unsupported.empty()) GTEST_SKIP() << unsupported << " not supported by this CPU (the others passed)";
}

// Wide calls (prefill) give the bodies the activation rows in blocks of
// internal::ActivationBlockRows(cols): 24 at 4128 columns, so T = 53 is two whole blocks and a
// ragged one. Every row still gets the reference's bits for its own row.
TEST(RouterDotWide, ActivationRowsInCacheBlocksEachGetTheirOwnRowsBits) {
  constexpr int64_t kRows = 70, kCols = 4128, kT = 53;
  ASSERT_EQ(internal::ActivationBlockRows(kCols), 24);
  std::mt19937 rng(4128);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const Gate gate = MakeGate(kRows, kCols, [&](int64_t r, int64_t) {
    return nd(rng) * (r % 3 == 1 ? 1e20f : 1.0f);
  });
  std::vector<float> x(static_cast<size_t>(kT * kCols));
  for (float& v : x) v = nd(rng);
  const std::string unsupported = ForEveryPath([&](Isa isa, int threads, WeightType t) {
    const Matrix m = gate.view(t);
    std::vector<double> got(static_cast<size_t>(kT * kRows), -1.0);
    RouterLogitsRows(m, x.data(), kT, got.data());
    for (int64_t a = 0; a < kT; ++a) {
      const std::vector<float> xa(x.begin() + a * kCols, x.begin() + (a + 1) * kCols);
      const std::vector<double> want = Reference(t, m.data, kRows, kCols, xa);
      const std::vector<double> row(got.begin() + a * kRows, got.begin() + (a + 1) * kRows);
      ASSERT_EQ("", FirstDifference(want, row)) << Where(isa, threads, t, kRows, kCols)
                                                 << ", T = " << kT << ", row " << a;
    }
  });
  if (!unsupported.empty()) {
    GTEST_SKIP() << unsupported << " not supported by this CPU (the others passed)";
  }
}

// Rows: 1, below / above one 8-row group, the AVX2 16 and AVX-512 32-row groups and the 64-row
// thread chunk ± a few, the bench shape + 5. Cols: below one 8-column step, ragged after whole
// steps, the bench preset's 768 and the released model's 7168.
INSTANTIATE_TEST_SUITE_P(RouterShapes, RouterDot,
                         ::testing::Values(Shape{1, 1}, Shape{1, 3}, Shape{7, 5}, Shape{8, 8},
                                           Shape{9, 17}, Shape{13, 37}, Shape{17, 16},
                                           Shape{33, 3}, Shape{33, 768}, Shape{40, 25},
                                           Shape{65, 17}, Shape{64, 128}, Shape{130, 71},
                                           Shape{97, 7168}, Shape{896, 768},
                                           Shape{901, 17}, Shape{901, 768}, Shape{901, 7168}));

// 2^54 + 1 rounds back to 2^54 (the 1 is below half an ulp), so for the terms
// [2^54, 1, −2^54, 1] × x = 1 ascending order gives exactly 1.0, while reversed order gives 0,
// pairwise (2^54 + 1) + (−2^54 + 1) gives 0 and two interleaved partial sums give 2. The pattern
// starts at a different column in each row, so it falls into the SIMD steps, across a step
// border and into the ragged tail (cols = 37).
TEST(RouterDotOrder, ARowIsSummedInAscendingColumnOrderWithOneAccumulator) {
  constexpr int64_t kRows = 45, kCols = 37;
  const float big = std::ldexp(1.0f, 54);
  const Gate gate = MakeGate(kRows, kCols, [&](int64_t r, int64_t i) {
    const int64_t p = r % (kCols - 3);
    if (i == p) return big;
    if (i == p + 1 || i == p + 3) return 1.0f;
    if (i == p + 2) return -big;
    return 0.0f;
  });
  const std::vector<float> x(kCols, 1.0f);
  const std::vector<double> want(kRows, 1.0);  // by hand, above
  const std::string unsupported = ForEveryPath([&](Isa isa, int threads, WeightType t) {
    std::vector<double> got(kRows, -1.0);
    RouterLogits(gate.view(t), x.data(), got.data());
    EXPECT_EQ("", FirstDifference(want, got)) << Where(isa, threads, t, kRows, kCols);
  });
  if (!unsupported.empty()) GTEST_SKIP() << unsupported << " not supported by this CPU (the others passed)";
}

// The same cancellation through the products, with mixed-sign x: the terms w·x are
// [2^54, 1, −2^54, 1] again, but from w = [2^27, 2^-27, 2^27, −2^-27] and
// x = [2^27, 2^27, −2^27, −2^27], so sign and magnitude come from both operands.
TEST(RouterDotOrder, MixedSignActivationsKeepTheAscendingOrder) {
  constexpr int64_t kRows = 33, kCols = 20;
  const float a = std::ldexp(1.0f, 27), b = std::ldexp(1.0f, -27);
  const Gate gate = MakeGate(kRows, kCols, [&](int64_t r, int64_t i) {
    const int64_t p = 4 * (r % 5);
    const float pattern[4] = {a, b, a, -b};
    return i >= p && i < p + 4 ? pattern[i - p] : 0.0f;
  });
  std::vector<float> x(kCols);
  for (int64_t i = 0; i < kCols; ++i) x[static_cast<size_t>(i)] = (i % 4 < 2) ? a : -a;
  const std::vector<double> want(kRows, 1.0);  // 2^54 + 1 − 2^54 + 1, ascending
  const std::string unsupported = ForEveryPath([&](Isa isa, int threads, WeightType t) {
    std::vector<double> got(kRows, -1.0);
    RouterLogits(gate.view(t), x.data(), got.data());
    EXPECT_EQ("", FirstDifference(want, got)) << Where(isa, threads, t, kRows, kCols);
  });
  if (!unsupported.empty()) GTEST_SKIP() << unsupported << " not supported by this CPU (the others passed)";
}

// The accumulator starts at +0.0: a row of −0.0 weights times positive x (every product −0.0)
// sums to +0.0, not −0.0 as it would from a −0.0 start (the additive identity a masked tail
// might want). Rows span groups and the scalar remainder; cols span steps and the ragged tail.
TEST(RouterDotZero, NegativeZeroWeightsSumToPositiveZero) {
  constexpr int64_t kRows = 41, kCols = 19;
  const Gate gate = MakeGate(kRows, kCols, [](int64_t, int64_t) { return -0.0f; });
  std::vector<float> x(kCols);
  for (int64_t i = 0; i < kCols; ++i) x[static_cast<size_t>(i)] = i % 2 == 0 ? 1.5f : 2.0f;
  const std::vector<double> want(kRows, 0.0);  // +0.0 bits
  const std::string unsupported = ForEveryPath([&](Isa isa, int threads, WeightType t) {
    std::vector<double> got(kRows, -1.0);
    RouterLogits(gate.view(t), x.data(), got.data());
    EXPECT_EQ("", FirstDifference(want, got)) << Where(isa, threads, t, kRows, kCols);
  });
  if (!unsupported.empty()) GTEST_SKIP() << unsupported << " not supported by this CPU (the others passed)";
}

// cols = 0: every row is the empty sum, +0.0, on every path (nothing read from w or x).
TEST(RouterDotZero, NoColumnsGivePositiveZeroRows) {
  constexpr int64_t kRows = 37;
  const std::vector<float> x(1, 1.0f);
  const std::vector<double> want(kRows, 0.0);
  const std::string unsupported = ForEveryPath([&](Isa isa, int threads, WeightType t) {
    std::vector<double> got(kRows, -1.0);
    const Matrix m{t, kRows, 0, nullptr, nullptr};
    RouterLogits(m, x.data(), got.data());
    EXPECT_EQ("", FirstDifference(want, got)) << Where(isa, threads, t, kRows, 0);
  });
  if (!unsupported.empty()) GTEST_SKIP() << unsupported << " not supported by this CPU (the others passed)";
}

}  // namespace
}  // namespace k3::kernels
