// k3run/ops/math.h: the project-owned Exp/Tanh/Sigmoid against double-precision std::exp/std::tanh
// (accuracy sweeps, special values, monotonicity), and the property they exist for: a loop GCC
// vectorises gives the same bits as evaluating element by element through calls it cannot.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "k3run/ops/activation.h"
#include "k3run/ops/attnres.h"
#include "k3run/ops/conv.h"
#include "k3run/ops/kda.h"
#include "k3run/ops/math.h"
#include "k3run/ops/router.h"
#include "k3run/ops/mla.h"  // Softmax

namespace k3::ops {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

uint32_t Bits(float x) { return std::bit_cast<uint32_t>(x); }
float FromBits(uint32_t b) { return std::bit_cast<float>(b); }

// The spacing of floats at |ref| (2^-149 in the subnormal range), so |got − ref| / Ulp(ref) is the
// error in units of the last place of the correctly rounded result.
double Ulp(double ref) {
  const double a = std::fabs(ref);
  if (a < 0x1p-126) return 0x1p-149;
  int e = 0;
  std::frexp(a, &e);  // a = m·2^e, m ∈ [0.5, 1)
  return std::ldexp(1.0, e - 24);
}

struct Worst {
  double ulp = 0;
  float at = 0;
  float got = 0;
  double want = 0;
  void Add(float x, float g, double w) {
    const double u = std::fabs(static_cast<double>(g) - w) / Ulp(w);
    if (!(u <= ulp)) {  // also catches a NaN result
      ulp = std::isnan(u) ? std::numeric_limits<double>::infinity() : u;
      at = x;
      got = g;
      want = w;
    }
  }
};

std::ostream& operator<<(std::ostream& os, const Worst& w) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%.3f ulp at x = %a (%.9g): got %.9g, want %.12g", w.ulp,
                static_cast<double>(w.at), static_cast<double>(w.at), static_cast<double>(w.got),
                w.want);
  return os << buf;
}

// Every float whose bit pattern is lo, lo+stride, ... ≤ hi (same sign, lo ≤ hi as patterns).
// The stride 61 (prime, ≈ every 64th float) reaches every value of the low mantissa bits, which a
// power-of-two stride would pin.
template <class F>
void ForBits(uint32_t lo, uint32_t hi, uint32_t stride, F f) {
  for (uint64_t b = lo; b <= hi; b += stride) f(FromBits(static_cast<uint32_t>(b)));
}
constexpr uint32_t kStride = 61;
constexpr uint32_t kSign = 0x80000000u;

// ---- Exp ---------------------------------------------------------------------------------------

TEST(MathExp, AccuracySweepWithinTwoUlp) {
  Worst w;
  auto check = [&](float x) { w.Add(x, Exp(x), std::exp(static_cast<double>(x))); };
  // Every 61st float of [−87.3, 88.72283] (normal results; both signs, down to the subnormal
  // inputs around 0), then every float of [−1, −0.5] and [0.5, 1].
  ForBits(0, Bits(0x1.62e42ep+6f), kStride, check);
  ForBits(kSign, Bits(-87.3f), kStride, check);
  ForBits(Bits(0.5f), Bits(1.0f), 1, check);
  ForBits(Bits(-0.5f), Bits(-1.0f), 1, check);
  std::printf("[ mathx    ] Exp max error %.3f ulp\n", w.ulp);
  EXPECT_LE(w.ulp, 2.0) << "Exp worst case: " << w;
}

TEST(MathExp, SubnormalResultsWithinTwiceTheSmallestSubnormal) {
  // Every float of [−104, −87.3]: results from just below FLT_MIN down to 0, rounded once.
  Worst w;
  ForBits(Bits(-87.3f), Bits(-104.0f), 1,
          [&](float x) { w.Add(x, Exp(x), std::exp(static_cast<double>(x))); });
  std::printf("[ mathx    ] Exp near/below FLT_MIN: max error %.3f x 2^-149 (or ulp)\n", w.ulp);
  EXPECT_LE(w.ulp, 2.0) << "Exp worst case (absolute error in units of 2^-149): " << w;
}

