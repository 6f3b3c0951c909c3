// The weight sources on a share (k3prep split): an expert another rank's share holds is a
// failure naming the share (never a read of a record that names no bytes), and every size that
// sums expert bytes (the streaming plan's cache, --preload, the resident bytes) counts only the
// experts the share holds.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/align.h"
#include "formats/expert_share.h"
#include "formats/prepared_manifest.h"
#include "k3prep/split/split.h"
#include "k3run/stream/streaming_plan.h"
#include "k3run/stream/streaming_weights.h"
#include "k3run/weights/weights.h"
#include "tests/support/synth_fixture.h"
#include "tests/support/temp_dir.h"

namespace k3::run {
namespace {

constexpr char kReason[] =
    "not in this prepared directory (it holds rank 1 of 2's share; run it as rank 1 of mpirun "
    "-np 2 … --mpi)";

// Rank 1 of 2 of the tiny model: experts 4-7 of each of its 12 MoE layers (1..12).
class ShareWeights : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new test::TempDir();
    prep::SplitOptions o;
    o.prepared = test::SynthFixture({"tiny", 0, prepared::ExpertsMode::kCopy}).prepared;
    o.out = tmp_->Join("share");
    o.ranks = 2;
    o.rank = 1;
    Result<prep::SplitResult> r = prep::RunSplit(Env::Default(), o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
  }
  void SetUp() override {
    Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), tmp_->Join("share"));
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    p_ = std::move(p).value();
  }
  uint64_t Slot() const { return AlignUp(p_.experts.At(1, 4).length, 64); }

  static test::TempDir* tmp_;
  prepared::PreparedDir p_;
};
test::TempDir* ShareWeights::tmp_ = nullptr;

TEST_F(ShareWeights, RamWeightsAbsentExpertIsAFailureNamingTheShare) {
  Result<std::unique_ptr<RamWeights>> w = RamWeights::Open(Env::Default(), &p_);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ((*w)->Expert(3, 1), nullptr);
  EXPECT_EQ((*w)->Expert(3, 1), nullptr);  // asked again: still one failure
  EXPECT_NE((*w)->Expert(3, 5), nullptr);
  ASSERT_EQ((*w)->Failures().size(), 1u);
  const ExpertFailure& f = (*w)->Failures()[0];
  EXPECT_EQ(f.layer, 3);
  EXPECT_EQ(f.expert, 1);
  EXPECT_EQ(f.reason, kReason);
  EXPECT_EQ((*w)->Counters().experts, p_.experts.At(3, 5).length);
}

TEST_F(ShareWeights, StreamingPlanCountsOnlyTheHeldExperts) {
  BudgetRequest all;
  all.budget_gb = 1e6;
  Result<StreamingPlan> plan = PlanStreaming(p_, all, 0);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->expert_slots, 48);  // 4 of 8 experts × 12 MoE layers
  EXPECT_EQ(plan->expert_slot_bytes, Slot());
  EXPECT_TRUE(CheckPreloadFits(*plan, p_).ok());
  BudgetRequest small = all;
  small.budget_gb.reset();
  small.trunk_gb = 1.0;
  small.cache_gb = double(47 * Slot()) / 1e9;
  Result<StreamingPlan> short_plan = PlanStreaming(p_, small, 0);
  ASSERT_TRUE(short_plan.ok()) << short_plan.status().ToString();
  Status s = CheckPreloadFits(*short_plan, p_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("holds 47 of 48 experts (this rank's share)"), std::string::npos)
      << s.message();
}

TEST_F(ShareWeights, StreamingPreloadReadsOnlyTheShareAndAbsentExpertsFail) {
  BudgetRequest all;
  all.budget_gb = 1e6;
  Result<StreamingPlan> plan = PlanStreaming(p_, all, 0);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  StreamingOptions o;
  o.preload_experts = true;
  Result<std::unique_ptr<StreamingWeights>> w = StreamingWeights::Open(Env::Default(), &p_, *plan, o);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  StreamingWeights& sw = **w;
  EXPECT_TRUE(sw.Failures().empty());
  EXPECT_EQ(sw.Counters().experts, 48 * p_.experts.At(1, 4).length);
  EXPECT_EQ(sw.PlannedResidentBytes(), plan->bytes());
  EXPECT_TRUE(sw.Resident(2, 7));
  EXPECT_FALSE(sw.Resident(2, 0));

  const std::vector<int32_t> wave = {0, 6};
  sw.WillUse(4, wave);
  EXPECT_EQ(sw.Expert(4, 0), nullptr);
  EXPECT_NE(sw.Expert(4, 6), nullptr);
  EXPECT_TRUE(sw.ExpertReady(4, 0));
  sw.ReleaseExperts(4);
  EXPECT_EQ(sw.Expert(5, 3), nullptr);  // asked without a wave
  ASSERT_EQ(sw.Failures().size(), 2u);
  EXPECT_EQ(sw.Failures()[0].layer, 4);
  EXPECT_EQ(sw.Failures()[0].expert, 0);
  EXPECT_EQ(sw.Failures()[0].reason, kReason);
  EXPECT_EQ(sw.Failures()[1].layer, 5);
  EXPECT_EQ(sw.Failures()[1].expert, 3);
  EXPECT_EQ(sw.Counters().experts, 48 * p_.experts.At(1, 4).length);  // nothing read for them
}

TEST_F(ShareWeights, StreamingWithoutPreloadNeverReadsAnAbsentRecord) {
  BudgetRequest req;
  req.trunk_gb = 1.0;
  req.cache_gb = double(8 * Slot()) / 1e9;
  Result<StreamingPlan> plan = PlanStreaming(p_, req, 0);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  StreamingOptions o;
  o.prefetch_experts = 2;
  Result<std::unique_ptr<StreamingWeights>> w = StreamingWeights::Open(Env::Default(), &p_, *plan, o);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  StreamingWeights& sw = **w;
  const std::vector<int32_t> guesses = {1, 5};
  sw.Prefetch(6, guesses);  // the absent guess is not read
  const std::vector<int32_t> wave = {1, 5};
  sw.WillUse(6, wave);
  EXPECT_EQ(sw.Expert(6, 1), nullptr);
  EXPECT_NE(sw.Expert(6, 5), nullptr);
  sw.ReleaseExperts(6);
  ASSERT_EQ(sw.Failures().size(), 1u);
  EXPECT_EQ(sw.Failures()[0].reason, kReason);
  EXPECT_EQ(sw.stats().prefetches, 1u);    // expert 5 only
  EXPECT_EQ(sw.stats().expert_reads, 1u);  // the guess, claimed by the wave
  EXPECT_EQ(sw.Counters().experts, p_.experts.At(6, 5).length);
}

}  // namespace
}  // namespace k3::run
