// The one transcendental implementation every operator uses (DESIGN.md §7, "transcendentals":
// one project-owned implementation shared by all paths).
//
// Why project-owned: bit-identity across ISA paths, thread counts and batch shapes needs every
// exp, tanh and sigmoid in the engine to be the SAME function applied per element. glibc's
// expf/tanhf satisfy that but are opaque scalar calls (~7.5 % of resident decode CPU, mostly from
// SituGlu). These are plain C++ on floats and integer bits only: no libm, no intrinsics, no
// tables, no branches (selects), so GCC auto-vectorises the loops that call them. An
// auto-vectorised element-wise loop performs the same IEEE operations on each element as the
// scalar loop (the tree is built with -ffp-contract=off and without -ffast-math, so nothing is
// fused or reassociated), hence vector and scalar results are bit-identical. The results also no
// longer depend on which libm variant glibc picks for the CPU.
//
// Accuracy, asserted by tests/k3run/ops/math_test.cpp against double-precision std::exp/std::tanh
// on sweeps (every 61st float plus dense windows); an exhaustive scratch run over every float
// found 0.98 ulp (Exp) and 1.33 ulp (Tanh):
//   Exp:  ≤ 2 ulp for x in [−87.3, 88.72283]; results in the subnormal range are rounded once
//         (gradual underflow, not flushed), absolute error ≤ 2·2^-149. Exp(0) = 1 exactly.
//         x > 88.72283 (the largest float whose exp is finite) → +inf, −inf → 0, NaN → NaN;
//         below ln(2^-150) ≈ −103.9721 the rounded result is 0.
//   Tanh: ≤ 3 ulp for every float; odd; Tanh(x) == x for |x| < 2^-12 (incl. subnormals);
//         Tanh(±0) = ±0, ±inf → ±1, |x| ≥ 9.1 → ±1 exactly, NaN → NaN.
// Non-goals: correct rounding; errno/floating-point exception flags; a faster-but-different
// variant for some ISA (there must be exactly one). Sigmoid (≤ 3 ulp, tested) and Silu are
// defined on top of Exp.
#pragma once

#include <bit>
#include <cstdint>

// K3_ELEMENTWISE_CLONES on an operator's definition compiles it three times (AVX-512F, AVX2 and
// the baseline) and picks the copy for the CPU when the program loads (GCC target_clones, an
// ifunc). Only for element-wise loops: each copy performs the same IEEE operations on each
// element, only more elements per instruction (no fusing: -ffp-contract=off; no reassociation:
// no -ffast-math), so every copy gives the same bits and K3_ISA does not need to choose among
// them (tests/k3run/ops/math_test.cpp compares each cloned operator with an element-by-element
// evaluation). Hot under batching and prefill: SiTU-GLU, the KDA recurrence and short conv were
// 4-wide SSE2 loops.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define K3_ELEMENTWISE_CLONES [[gnu::target_clones("avx512f", "avx2", "default")]]
#else
#define K3_ELEMENTWISE_CLONES
#endif

namespace k3::ops {

namespace math_internal {
// c ? a : b through integer masks, with both sides already computed. GCC turns a plain `?:` on
// floats back into control flow and moves the float arithmetic that depends on it into the
// branches; -ftrapping-math (the default) then forbids if-converting that arithmetic, and the
// loop stays scalar ("not vectorized: control flow in loop"). This happened to Exp's clamps too.
inline float Select(bool c, float a, float b) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & m) | (std::bit_cast<uint32_t>(b) & ~m));
}
}  // namespace math_internal