TEST(MathExp, ZeroGivesExactlyOne) {
  EXPECT_EQ(Bits(Exp(0.0f)), Bits(1.0f));
  EXPECT_EQ(Bits(Exp(-0.0f)), Bits(1.0f));
}

TEST(MathExp, InfinitiesAndNaN) {
  EXPECT_EQ(Exp(kInf), kInf);
  EXPECT_EQ(Bits(Exp(-kInf)), Bits(0.0f));
  EXPECT_TRUE(std::isnan(Exp(kNaN))) << Exp(kNaN);
  EXPECT_TRUE(std::isnan(Exp(-kNaN))) << Exp(-kNaN);
}

TEST(MathExp, OverflowsExactlyAbove88_72283) {
  const float last = 0x1.62e42ep+6f;  // 88.72283: e^last < FLT_MAX < e^next
  EXPECT_TRUE(std::isfinite(Exp(last))) << Exp(last);
  // Every float from the next one up to 2^8, then a few far ones.
  uint64_t bad = 0;
  float first_bad = 0;
  ForBits(Bits(last) + 1, Bits(256.0f), 1, [&](float x) {
    if (Exp(x) != kInf && bad++ == 0) first_bad = x;
  });
  EXPECT_EQ(bad, 0u) << "first finite result above 88.72283 at x = " << first_bad;
  EXPECT_EQ(Exp(1e30f), kInf);
  EXPECT_EQ(Exp(std::numeric_limits<float>::max()), kInf);
}

TEST(MathExp, UnderflowsToZeroBelowLnOfHalfTheSmallestSubnormal) {
  // ln(2^-150) = −103.97208: below it the rounded result is +0 (the brief's "x < −103.97 → 0";
  // between −103.97208 and −103.97 the correctly rounded result is 2^-149, and so is ours).
  EXPECT_EQ(Bits(Exp(-103.97f)), Bits(0x1p-149f));
  uint64_t bad = 0;
  float first_bad = 0;
  auto check = [&](float x) {
    if (Bits(Exp(x)) != 0u && bad++ == 0) first_bad = x;
  };
  ForBits(Bits(-103.9721f), Bits(-110.0f), 1, check);  // every float near the threshold
  ForBits(Bits(-110.0f), Bits(std::numeric_limits<float>::lowest()), 997, check);
  EXPECT_EQ(bad, 0u) << "first non-zero result below ln(2^-150) at x = " << first_bad;
  EXPECT_EQ(Bits(Exp(-1e30f)), 0u);
  EXPECT_EQ(Bits(Exp(std::numeric_limits<float>::lowest())), 0u);
}

TEST(MathExp, NonDecreasingOverDenseIntervals) {
  // Every float of each interval; each straddles a change of n (k + ½)·ln2, the underflow into
  // subnormals, or the overflow point.
  const float ranges[][2] = {{0.30f, 0.40f},   {-0.40f, -0.30f}, {10.0f, 10.1f},
                             {-10.1f, -10.0f}, {88.0f, 89.0f},   {-104.0f, -86.0f}};
  for (const auto& r : ranges) {
    float x = r[0], prev = Exp(x);
    while (x < r[1]) {
      const float nx = std::nextafter(x, kInf), e = Exp(nx);
      ASSERT_GE(e, prev) << "Exp decreases from x = " << x << " to " << nx << " in [" << r[0]
                         << ", " << r[1] << "]";
      x = nx;
      prev = e;
    }
  }
}

// ---- Tanh --------------------------------------------------------------------------------------

