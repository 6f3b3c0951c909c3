// Test helpers for k3run/kernels: owned random matrices, an independent float64 reference
// (dequantise, double dot), and scoped ISA/thread settings.
#pragma once

#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "k3run/kernels/matmul.h"

namespace k3::kernels {
// So a failing parameterised test names the path instead of "1-byte object <01>".
inline void PrintTo(Isa isa, std::ostream* os) { *os << IsaName(isa); }
}  // namespace k3::kernels

namespace k3::kernels::testing {

// A Matrix plus the storage it points into.
struct OwnedMatrix {
  WeightType type = WeightType::kF32;
  int64_t rows = 0, cols = 0;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  std::vector<uint8_t> packed;  // MXFP4 [rows][cols/2]
  std::vector<uint8_t> scales;  // MXFP4 [rows][cols/32]
  Matrix view() const;
};

// Normal(0,1) weights; BF16 rounded from them; MXFP4 random codes with scale bytes drawn
// uniformly from [scale_lo, scale_hi] (inclusive).
OwnedMatrix RandomMatrix(WeightType type, int64_t rows, int64_t cols, uint64_t seed,
                         int scale_lo = 120, int scale_hi = 134);
std::vector<float> RandomActivations(int64_t T, int64_t cols, uint64_t seed);

// Written from MODEL.md §4 independently of the kernel's table: E2M1 times 2^(s−127) in double.
double DequantMxfp4(uint8_t code, uint8_t scale);
// W[r][i] as an exact double.
double WeightValue(const OwnedMatrix& m, int64_t r, int64_t i);

// Runs MatMul with the given path and thread count, restoring the previous settings.
std::vector<float> RunMatMul(const OwnedMatrix& m, const std::vector<float>& x, int64_t T, Isa isa,
                             int threads);

// "float32 bits identical", with a readable first difference for the failure message.
std::string FirstBitDifference(const std::vector<float>& want, const std::vector<float>& got,
                               int64_t rows);

const char* TypeName(WeightType type);

}  // namespace k3::kernels::testing
