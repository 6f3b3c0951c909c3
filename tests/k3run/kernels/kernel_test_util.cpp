#include "tests/k3run/kernels/kernel_test_util.h"

#include <cmath>
#include <cstring>
#include <sstream>

namespace k3::kernels::testing {

Matrix OwnedMatrix::view() const {
  Matrix m{type, rows, cols, nullptr, nullptr};
  switch (type) {
    case WeightType::kF32:
      m.data = f32.data();
      break;
    case WeightType::kBF16:
      m.data = bf16.data();
      break;
    case WeightType::kMXFP4:
      m.data = packed.data();
      m.scales = scales.data();
      break;
  }
  return m;
}

OwnedMatrix RandomMatrix(WeightType type, int64_t rows, int64_t cols, uint64_t seed, int scale_lo,
                         int scale_hi) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  OwnedMatrix m;
  m.type = type;
  m.rows = rows;
  m.cols = cols;
  const size_t n = static_cast<size_t>(rows * cols);
  switch (type) {
    case WeightType::kF32:
      m.f32.resize(n);
      for (float& v : m.f32) v = normal(rng);
      break;
    case WeightType::kBF16:
      m.bf16.resize(n);
      for (uint16_t& v : m.bf16) v = F32ToBf16RoundNearestEven(normal(rng));
      break;
    case WeightType::kMXFP4: {
      std::uniform_int_distribution<int> byte(0, 255), scale(scale_lo, scale_hi);
      m.packed.resize(n / 2);
      for (uint8_t& v : m.packed) v = static_cast<uint8_t>(byte(rng));
      m.scales.resize(n / 32);
      for (uint8_t& v : m.scales) v = static_cast<uint8_t>(scale(rng));
      break;
    }
  }
  return m;
}

std::vector<float> RandomActivations(int64_t T, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(T * cols));
  for (float& v : x) v = normal(rng);
  return x;
}

double DequantMxfp4(uint8_t code, uint8_t scale) {
  static const double kE2M1[16] = {0.0,  0.5,  1.0,  1.5,  2.0,  3.0,  4.0,  6.0,
                                   -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0};
  if (scale == 255) return 0.0;
  return std::ldexp(kE2M1[code & 15], int{scale} - 127);
}

double WeightValue(const OwnedMatrix& m, int64_t r, int64_t i) {
  const size_t k = static_cast<size_t>(r * m.cols + i);
  switch (m.type) {
    case WeightType::kF32:
      return m.f32[k];
    case WeightType::kBF16: {
      const uint32_t bits = uint32_t{m.bf16[k]} << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case WeightType::kMXFP4: {
      const uint8_t byte = m.packed[static_cast<size_t>(r * (m.cols / 2) + i / 2)];
      const uint8_t code = (i % 2 == 0) ? (byte & 15) : (byte >> 4);
      return DequantMxfp4(code, m.scales[static_cast<size_t>(r * (m.cols / 32) + i / 32)]);
    }
  }
  return 0.0;
}

std::vector<float> RunMatMul(const OwnedMatrix& m, const std::vector<float>& x, int64_t T, Isa isa,
                             int threads) {
  const Isa old_isa = ActiveIsa();
  const int old_threads = Threads();
  SetIsa(isa);
  SetThreads(threads);
  // NaN-filled so an element the kernel forgot to write cannot pass as a result.
  std::vector<float> y(static_cast<size_t>(T * m.rows), std::nanf("1"));
  MatMul(m.view(), x.data(), T, y.data());
  SetIsa(old_isa);
  SetThreads(old_threads);
  return y;
}

std::string FirstBitDifference(const std::vector<float>& want, const std::vector<float>& got,
                               int64_t rows) {
  if (want.size() != got.size()) return "sizes differ";
  for (size_t k = 0; k < want.size(); ++k) {
    uint32_t a, b;
    std::memcpy(&a, &want[k], 4);
    std::memcpy(&b, &got[k], 4);
    if (a != b) {
      std::ostringstream os;
      os << "first difference at t=" << static_cast<int64_t>(k) / rows
         << " r=" << static_cast<int64_t>(k) % rows << ": want " << want[k] << " (0x" << std::hex
         << a << ") got " << got[k] << " (0x" << b << ")";
      return os.str();
    }
  }
  return "";
}

const char* TypeName(WeightType type) {
  switch (type) {
    case WeightType::kF32:
      return "F32";
    case WeightType::kBF16:
      return "BF16";
    case WeightType::kMXFP4:
      return "MXFP4";
  }
  return "?";
}

}  // namespace k3::kernels::testing