TEST(MathTanh, AccuracySweepWithinThreeUlp) {
  Worst w;
  auto check = [&](float x) { w.Add(x, Tanh(x), std::tanh(static_cast<double>(x))); };
  // Every 61st float of [−9.2, 9.2] (subnormals, tiny, the polynomial region, the 1 − 2/(e+1)
  // region, the start of saturation), every 4099th beyond, then every float of [0.5, 0.75] and
  // [−0.75, −0.5], which holds the switch between the two formulas at 0.625.
  ForBits(0, Bits(9.2f), kStride, check);
  ForBits(kSign, Bits(-9.2f), kStride, check);
  ForBits(Bits(9.2f), Bits(std::numeric_limits<float>::max()), 4099, check);
  ForBits(Bits(-9.2f), Bits(std::numeric_limits<float>::lowest()), 4099, check);
  ForBits(Bits(0.5f), Bits(0.75f), 1, check);
  ForBits(Bits(-0.5f), Bits(-0.75f), 1, check);
  std::printf("[ mathx    ] Tanh max error %.3f ulp\n", w.ulp);
  EXPECT_LE(w.ulp, 3.0) << "Tanh worst case: " << w;
}

TEST(MathTanh, TinyArgumentsReturnThemselves) {
  uint64_t bad = 0;
  float first_bad = 0;
  // Every 389th float below 2^-12 (all exponents, subnormals included), both signs.
  ForBits(0, Bits(0x1p-12f), 389, [&](float x) {
    if ((Bits(Tanh(x)) != Bits(x) || Bits(Tanh(-x)) != Bits(-x)) && bad++ == 0) first_bad = x;
  });
  EXPECT_EQ(bad, 0u) << "first |x| < 2^-12 with Tanh(x) != x: " << first_bad;
}

TEST(MathTanh, SignedZeros) {
  EXPECT_EQ(Bits(Tanh(0.0f)), Bits(0.0f));
  EXPECT_EQ(Bits(Tanh(-0.0f)), Bits(-0.0f));
}

TEST(MathTanh, InfinitiesAndNaN) {
  EXPECT_EQ(Bits(Tanh(kInf)), Bits(1.0f));
  EXPECT_EQ(Bits(Tanh(-kInf)), Bits(-1.0f));
  EXPECT_TRUE(std::isnan(Tanh(kNaN))) << Tanh(kNaN);
  EXPECT_TRUE(std::isnan(Tanh(-kNaN))) << Tanh(-kNaN);
}

TEST(MathTanh, SaturatesToExactlyOneFrom9_1) {
  uint64_t bad = 0;
  float first_bad = 0;
  auto check = [&](float x) {
    if ((Tanh(x) != 1.0f || Tanh(-x) != -1.0f) && bad++ == 0) first_bad = x;
  };
  ForBits(Bits(9.1f), Bits(10.0f), 1, check);  // every float near the threshold
  ForBits(Bits(10.0f), Bits(std::numeric_limits<float>::max()), 997, check);
  EXPECT_EQ(bad, 0u) << "first |x| >= 9.1 with Tanh(x) != ±1: " << first_bad;
}

TEST(MathTanh, IsOdd) {
  uint64_t bad = 0;
  float first_bad = 0;
  ForBits(0, Bits(16.0f), 251, [&](float x) {
    if (Bits(Tanh(-x)) != (Bits(Tanh(x)) ^ kSign) && bad++ == 0) first_bad = x;
  });
  EXPECT_EQ(bad, 0u) << "first x with Tanh(-x) != -Tanh(x): " << first_bad;
}

TEST(MathTanh, NonDecreasingAcrossTheFormulaSwitchAndSaturation) {
  const float ranges[][2] = {{0.60f, 0.65f}, {-0.65f, -0.60f}, {9.0f, 9.2f}};
  for (const auto& r : ranges) {
    float x = r[0], prev = Tanh(x);
    while (x < r[1]) {
      const float nx = std::nextafter(x, kInf), t = Tanh(nx);
      ASSERT_GE(t, prev) << "Tanh decreases from x = " << x << " to " << nx;
      x = nx;
      prev = t;
    }
  }
}

// ---- Sigmoid -----------------------------------------------------------------------------------

TEST(MathSigmoid, SpecialValues) {
  EXPECT_EQ(Sigmoid(0.0f), 0.5f);
  EXPECT_EQ(Sigmoid(kInf), 1.0f);
  EXPECT_EQ(Bits(Sigmoid(-kInf)), Bits(0.0f));
  EXPECT_EQ(Sigmoid(100.0f), 1.0f);
  EXPECT_TRUE(std::isnan(Sigmoid(kNaN)));
  EXPECT_EQ(Silu(100.0f), 100.0f);
  EXPECT_EQ(Bits(Silu(-0.0f)), Bits(-0.0f));
}

