// Choosing the kernel path: K3_ISA values, CPU support, names (matmul.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "k3run/kernels/matmul.h"

namespace k3::kernels {
namespace {

using ::testing::HasSubstr;

CpuFeatures Cpu(bool avx2, bool fma, bool avx512) {
  CpuFeatures c;
  c.avx2 = avx2;
  c.fma = fma;
  c.avx512f = avx512;
  c.avx512bw = avx512;
  return c;
}

TEST(Isa, NamesAreTheK3IsaValues) {
  EXPECT_STREQ(IsaName(Isa::kScalar), "scalar");
  EXPECT_STREQ(IsaName(Isa::kAvx2), "avx2");
  EXPECT_STREQ(IsaName(Isa::kAvx512), "avx512");
}

TEST(Isa, UnsetPicksTheBestSupported) {
  EXPECT_EQ(*ResolveIsaRequest("", Cpu(true, true, true)), Isa::kAvx512);
  EXPECT_EQ(*ResolveIsaRequest("", Cpu(true, true, false)), Isa::kAvx2);
  EXPECT_EQ(*ResolveIsaRequest("", Cpu(true, false, false)), Isa::kScalar);  // AVX2 w/o FMA
  EXPECT_EQ(*ResolveIsaRequest("", Cpu(false, false, false)), Isa::kScalar);
}

TEST(Isa, ExplicitSupportedValueIsHonoured) {
  EXPECT_EQ(*ResolveIsaRequest("scalar", Cpu(true, true, true)), Isa::kScalar);
  EXPECT_EQ(*ResolveIsaRequest("avx2", Cpu(true, true, true)), Isa::kAvx2);
  EXPECT_EQ(*ResolveIsaRequest("avx512", Cpu(true, true, true)), Isa::kAvx512);
}

TEST(Isa, UnsupportedValueIsInvalidAndNamesWhatIsSupported) {
  const Result<Isa> r = ResolveIsaRequest("avx512", Cpu(true, true, false));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalid);
  EXPECT_THAT(r.status().message(), HasSubstr("K3_ISA=avx512"));
  EXPECT_THAT(r.status().message(), HasSubstr("supported here: scalar, avx2"));
}

TEST(Isa, UnknownValueIsInvalidAndListsAcceptedValues) {
  const Result<Isa> r = ResolveIsaRequest("AVX2", Cpu(true, true, true));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalid);
  EXPECT_THAT(r.status().message(), HasSubstr("K3_ISA=AVX2"));
  EXPECT_THAT(r.status().message(), HasSubstr("scalar, avx2, avx512"));
}

TEST(Isa, EnvironmentIsRead) {
  ASSERT_EQ(setenv("K3_ISA", "neon", 1), 0);
  const Result<Isa> r = IsaFromEnvironment();
  unsetenv("K3_ISA");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("K3_ISA=neon"));
  ASSERT_EQ(setenv("K3_ISA", "scalar", 1), 0);
  const Result<Isa> s = IsaFromEnvironment();
  unsetenv("K3_ISA");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, Isa::kScalar);
}

TEST(Isa, SetIsaChangesTheActivePath) {
  const Isa old = ActiveIsa();
  EXPECT_TRUE(IsaSupported(Isa::kScalar));
  SetIsa(Isa::kScalar);
  EXPECT_EQ(ActiveIsa(), Isa::kScalar);
  SetIsa(old);
}

TEST(Isa, SetIsaOfAnUnsupportedPathAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // OpenMP may have started threads
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (IsaSupported(isa)) continue;
    EXPECT_DEATH(SetIsa(isa), "lacks that path");
  }
  if (IsaSupported(Isa::kAvx512)) GTEST_SKIP() << "every path is supported on this CPU";
}

TEST(Threads, NonPositiveMeansOne) {
  const int old = Threads();
  SetThreads(0);
  EXPECT_EQ(Threads(), 1);
  SetThreads(3);
  EXPECT_EQ(Threads(), 3);
  SetThreads(old);
}

}  // namespace
}  // namespace k3::kernels
