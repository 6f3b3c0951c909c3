// The exact MXFP4 weight table (see kernels_internal.h). Built with ldexp in double, where every
// entry is exact, then narrowed to fp32: exact too (matmul.h proves the lowest set bit is
// ≥ 2^−128), except values ≥ 2^128, which become ±inf exactly as an fp32 multiply would.
#include <cmath>
#include <limits>

#include "k3run/kernels/kernels_internal.h"

namespace k3::kernels::internal {
namespace {

// E2M1 magnitudes for codes 0..7 (MODEL.md §4); bit 3 of the code is the sign.
constexpr double kE2M1Magnitude[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

struct Table {
  Mxfp4LutRow rows[256];
  Table() {
    for (int s = 0; s < 256; ++s) {
      for (int c = 0; c < 8; ++c) {
        // Byte 255 is a zero scale: E2M1·0, which keeps the code's sign on zero.
        const double mag = s == 255 ? 0.0 : std::ldexp(kE2M1Magnitude[c], s - 127);
        // Spelled out rather than left to the narrowing, whose overflow C++ leaves undefined.
        const float v =
            mag >= 0x1p128 ? std::numeric_limits<float>::infinity() : static_cast<float>(mag);
        rows[s].v[c] = v;
        rows[s].v[c + 8] = -v;  // −0.0 for code 8, the bitwise sign flip the AVX2 path uses
      }
    }
  }
};

}  // namespace

const Mxfp4LutRow* Mxfp4Lut() {
  static const Table table;
  return table.rows;
}

}  // namespace k3::kernels::internal