TEST(MathSigmoid, AccuracySweep) {
  // 1/(1+Exp(−z)): Exp's ≤ 2 ulp plus two roundings, shrunk by e/(1+e) ≤ 1 where it matters.
  Worst w;
  auto check = [&](float z) {
    w.Add(z, Sigmoid(z), 1.0 / (1.0 + std::exp(-static_cast<double>(z))));
  };
  ForBits(0, Bits(0x1.62e42ep+6f), 127, check);  // every 127th float of [−87.3, 88.72283]
  ForBits(kSign, Bits(-87.3f), 127, check);
  std::printf("[ mathx    ] Sigmoid max error %.3f ulp\n", w.ulp);
  EXPECT_LE(w.ulp, 3.0) << "Sigmoid worst case: " << w;
}

// ---- Vectorised loop == element by element -----------------------------------------------------

// Scalar evaluations GCC cannot vectorise: one element per out-of-line call, made through volatile
// function pointers so nothing is inlined into a loop.
[[gnu::noinline]] float TanhOne(float x) { return Tanh(x); }
[[gnu::noinline]] float SigmoidOne(float x) { return Sigmoid(x); }
float (*volatile tanh_one)(float) = &TanhOne;
float (*volatile sigmoid_one)(float) = &SigmoidOne;

// SiTU-GLU written from MODEL.md §3.1 (same fp32 operation order), one element at a time.
float SituOne(float g, float u, float b1, float b2) {
  const float a = b1 * tanh_one(g / b1) * sigmoid_one(g);
  return a * (b2 * tanh_one(u / b2));
}

std::vector<float> RandomActivations(size_t n, uint32_t seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  // Edges mixed in: zeros, tiny, subnormal, saturating, huge, infinities.
  const float edge[] = {0.0f, -0.0f, 1e-30f, -0x1p-140f, 0.625f, -0.625f, 36.4f, -36.4f,
                        90.0f, -110.0f, 1e30f, -1e30f, kInf, -kInf};
  for (size_t i = 0; i < std::size(edge); ++i) v[(i * 97 + 5) % n] = edge[i];
  return v;
}

TEST(MathBitIdentity, SituGluLoopEqualsElementByElement) {
  // 4099 is prime: not a multiple of any vector width, so the vector body and the scalar
  // remainder both run. SituGlu is compiled with the ops library's flags, where it vectorises.
  constexpr size_t n = 4099;
  const float b1 = 4.0f, b2 = 25.0f;
  const std::vector<float> gate = RandomActivations(n, 1, 4.0f), up = RandomActivations(n, 2, 40.0f);
  std::vector<float> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = SituOne(gate[i], up[i], b1, b2);

  std::vector<float> y(n);
  SituGlu(gate.data(), up.data(), static_cast<int64_t>(n), b1, b2, y.data());
  std::vector<float> in_place = gate;  // y aliases gate, as GluMlp and MoeBlock call it
  SituGlu(in_place.data(), up.data(), static_cast<int64_t>(n), b1, b2, in_place.data());
  std::vector<float> shifted(n);  // an odd start, so the vector loop's alignment differs
  SituGlu(gate.data() + 1, up.data() + 1, static_cast<int64_t>(n - 1), b1, b2, shifted.data() + 1);
  shifted[0] = want[0];

  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(Bits(y[i]), Bits(want[i])) << "separate y, element " << i << ": gate " << gate[i]
                                         << " up " << up[i] << ": " << y[i] << " vs " << want[i];
    ASSERT_EQ(Bits(in_place[i]), Bits(want[i])) << "y == gate, element " << i;
    ASSERT_EQ(Bits(shifted[i]), Bits(want[i])) << "start at 1, element " << i;
  }
}

