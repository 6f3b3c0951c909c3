#include "common/sysinfo.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <vector>

namespace k3 {
namespace {

TEST(SysInfo, CoreCountIsBetweenOneAndOnlineCpus) {
  const int n = CoreCount();
  EXPECT_GE(n, 1);
  EXPECT_LE(n, static_cast<int>(sysconf(_SC_NPROCESSORS_CONF)));
}

TEST(SysInfo, MemAvailableIsPositiveAndBelowPhysicalMemory) {
  auto avail = MemAvailableBytes();
  ASSERT_TRUE(avail.ok()) << avail.status().ToString();
  const uint64_t phys =
      static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  EXPECT_GT(*avail, 0u);
  EXPECT_LE(*avail, phys);
}

TEST(SysInfo, PeakRssGrowsWhenMemoryIsTouched) {
  const uint64_t before = PeakRssBytes();
  EXPECT_GT(before, 0u);
  std::vector<char> block(64u << 20);
  for (size_t i = 0; i < block.size(); i += 4096) block[i] = 1;
  const uint64_t after = PeakRssBytes();
  EXPECT_GE(after, before);
  EXPECT_GE(after, 64u << 20);
  EXPECT_EQ(block[4096], 1);
}

TEST(SysInfo, CpuFeaturesAreConsistent) {
  const CpuFeatures f = DetectCpu();
  // AVX-512BW implies AVX-512F, which implies AVX2 on every shipped x86 CPU.
  if (f.avx512bw) {
    EXPECT_TRUE(f.avx512f);
  }
  if (f.avx512f) {
    EXPECT_TRUE(f.avx2);
  }
  EXPECT_EQ(f.avx2, static_cast<bool>(__builtin_cpu_supports("avx2")));
}

}  // namespace
}  // namespace k3
