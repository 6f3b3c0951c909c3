// The yardsticks the kernel benchmarks (k3_bench_kernels, k3_bench_roofline) measure kernels
// against, in the same run, on this machine: a STREAM-like read bandwidth and the fp32 FMA peak
// of each ISA path. Both run on the kernels' own compute threads (kernels::ParallelChunks, as
// MatMul uses) and return the best of `passes` timed passes after one warm-up pass.
//
// Read: `threads` threads XOR-reduce `mem` in 16-byte loads, 8 independent accumulators each
// (make `mem` several times the last-level cache so every pass comes from DRAM). GB/s.
// FMA: `threads` threads run independent fp32 FMA chains held in registers (scalar: std::fmaf
// on 16 lanes, as the scalar MatMul path calls it; avx2: 12 ymm chains; avx512: 16 zmm chains);
// G lane-FMA/s. The caller checks kernels::IsaSupported(isa) first.
// MXFP4 decode (avx512 only; the caller checks kernels::IsaSupported(kAvx512)): `threads`
// threads run the avx512 MXFP4 kernel's arithmetic for 16 weights (a variable shift, a
// permutexvar into the group's table, one FMA) in 12 independent chains in registers; GB/s of
// MXFP4 weights (packed + scales, as the kernel benchmarks count them) it would decode with
// every load free. A matvec's weights cannot stream faster than this on that path.
#pragma once

#include <cstdint>
#include <vector>

#include <string>

#include "common/status.h"
#include "k3run/kernels/matmul.h"

namespace k3::testing {

double ReadGBs(const std::vector<uint64_t>& mem, int threads, int passes);
double FmaPeakG(kernels::Isa isa, int threads, int passes);
double Mxfp4DecodePeakGBs(int threads, int passes);

// The benchmarks' --isa=LIST: comma-separated path names, each resolved against this CPU
// (kernels::ResolveIsaRequest); the first bad name's error.
Result<std::vector<kernels::Isa>> ParseIsaList(const std::string& list);

}  // namespace k3::testing