// ---- The other cloned operators (K3_ELEMENTWISE_CLONES) == element by element ---------------
// References written from MODEL.md's order, one element at a time, with GCC's vectoriser off for
// them: the copy of the operator the CPU runs (AVX-512F here when the CPU has it) must give their
// bits.
#define K3_SCALAR_ONLY __attribute__((optimize("no-tree-vectorize"), noinline))

K3_SCALAR_ONLY void KdaStepOne(std::vector<float>& S, const std::vector<float>& q,
                               const std::vector<float>& k, const std::vector<float>& v,
                               const std::vector<float>& alpha, float beta, int64_t D,
                               std::vector<float>& o) {
  std::vector<float> u(static_cast<size_t>(D), 0.0f);
  for (int64_t i = 0; i < D; ++i) {
    for (int64_t j = 0; j < D; ++j) S[i * D + j] = alpha[i] * S[i * D + j];
    for (int64_t j = 0; j < D; ++j) u[j] = u[j] + k[i] * S[i * D + j];
  }
  std::vector<float> r(static_cast<size_t>(D));
  for (int64_t j = 0; j < D; ++j) r[j] = v[j] - u[j];
  for (int64_t j = 0; j < D; ++j) o[j] = 0.0f;
  for (int64_t i = 0; i < D; ++i) {
    const float kb = k[i] * beta;
    for (int64_t j = 0; j < D; ++j) S[i * D + j] = S[i * D + j] + kb * r[j];
    for (int64_t j = 0; j < D; ++j) o[j] = o[j] + q[i] * S[i * D + j];
  }
}

TEST(MathBitIdentity, KdaRecurrenceStepEqualsElementByElement) {
  for (int64_t D : {128, 37}) {  // the released head dim, and one no vector width divides
    std::vector<float> S = RandomActivations(static_cast<size_t>(D * D), 3, 0.5f);
    for (float& x : S) x = std::isfinite(x) ? x : 0.5f;  // a state, not the edge values
    std::vector<float> S_ref = S, o(static_cast<size_t>(D)), o_ref(static_cast<size_t>(D));
    // q, k and v without RandomActivations' ±inf and 1e30 edges: with them u and the residual
    // were inf or NaN in most lanes, and the state NaN whatever the order of the sums.
    auto finite = [](std::vector<float> a) {
      for (float& x : a) x = std::isfinite(x) && std::fabs(x) < 1e6f ? x : 0.25f;
      return a;
    };
    std::vector<float> q = finite(RandomActivations(static_cast<size_t>(D), 4, 0.1f));
    std::vector<float> k = finite(RandomActivations(static_cast<size_t>(D), 5, 0.1f));
    const std::vector<float> v = finite(RandomActivations(static_cast<size_t>(D), 6, 1.0f));
    std::vector<float> alpha(static_cast<size_t>(D));
    for (int64_t i = 0; i < D; ++i) alpha[i] = 0.5f + 0.5f / static_cast<float>(i + 1);
    for (int step = 0; step < 3; ++step) {  // the state carries from step to step
      KdaRecurrenceStep(S.data(), q.data(), k.data(), v.data(), alpha.data(), 0.75f, D, o.data());
      KdaStepOne(S_ref, q, k, v, alpha, 0.75f, D, o_ref);
      for (int64_t i = 0; i < D * D; ++i) {
        ASSERT_EQ(Bits(S[i]), Bits(S_ref[i])) << "D " << D << " step " << step << " S[" << i << "]";
      }
      for (int64_t j = 0; j < D; ++j) {
        ASSERT_EQ(Bits(o[j]), Bits(o_ref[j])) << "D " << D << " step " << step << " o[" << j << "]";
      }
    }
  }
}

