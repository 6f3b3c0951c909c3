#include "k3prep/doctor/system.h"

#include <liburing.h>
#include <linux/magic.h>
#include <sys/vfs.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace k3::prep {

CpuReport DetectCpuReport() {
  CpuReport r;
  r.base = DetectCpu();
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // libgcc checks the OS saves the ZMM state, so these are usable, not merely present.
  r.avx512vl = __builtin_cpu_supports("avx512vl");
  r.avx512dq = __builtin_cpu_supports("avx512dq");
  r.avx512cd = __builtin_cpu_supports("avx512cd");
  r.avx512vnni = __builtin_cpu_supports("avx512vnni");
  r.avx512bf16 = __builtin_cpu_supports("avx512bf16");
  r.bmi2 = __builtin_cpu_supports("bmi2");
  // libgcc 12 knows neither F16C nor SHA: read CPUID. F16C works on YMM registers, so it counts
  // only where AVX state is saved (__builtin_cpu_supports("avx") checks XGETBV); SHA uses XMM.
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) != 0) {
    r.f16c = (c & (1u << 29)) != 0 && __builtin_cpu_supports("avx");
  }
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) != 0) r.sha_ni = (b & (1u << 29)) != 0;
#endif
  return r;
}

const char* KernelPathFor(const CpuFeatures& cpu) {
  if (cpu.avx512f && cpu.avx512bw && cpu.avx2 && cpu.fma) return "avx512";
  if (cpu.avx2 && cpu.fma) return "avx2";
  return "scalar";
}

UringReport ProbeIoUring() {
  UringReport r;
  io_uring ring{};
  const int ret = io_uring_queue_init(4, &ring, 0);
  if (ret == 0) {
    io_uring_queue_exit(&ring);
    r.available = true;
    return r;
  }
  const int err = -ret;
  r.reason = std::string("io_uring_queue_init: ") + std::strerror(err);
  switch (err) {
    case EPERM:
      r.reason += " (disabled by sysctl kernel.io_uring_disabled or a container's seccomp "
                  "profile)";
      break;
    case ENOSYS:
      r.reason += " (kernel built without io_uring, or older than 5.1)";
      break;
    case ENOMEM:
      r.reason += " (locked-memory limit too low: raise `ulimit -l`)";
      break;
    default:
      break;
  }
  r.reason += "; reads use a pread thread pool instead";
  return r;
}

FsType FileSystemOf(const std::string& path) {
  FsType t;
  struct statfs st {};
  if (::statfs(path.c_str(), &st) != 0) return t;
  // f_type's width differs between architectures; compare as unsigned 32-bit magics.
  const auto magic = static_cast<uint32_t>(st.f_type);
  struct Known {
    uint32_t magic;
    const char* name;
    bool in_memory;
  };
  static constexpr Known kKnown[] = {
      {EXT4_SUPER_MAGIC, "ext4", false},   {XFS_SUPER_MAGIC, "xfs", false},
      {BTRFS_SUPER_MAGIC, "btrfs", false}, {0xF2F52010u, "f2fs", false},
      {0x2FC12FC1u, "zfs", false},         {NFS_SUPER_MAGIC, "nfs", false},
      {OVERLAYFS_SUPER_MAGIC, "overlay", false}, {FUSE_SUPER_MAGIC, "fuse", false},
      {V9FS_MAGIC, "9p", false},           {TMPFS_MAGIC, "tmpfs", true},
      {RAMFS_MAGIC, "ramfs", true},
  };
  for (const Known& k : kKnown) {
    if (k.magic == magic) {
      t.name = k.name;
      t.in_memory = k.in_memory;
      return t;
    }
  }
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", magic);
  t.name = buf;
  return t;
}

}  // namespace k3::prep