// e^x. Cody–Waite: n = round(x·log2 e), r = x − n·ln2 in two parts (|r| ≤ ln2/2 + rounding slack),
// e^r by a polynomial, then the exponent bits scale by 2^n.
inline float Exp(float x) {
  // Clamping to [−104, 89] keeps n in [−150, 128] and changes no result: e^−104 < 2^−150 rounds
  // to 0, and everything above 88.72283 (the largest float with a finite exp) overflows to +inf
  // in the final multiply, as e^89 does.
  constexpr float kMax = 89.0f;
  constexpr float kMin = -104.0f;
  constexpr float kLog2e = 0x1.715476p+0f;
  // ln2 = kLn2Hi + kLn2Lo. kLn2Hi has 13 significant bits, so n·kLn2Hi (|n| ≤ 150) is exact and
  // x − n·kLn2Hi is exact (Sterbenz); only the tiny n·kLn2Lo term is rounded.
  constexpr float kLn2Hi = 0x1.63p-1f;  // 0.693359375
  constexpr float kLn2Lo = -0x1.bd0106p-13f;
  // 1.5·2^23: adding it rounds x·log2 e to an integer (ties to even) held in the low mantissa
  // bits, so n needs no float→int conversion (undefined behaviour for NaN).
  constexpr float kMagic = 0x1.8p+23f;
  // e^r ≈ 1 + r + r²·(c2 + c3 r + c4 r² + c5 r³ + c6 r⁴) on |r| ≤ 0.35: near-minimax for relative
  // error (Lawson's iteratively reweighted least squares in double with numpy on 200k points),
  // coefficients rounded to float and re-checked: 4.8e-9 relative error in exact arithmetic
  // (0.04 ulp), so the float evaluation's roundings dominate.
  constexpr float kC2 = 0x1.fffffcp-2f;
  constexpr float kC3 = 0x1.55548ap-3f;
  constexpr float kC4 = 0x1.555916p-5f;
  constexpr float kC5 = 0x1.123fb0p-7f;
  constexpr float kC6 = 0x1.6a1a80p-10f;

  // NaN passes through both clamps (comparisons with NaN are false) and every later operation.
  float xc = math_internal::Select(x > kMax, kMax, x);
  xc = math_internal::Select(xc < kMin, kMin, xc);
  const float t = xc * kLog2e + kMagic;
  const float n = t - kMagic;
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  const float q = kC2 + r * (kC3 + r * (kC4 + r * (kC5 + r * kC6)));
  const float p = 1.0f + (r + (r * r) * q);
  // n ∈ [−150, 128] in two's complement. 2^n is applied as 2^n1·2^n2 with both halves normal, so
  // p·2^n1 is exact and the one rounding happens in the last multiply: gradual underflow near
  // −104 and overflow to +inf above 88.72283 come out of that rounding, with no special case.
  const uint32_t ni = std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(kMagic);
  const uint32_t n1 = static_cast<uint32_t>(static_cast<int32_t>(ni) >> 1);
  const uint32_t n2 = ni - n1;
  const float s1 = std::bit_cast<float>((n1 + 127u) << 23);
  const float s2 = std::bit_cast<float>((n2 + 127u) << 23);
  return (p * s1) * s2;
}

// tanh x, odd: computed on |x| and the sign bit copied back (which also gives Tanh(−0) = −0).
// |x| < 0.625: x + x·z·P(z), z = x², P near-minimax for the relative error of tanh (same method as
// Exp's polynomial; 8.5e-9 relative in exact arithmetic with these float coefficients).
// Otherwise 1 − 2/(e^{2|x|} + 1); at 0.625 the subtraction cancels at most ~1 bit. |x| ≥ 9.1:
// exactly 1 (2/(e^18.2+1) is below half an ulp of 1).
inline float Tanh(float x) {
  constexpr float kSmall = 0.625f;
  constexpr float kOne = 9.1f;
  constexpr float kP0 = -0x1.555532p-2f;
  constexpr float kP1 = 0x1.110726p-3f;
  constexpr float kP2 = -0x1.b83c5ep-5f;
  constexpr float kP3 = 0x1.5226bap-6f;
  constexpr float kP4 = -0x1.75e25cp-8f;

  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t sign = bits & 0x80000000u;
  const float a = std::bit_cast<float>(bits & 0x7fffffffu);
  const float z = a * a;
  const float small = a + a * (z * (kP0 + z * (kP1 + z * (kP2 + z * (kP3 + z * kP4)))));
  const float large = 1.0f - 2.0f / (Exp(2.0f * a) + 1.0f);
  float y = math_internal::Select(a < kSmall, small, large);  // NaN takes `large`, which is NaN
  y = math_internal::Select(a >= kOne, 1.0f, y);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(y) | sign);
}

// σ(z) = 1/(1+e^−z) in fp32 (MODEL.md §3).
inline float Sigmoid(float z) { return 1.0f / (1.0f + Exp(-z)); }

// SiLU(z) = z·σ(z).
inline float Silu(float z) { return z * Sigmoid(z); }

}  // namespace k3::ops
