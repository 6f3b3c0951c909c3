// The doctor mirrors three small things of k3run that k3prep may not link (DESIGN.md §2): the
// preset table, the minimum budget rule and the kernel-path choice. This binary links both
// libraries and fails the moment either side changes alone.
#include <gtest/gtest.h>

#include "common/env.h"
#include "formats/prepared_manifest.h"
#include "k3prep/doctor/budget.h"
#include "k3prep/doctor/system.h"
#include "k3prep/pack/pack.h"
#include "k3prep/synth/checkpoint.h"
#include "k3run/kernels/matmul.h"
#include "k3run/stream/streaming_plan.h"
#include "tests/support/synth_fixture.h"
#include "tests/support/temp_dir.h"

namespace k3::prep {
namespace {

TEST(DoctorMirrorsK3run, PresetTable) {
  const auto& ours = RunPresets();
  const auto& theirs = run::BudgetPresets();
  ASSERT_EQ(ours.size(), theirs.size());
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_STREQ(ours[i].name, theirs[i].name);
    EXPECT_EQ(ours[i].gb, theirs[i].gb) << ours[i].name;
  }
}

TEST(DoctorMirrorsK3run, KernelPathForEveryFeatureCombination) {
  for (int bits = 0; bits < 16; ++bits) {
    CpuFeatures cpu;
    cpu.avx2 = (bits & 1) != 0;
    cpu.fma = (bits & 2) != 0;
    cpu.avx512f = (bits & 4) != 0;
    cpu.avx512bw = (bits & 8) != 0;
    Result<kernels::Isa> isa = kernels::ResolveIsaRequest("", cpu);
    ASSERT_TRUE(isa.ok()) << isa.status().ToString();
    EXPECT_STREQ(KernelPathFor(cpu), kernels::IsaName(*isa)) << "feature bits " << bits;
  }
}

TEST(DoctorMirrorsK3run, MinimumBudgetIsPlanStreamingsRefusalThreshold) {
  // The run's shared tiny prepared directory (read-only).
  const std::string prep = test::SynthFixture({"tiny", 0, prepared::ExpertsMode::kCopy}).prepared;
  Result<prepared::PreparedDir> dir = prepared::OpenPrepared(Env::Default(), prep);
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();

  uint64_t largest = 0;
  for (const prepared::ExpertRecord& r : dir->experts.records) largest = std::max(largest, r.length);
  const BudgetFloor f = FloorOf(dir->manifest.runs, largest, dir->manifest.config.topk,
                                !dir->experts.records.empty());
  run::BudgetRequest at;
  at.budget_gb = double(f.total()) / 1e9;
  Result<run::StreamingPlan> ok = run::PlanStreaming(*dir, at, 0);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->trunk_min, f.trunk_min);
  EXPECT_EQ(ok->cache_min, f.cache_min);
  run::BudgetRequest below;
  below.budget_gb = double(f.total() - 1) / 1e9;
  EXPECT_FALSE(run::PlanStreaming(*dir, below, 0).ok());
}

}  // namespace
}  // namespace k3::prep