// Several tokens in one run (one pass over S per token, the prefill path and the replay of kept
// drafts): the state after each run and every token's output have the bits of step after step.
// Normal values only: with RandomActivations' ±inf and 1e30 edges in q and k, every sum would be
// inf or NaN whatever the order.
TEST(MathBitIdentity, KdaRecurrenceRunEqualsStepByStep) {
  std::mt19937 rng(77);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t D : {128, 37}) {
    for (int64_t n : {1, 2, 5}) {
      constexpr int64_t kPad = 3;  // token t at t·stride, stride = D + kPad (a head's slice of P)
      const int64_t stride = D + kPad;
      std::vector<float> S(static_cast<size_t>(D * D));
      for (float& x : S) x = 0.5f * nd(rng);
      std::vector<float> S_ref = S;
      std::vector<float> q(static_cast<size_t>(n * stride)), k(q.size()), v(q.size()),
          alpha(static_cast<size_t>(n * D)), beta(static_cast<size_t>(2 * n));
      for (float& x : q) x = 0.1f * nd(rng);
      for (float& x : k) x = 0.1f * nd(rng);
      for (float& x : v) x = nd(rng);
      for (float& x : alpha) x = 0.5f + 0.5f / (1.0f + std::fabs(nd(rng)));
      for (float& x : beta) x = 1.0f / (1.0f + std::exp(-nd(rng)));
      std::vector<float> o(q.size(), -1.0f);
      for (int run = 0; run < 2; ++run) {  // the state carries from run to run
        KdaRecurrenceRun(S.data(), q.data(), k.data(), v.data(), stride, alpha.data(), D,
                         beta.data(), 2, n, D, o.data());
        for (int64_t t = 0; t < n; ++t) {
          auto slice = [&](const std::vector<float>& a, int64_t at) {
            return std::vector<float>(a.begin() + at, a.begin() + at + D);
          };
          std::vector<float> o_ref(static_cast<size_t>(D));
          KdaStepOne(S_ref, slice(q, t * stride), slice(k, t * stride), slice(v, t * stride),
                     slice(alpha, t * D), beta[static_cast<size_t>(2 * t)], D, o_ref);
          for (int64_t j = 0; j < D; ++j) {
            ASSERT_EQ(Bits(o[static_cast<size_t>(t * stride + j)]), Bits(o_ref[static_cast<size_t>(j)]))
                << "D " << D << " n " << n << " run " << run << " token " << t << " o[" << j << "]";
          }
        }
        for (int64_t i = 0; i < D * D; ++i) {
          ASSERT_EQ(Bits(S[static_cast<size_t>(i)]), Bits(S_ref[static_cast<size_t>(i)]))
              << "D " << D << " n " << n << " run " << run << " S[" << i << "]";
        }
      }
    }
  }
}

K3_SCALAR_ONLY void RouterScoresOne(const std::vector<double>& logits,
                                    const std::vector<float>& bias, std::vector<float>& s,
                                    std::vector<float>& c) {
  for (size_t e = 0; e < logits.size(); ++e) {
    s[e] = Sigmoid(static_cast<float>(logits[e]));
    c[e] = s[e] + bias[e];
  }
}

// 4099 experts (no vector width divides it), logits from −60 to 60 with ±0, ±inf and NaN among
// them, so exp's edges and the double→float narrowing both run in the vector body.
TEST(MathBitIdentity, RouterScoresEqualElementByElement) {
  constexpr size_t n = 4099;
  const std::vector<float> a = RandomActivations(n, 11, 20.0f), b = RandomActivations(n, 12, 0.5f);
  std::vector<double> logits(n);
  for (size_t e = 0; e < n; ++e) logits[e] = static_cast<double>(a[e]) * 1.000000123;
  logits[5] = 0.0;
  logits[6] = -0.0;
  logits[7] = std::numeric_limits<double>::infinity();
  logits[8] = -std::numeric_limits<double>::infinity();
  logits[9] = std::nan("");
  logits[10] = 1e300;  // beyond float: narrows to inf
  std::vector<float> s(n), c(n), s_ref(n), c_ref(n);
  RouterScores(logits.data(), b.data(), static_cast<int64_t>(n), s.data(), c.data());
  RouterScoresOne(logits, b, s_ref, c_ref);
  for (size_t e = 0; e < n; ++e) {
    ASSERT_EQ(Bits(s[e]), Bits(s_ref[e])) << "s[" << e << "] of logit " << logits[e];
    ASSERT_EQ(Bits(c[e]), Bits(c_ref[e])) << "c[" << e << "] of logit " << logits[e];
  }
}

