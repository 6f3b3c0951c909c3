// Alignment arithmetic on byte counts and offsets (file offsets, buffer sizes, O_DIRECT windows).
//
// Precondition of both functions: a > 0. AlignUp also needs v + (a - 1) to fit in 64 bits, i.e.
// v <= UINT64_MAX - (a - 1); every caller rounds sizes and offsets bounded far below that (the
// prepared directory caps offsets at 2^50, buffers are bounded by memory). Both are asserted in
// builds with assertions on. `a` need not be a power of two.
#pragma once

#include <cassert>
#include <cstdint>
#include <limits>

namespace k3 {

// The smallest multiple of `a` that is >= v.
constexpr uint64_t AlignUp(uint64_t v, uint64_t a) {
  assert(a > 0 && v <= std::numeric_limits<uint64_t>::max() - (a - 1));
  return (v + a - 1) / a * a;
}

// The largest multiple of `a` that is <= v.
constexpr uint64_t AlignDown(uint64_t v, uint64_t a) {
  assert(a > 0);
  return v / a * a;
}

}  // namespace k3
