// The one transcendental implementation every operator uses (DESIGN.md §7).
//
// Why a header of its own: bit-identity across ISA paths and thread counts needs every exp, tanh
// and sigmoid in the engine to be the SAME scalar function applied per element. These call glibc's
// expf/tanhf (never a vectorised libmvec variant: the tree is built without -ffast-math, so GCC
// has no SIMD declaration to substitute). Cross-machine identity is not claimed: glibc may pick a
// different expf variant on a different CPU.
// Non-goals: speed. A project-owned polynomial could replace these later, here and only here.
#pragma once

#include <cmath>

namespace k3::ops {

inline float Exp(float x) { return std::exp(x); }    // expf
inline float Tanh(float x) { return std::tanh(x); }  // tanhf

// σ(z) = 1/(1+expf(−z)) in fp32 (MODEL.md §3).
inline float Sigmoid(float z) { return 1.0f / (1.0f + Exp(-z)); }

// SiLU(z) = z·σ(z).
inline float Silu(float z) { return z * Sigmoid(z); }

}  // namespace k3::ops