K3_SCALAR_ONLY void ShortConvOne(const std::vector<float>& x, int64_t T, int64_t C, int64_t K,
                                 const std::vector<float>& w, std::vector<float>& hist,
                                 std::vector<float>& y) {
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < C; ++c) {
      float* h = hist.data() + c * (K - 1);
      float acc = w[c * K + K - 1] * x[t * C + c];
      for (int64_t j = 0; j < K - 1; ++j) acc += w[c * K + j] * h[j];
      for (int64_t j = 0; j + 1 < K - 1; ++j) h[j] = h[j + 1];
      if (K > 1) h[K - 2] = x[t * C + c];
      y[t * C + c] = acc * sigmoid_one(acc);
    }
  }
}

TEST(MathBitIdentity, ShortConvEqualsElementByElement) {
  constexpr int64_t T = 3, C = 131, K = 4;
  const std::vector<float> x = RandomActivations(static_cast<size_t>(T * C), 7, 2.0f);
  const std::vector<float> w = RandomActivations(static_cast<size_t>(C * K), 8, 0.5f);
  std::vector<float> hist = RandomActivations(static_cast<size_t>(C * (K - 1)), 9, 1.0f);
  std::vector<float> hist_ref = hist, y(static_cast<size_t>(T * C)), want(static_cast<size_t>(T * C));
  ShortConv(x.data(), T, C, K, w.data(), hist.data(), y.data());
  ShortConvOne(x, T, C, K, w, hist_ref, want);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(Bits(y[i]), Bits(want[i])) << "y[" << i << "]";
  for (size_t i = 0; i < hist.size(); ++i) ASSERT_EQ(Bits(hist[i]), Bits(hist_ref[i])) << i;
}

// The conv over channel ranges (how KdaAttendMany spreads it over threads), in place as there,
// for every kernel size up to the released 4: each range's bits are the definition's, and the
// ranges together leave the history as one call does.
TEST(MathBitIdentity, ShortConvChannelRangesInPlaceEqualElementByElement) {
  constexpr int64_t T = 5, C = 131;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t K : {1, 2, 4}) {
    std::vector<float> x(static_cast<size_t>(T * C)), w(static_cast<size_t>(C * K)),
        hist(static_cast<size_t>(C * (K - 1)));
    for (float& v : x) v = 2.0f * nd(rng);
    for (float& v : w) v = 0.5f * nd(rng);
    for (float& v : hist) v = nd(rng);
    std::vector<float> hist_ref = hist, want(x.size()), y = x;  // y: in place
    ShortConvOne(x, T, C, K, w, hist_ref, want);
    for (auto [c0, c1] : {std::pair<int64_t, int64_t>{0, 40}, {40, 41}, {41, 131}}) {
      ShortConvChannels(y.data(), T, C, K, w.data(), hist.data(), y.data(), c0, c1);
    }
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_EQ(Bits(y[i]), Bits(want[i])) << "K " << K << " y[" << i << "]";
    }
    for (size_t i = 0; i < hist.size(); ++i) {
      ASSERT_EQ(Bits(hist[i]), Bits(hist_ref[i])) << "K " << K << " hist[" << i << "]";
    }
  }
}

K3_SCALAR_ONLY void AttnResOne(const std::vector<std::vector<float>>& src,
                               const std::vector<float>& fold, int64_t E, float eps,
                               std::vector<float>& out) {
  const auto m = static_cast<int64_t>(src.size());
  std::vector<float> p(static_cast<size_t>(m));
  for (int64_t k = 0; k < m; ++k) {
    double ss = 0.0, dot = 0.0;
    for (int64_t i = 0; i < E; ++i) ss += double(src[k][i]) * double(src[k][i]);
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / double(E) + double(eps)));
    for (int64_t i = 0; i < E; ++i) dot += double(src[k][i] * inv) * double(fold[i]);
    p[k] = static_cast<float>(dot);
  }
  Softmax(p.data(), m, p.data());
  for (int64_t i = 0; i < E; ++i) {
    float acc = 0.0f;
    for (int64_t k = 0; k < m; ++k) acc = acc + p[k] * src[k][i];
    out[i] = acc;
  }
}

