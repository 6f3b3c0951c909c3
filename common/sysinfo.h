// System information for planning and `k3prep doctor`: ISA features, cores, memory, peak RSS.
// Free disk space is Env::FreeSpace (so tests can fake it).
#pragma once

#include <cstdint>

#include "common/status.h"

namespace k3 {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512bw = false;
};

// CPUID plus OS support for the register state (XGETBV), so a feature is reported only when
// it can actually be used.
CpuFeatures DetectCpu();
// CPUs this process may run on (sched_getaffinity), at least 1.
int CoreCount();
// MemAvailable from /proc/meminfo, in bytes.
Result<uint64_t> MemAvailableBytes();
// Peak resident set size of this process (getrusage ru_maxrss), in bytes.
uint64_t PeakRssBytes();

}  // namespace k3
