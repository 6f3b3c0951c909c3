// What the MatMul bodies keep per compute thread between calls, for memory plans to count
// (k3run/stream/memory_plan.cpp). Today one buffer: the AVX-512 MXFP4 rows' copy of their
// activations in the decode's lane order (kernels_internal.h, MatMulScratch), at most one
// activation tile of a wide call, since MatMul hands the bodies wide calls in cache tiles.
#pragma once

#include <cstdint>

namespace k3::kernels {

// Bytes a compute thread keeps for MXFP4 matrices of up to `cols` columns, at any T.
int64_t MatMulThreadScratchBytes(int64_t cols);

}  // namespace k3::kernels
