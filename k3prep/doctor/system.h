// What `k3prep doctor` asks the machine (beyond common/sysinfo.h): the full list of CPU
// features worth reporting, which kernel path k3run would pick, whether io_uring may be used, and
// what kind of file system holds a directory.
//
// Why not in common/sysinfo.h: only the doctor reports these; sysinfo keeps what the engine
// itself decides on. Non-goals: deciding anything (the doctor's rules are in k3prep/doctor/doctor.cpp).
#pragma once

#include <string>

#include "common/sysinfo.h"

namespace k3::prep {

struct CpuReport {
  CpuFeatures base;  // avx2, fma, avx512f, avx512bw (common/sysinfo.h, XGETBV-checked)
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512cd = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
  bool f16c = false;
  bool bmi2 = false;
  bool sha_ni = false;  // SHA-256 instructions: OpenSSL hashes downloads ~3× faster with them
};
CpuReport DetectCpuReport();

// The matmul path k3run picks with K3_ISA unset: "avx512" (AVX-512F+BW, plus AVX2+FMA),
// "avx2" (AVX2+FMA) or "scalar". Mirrors BestSupportedIsa in k3run/kernels/matmul.cpp, which
// k3prep may not link (DESIGN.md §2); doctor_k3run_test.cpp checks the two agree.
const char* KernelPathFor(const CpuFeatures& cpu);

struct UringReport {
  bool available = false;
  std::string reason;  // why io_uring_queue_init refused (strerror + what usually causes it)
};
// Tries io_uring_queue_init with a small ring and tears it down again.
UringReport ProbeIoUring();

// The file system type of `path` from statfs(2): "ext4", "xfs", "btrfs", "tmpfs", … or
// "0x<magic>" when unknown; empty when statfs fails. `in_memory` is true for tmpfs/ramfs,
// where "disk" bandwidth is memory bandwidth and nothing outlives a reboot.
struct FsType {
  std::string name;
  bool in_memory = false;
};
FsType FileSystemOf(const std::string& path);

}  // namespace k3::prep
