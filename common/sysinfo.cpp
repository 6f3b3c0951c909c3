#include "common/sysinfo.h"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "common/env.h"

namespace k3 {

CpuFeatures DetectCpu() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  // libgcc's cpu model checks XGETBV too, so a feature the OS does not save is reported absent.
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
#endif
  return f;
}

int CoreCount() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

Result<uint64_t> MemAvailableBytes() {
  const std::string path = "/proc/meminfo";
  // /proc files report size 0, so read with a plain loop instead of ReadFileToString.
  K3_ASSIGN_OR_RETURN(std::unique_ptr<File> file, Env::Default()->Open(path, OpenMode::kRead));
  std::string text;
  char buf[4096];
  for (;;) {
    size_t got = 0;
    K3_RETURN_IF_ERROR(file->PRead(text.size(), sizeof(buf), buf, &got));
    if (got == 0) break;
    text.append(buf, got);
  }
  const std::string key = "MemAvailable:";
  const size_t pos = text.find(key);
  if (pos == std::string::npos) {
    return Status::Io(path + ": no MemAvailable line (kernel older than 3.14?); pass an "
                             "explicit memory budget");
  }
  const char* p = text.c_str() + pos + key.size();
  char* end = nullptr;
  const unsigned long long kib = std::strtoull(p, &end, 10);
  if (end == p) return Status::Io(path + ": MemAvailable line has no number");
  return static_cast<uint64_t>(kib) * 1024;
}

uint64_t PeakRssBytes() {
  struct rusage ru {};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace k3