TEST(MathBitIdentity, AttnResEqualsElementByElement) {
  constexpr int64_t m = 5, E = 99;
  std::vector<std::vector<float>> src;
  std::vector<const float*> ptr;
  for (int64_t k = 0; k < m; ++k) {
    src.push_back(RandomActivations(static_cast<size_t>(E), 10 + static_cast<uint32_t>(k), 1.0f));
    for (float& x : src.back()) x = std::isfinite(x) && std::fabs(x) < 1e6f ? x : 1.0f;
    ptr.push_back(src.back().data());
  }
  std::vector<float> fold = RandomActivations(static_cast<size_t>(E), 20, 0.2f);
  for (float& f : fold) f = std::isfinite(f) && std::fabs(f) < 1e6f ? f : 0.5f;  // finite scores
  std::vector<float> out(static_cast<size_t>(E)), want(static_cast<size_t>(E));
  AttnRes(ptr.data(), m, fold.data(), E, 1e-6f, out.data());
  AttnResOne(src, fold, E, 1e-6f, want);
  for (int64_t i = 0; i < E; ++i) ASSERT_EQ(Bits(out[i]), Bits(want[i])) << "out[" << i << "]";
}

// Several rows at once (Aggregate's units): each row's output has the bits of the one-row
// evaluation, for 1..5 rows and source counts below, at and across the 8 sums advanced together.
TEST(MathBitIdentity, AttnResRowsEqualsEachRowAlone) {
  constexpr int64_t E = 77;
  // A finite fold (RandomActivations mixes in ±inf and 1e30, which make every score ±inf/NaN
  // and every output the same whatever the sums).
  std::vector<float> fold(static_cast<size_t>(E));
  std::mt19937 fold_rng(21);
  std::normal_distribution<float> fold_d(0.0f, 0.2f);
  for (float& f : fold) f = fold_d(fold_rng);
  for (int64_t R = 1; R <= 5; ++R) {
    for (int64_t m : {1, 2, 3, 7, 8, 9, 17}) {
      std::vector<std::vector<std::vector<float>>> rows(static_cast<size_t>(R));
      std::vector<const float*> ptr;
      for (int64_t r = 0; r < R; ++r) {
        for (int64_t k = 0; k < m; ++k) {
          // Normal values of a different scale per source (no shared edge values: the keys'
          // norms and the scores differ, so a sum given to the wrong source shows).
          std::mt19937 rng(static_cast<uint32_t>(100 + 31 * r + k + 7 * m));
          std::normal_distribution<float> d(0.0f, 0.5f + 0.25f * static_cast<float>(k + r));
          std::vector<float> v(static_cast<size_t>(E));
          for (float& x : v) x = d(rng);
          rows[static_cast<size_t>(r)].push_back(std::move(v));
        }
        for (const auto& v : rows[static_cast<size_t>(r)]) ptr.push_back(v.data());
      }
      std::vector<std::vector<float>> got(static_cast<size_t>(R), std::vector<float>(E));
      std::vector<float*> out;
      for (auto& g : got) out.push_back(g.data());
      AttnResRows(ptr.data(), R, m, fold.data(), E, 1e-6f, out.data());
      for (int64_t r = 0; r < R; ++r) {
        std::vector<float> want(static_cast<size_t>(E));
        AttnResOne(rows[static_cast<size_t>(r)], fold, E, 1e-6f, want);
        for (int64_t i = 0; i < E; ++i) {
          ASSERT_EQ(Bits(got[static_cast<size_t>(r)][static_cast<size_t>(i)]),
                    Bits(want[static_cast<size_t>(i)]))
              << "R=" << R << " m=" << m << " row " << r << " out[" << i << "]";
        }
      }
    }
  }
}

}  // namespace
}  // namespace k3::ops
