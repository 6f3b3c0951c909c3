// StreamingWeights against RamWeights: identical logits and ids at every budget down to the
// minimum, both cache policies, 1 and 2 threads; plan refusals; expert and trunk read faults.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "k3prep/pack/pack.h"
#include "k3prep/synth/checkpoint.h"
#include "k3run/engine/generate.h"
#include "k3run/kernels/matmul.h"
#include "k3run/stream/memory_plan.h"
#include "k3run/stream/streaming_plan.h"
#include "k3run/stream/streaming_weights.h"
#include "tests/k3run/engine_fixture.h"
#include "tests/support/fault_env.h"
#include "tests/support/temp_dir.h"

namespace k3::run {
namespace {

using testing::kPrompt;
using testing::kPromptText;
using testing::RunCliArgs;
using testing::TinyPreparedDir;

constexpr int64_t kGen = 6;

struct Output {
  std::vector<int32_t> ids;
  std::vector<float> logits;
  StreamingStats stats;
  StreamingPlan plan;
};

// Greedy generation through any source; every step's logits appended.
Output RunGen(Model* model, WeightSource* w, int64_t /*vocab*/, int64_t gen) {
  Output out;
  out.ids = testing::GenerateThrough(w, model->config(), model->layers(), kPrompt, gen,
                                     /*recompute=*/false, &out.logits);
  return out;
}

Output Reference(const std::string& dir, int64_t gen) {
  std::unique_ptr<testing::Engine> e = testing::OpenEngine(dir);
  if (!e) return {};
  const ModelConfig& c = e->prepared.manifest.config;
  Model model(c, e->weights.get(), c.n_layers);
  return RunGen(&model, e->weights.get(), c.vocab, gen);
}

Output Streamed(const std::string& dir, const BudgetRequest& req, int64_t gen) {
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), dir);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  if (!p.ok()) return {};
  Result<StreamingPlan> plan = PlanStreaming(*p, req, 0);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  if (!plan.ok()) return {};
  Result<std::unique_ptr<StreamingWeights>> w = StreamingWeights::Open(Env::Default(), &*p, *plan);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  if (!w.ok()) return {};
  const ModelConfig& c = p->manifest.config;
  Model model(c, w->get(), c.n_layers);
  Output out = RunGen(&model, w->get(), c.vocab, gen);
  out.stats = (*w)->stats();
  out.plan = *plan;
  EXPECT_TRUE((*w)->Failures().empty());
  EXPECT_EQ(model.experts_skipped(), 0);
  return out;
}

// The plan's minimum, computed from a generous plan of the same directory.
StreamingPlan MinimumOf(const std::string& dir) {
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), dir);
  EXPECT_TRUE(p.ok());
  BudgetRequest big;
  big.budget_gb = 1e6;
  Result<StreamingPlan> plan = PlanStreaming(*p, big, 0);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  return plan.ok() ? *plan : StreamingPlan{};
}

BudgetRequest Budget(const std::string& dir, const std::string& level, CachePolicy policy) {
  const StreamingPlan min = MinimumOf(dir);
  BudgetRequest r;
  r.policy = policy;
  if (level == "resident") {
    r.budget_gb = 1e6;
  } else if (level == "mid") {
    r.trunk_gb = double(min.trunk_min * 3) / 1e9;
    r.cache_gb = double(min.cache_min * 3) / 1e9;
  } else {  // minimum
    r.trunk_gb = double(min.trunk_min) / 1e9;
    r.cache_gb = double(min.cache_min) / 1e9;
  }
  return r;
}

void ExpectSameBits(const Output& want, const Output& got) {
  EXPECT_EQ(want.ids, got.ids);
  ASSERT_EQ(want.logits.size(), got.logits.size());
  EXPECT_EQ(0, std::memcmp(want.logits.data(), got.logits.data(),
                           want.logits.size() * sizeof(float)))
      << "logits differ from the everything-resident RamWeights run";
}

struct Case {
  std::string level;
  CachePolicy policy;
  int threads;
};

class StreamingTiny : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { saved_ = kernels::Threads(); }
  void TearDown() override { kernels::SetThreads(saved_); }
  int saved_ = 1;
};

TEST_P(StreamingTiny, LogitsAndIdsBitIdenticalToRamWeights) {
  const Case& k = GetParam();
  kernels::SetThreads(1);
  static const Output want = Reference(TinyPreparedDir(), kGen);
  ASSERT_FALSE(want.ids.empty());
  kernels::SetThreads(k.threads);
  const Output got = Streamed(TinyPreparedDir(), Budget(TinyPreparedDir(), k.level, k.policy), kGen);
  ExpectSameBits(want, got);
  if (k.level == "minimum") {
    // The minimum really is the minimum: a 2-slot ring, top-k + 1 expert slots, lm_head streamed,
    // and passes whose expert union exceeds the cache ran in several waves with evictions.
    const auto engine = testing::OpenEngine(TinyPreparedDir());  // owns the config below
    const ModelConfig& c = engine->prepared.manifest.config;
    EXPECT_EQ(got.plan.ring_slots, 2);
    EXPECT_EQ(got.plan.expert_slots, c.topk + 1);
    EXPECT_FALSE(got.plan.lm_head_held);
    EXPECT_GT(got.stats.ring_loads, 0u);
    EXPECT_GT(got.stats.expert_evictions, 0u);
    const Output all = Streamed(TinyPreparedDir(), Budget(TinyPreparedDir(), "resident", k.policy),
                                kGen);
    EXPECT_GT(got.stats.waves, all.stats.waves) << "the prefill union never needed waves";
  }
  if (k.level == "mid") {  // a mix: some layers pinned, the rest through the ring
    EXPECT_FALSE(got.plan.pinned.empty());
    EXPECT_GE(got.plan.ring_slots, 2);
  }
  if (k.level == "resident") {
    EXPECT_EQ(got.plan.ring_slots, 0);
    EXPECT_TRUE(got.plan.lm_head_held);
    EXPECT_EQ(got.stats.expert_evictions, 0u);
  }
}

std::vector<Case> Cases() {
  std::vector<Case> v;
  for (const char* level : {"resident", "mid", "minimum"}) {
    for (CachePolicy p : {CachePolicy::kLru, CachePolicy::kS3Fifo}) {
      for (int t : {1, 2}) v.push_back(Case{level, p, t});
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Budgets, StreamingTiny, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return i.param.level + "_" + CachePolicyName(i.param.policy) + "_t" +
                                  std::to_string(i.param.threads);
                         });

// --- the small preset (93 layers, 64 experts top-8), once, at the minimum -------------------

TEST(StreamingSmall, MinimumBudgetBitIdenticalToRamWeights) {
  const std::string& dir = testing::SmallPreparedDir();
  const Output want = Reference(dir, 2);
  ASSERT_FALSE(want.ids.empty());
  const Output got = Streamed(dir, Budget(dir, "minimum", CachePolicy::kS3Fifo), 2);
  ExpectSameBits(want, got);
  EXPECT_EQ(got.plan.ring_slots, 2);
  EXPECT_FALSE(got.plan.lm_head_held);
}

// --- the plan's rules ------------------------------------------------------------------------

TEST(StreamingPlanRule, PinsLargestRunsFirstWithinTrunkBudget) {
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), TinyPreparedDir());
  ASSERT_TRUE(p.ok());
  const StreamingPlan min = MinimumOf(TinyPreparedDir());
  for (uint64_t extra : {uint64_t{0}, min.trunk_min / 2, min.trunk_min * 2}) {
    BudgetRequest req;
    req.trunk_gb = double(min.trunk_min + extra) / 1e9;
    Result<StreamingPlan> plan = PlanStreaming(*p, req, 0);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    uint64_t smallest_pinned = UINT64_MAX, largest_unpinned = 0;
    for (const prepared::TrunkRun& r : p->manifest.runs) {
      bool pinned = false;
      for (int l : plan->pinned) pinned = pinned || l == r.layer;
      if (pinned) smallest_pinned = std::min(smallest_pinned, r.length);
      if (!pinned) largest_unpinned = std::max(largest_unpinned, r.length);
    }
    EXPECT_GE(smallest_pinned == UINT64_MAX ? UINT64_MAX : smallest_pinned, largest_unpinned);
    EXPECT_GE(plan->ring_slot_bytes, largest_unpinned);
    EXPECT_EQ(plan->ring_slot_bytes % 4096, 0u);
    EXPECT_LE(plan->pinned_bytes + uint64_t(plan->ring_slots) * plan->ring_slot_bytes,
              min.trunk_min + extra);
  }
}

TEST(StreamingPlanRule, AutoPresetFollowsMemAvailable) {
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), TinyPreparedDir());
  ASSERT_TRUE(p.ok());
  BudgetRequest req;
  req.preset = "auto";
  Result<StreamingPlan> roomy = PlanStreaming(*p, req, uint64_t{64} << 30);
  ASSERT_TRUE(roomy.ok()) << roomy.status().ToString();
  EXPECT_EQ(roomy->ring_slots, 0);
  EXPECT_TRUE(roomy->lm_head_held);
  Result<StreamingPlan> tight = PlanStreaming(*p, req, 1000);
  ASSERT_FALSE(tight.ok());
  EXPECT_EQ(tight.status().code(), Code::kInvalid);
  EXPECT_NE(tight.status().message().find("--preset auto"), std::string::npos)
      << tight.status().message();
}

// --- the plan refuses below the minimum -----------------------------------------------------

TEST(StreamingPlanRefusal, TotalBelowMinimumNamesMinimumAndFlag) {
  const StreamingPlan min = MinimumOf(TinyPreparedDir());
  const testing::CliRun run = RunCliArgs(
      {TinyPreparedDir(), "--ids", kPromptText, "--gen", "1", "--budget-gb", "0.000001"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.stderr_text.find("--budget-gb"), std::string::npos) << run.stderr_text;
  // The minimum is the weights' (2 ring slots + top-k + 1 expert slots) plus what a TOTAL budget
  // also pays for: the latent caches, KDA states and a one-row pass's scratch.
  EXPECT_NE(run.stderr_text.find("trunk: 2 ring slots = " + FormatGb(min.trunk_min)),
            std::string::npos)
      << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("latent caches for 8 positions + KDA states + scratch for "
                                 "1-row passes = "),
            std::string::npos)
      << run.stderr_text;
}

TEST(StreamingPlanRefusal, TrunkBelowMinimumNamesTrunkFlag) {
  const StreamingPlan min = MinimumOf(TinyPreparedDir());
  const std::string trunk = std::to_string(double(min.trunk_min - 4096) / 1e9);
  const testing::CliRun run = RunCliArgs(
      {TinyPreparedDir(), "--ids", kPromptText, "--gen", "1", "--trunk-gb", trunk});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.stderr_text.find("--trunk-gb"), std::string::npos) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("minimum " + FormatGb(min.trunk_min) + " = " +
                                 std::to_string(min.trunk_min) + " bytes"),
            std::string::npos)
      << run.stderr_text;
}

TEST(StreamingPlanRefusal, CacheBelowTopKPlusOneNamesCacheFlag) {
  const StreamingPlan min = MinimumOf(TinyPreparedDir());
  const std::string cache = std::to_string(double(min.cache_min - min.expert_slot_bytes) / 1e9);
  const testing::CliRun run = RunCliArgs(
      {TinyPreparedDir(), "--ids", kPromptText, "--gen", "1", "--cache-gb", cache});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.stderr_text.find("--cache-gb"), std::string::npos) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("top-k + 1"), std::string::npos) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("minimum " + FormatGb(min.cache_min) + " = " +
                                 std::to_string(min.cache_min) + " bytes"),
            std::string::npos)
      << run.stderr_text;
}

TEST(StreamingPlanRefusal, UnknownPresetNamed) {
  const testing::CliRun run =
      RunCliArgs({TinyPreparedDir(), "--ids", kPromptText, "--preset", "phone"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.stderr_text.find("--preset phone"), std::string::npos) << run.stderr_text;
}

TEST(StreamingPlanRefusal, UnknownCachePolicyNamed) {
  const testing::CliRun run = RunCliArgs(
      {TinyPreparedDir(), "--ids", kPromptText, "--budget-gb", "1", "--cache-policy", "fifo"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.stderr_text.find("--cache-policy fifo"), std::string::npos) << run.stderr_text;
}

TEST(StreamingCli, ListPresetsNeedsNoPreparedDir) {
  const testing::CliRun run = RunCliArgs({"--list-presets"});
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  for (const char* want : {"laptop", "8 GB", "desktop", "32 GB", "workstation", "96 GB", "server",
                           "128 GB", "max", "224 GB", "auto"}) {
    EXPECT_NE(run.stdout_text().find(want), std::string::npos) << want;
  }
}

TEST(StreamingCli, MinimumBudgetRunMatchesDefaultRun) {
  const StreamingPlan min = MinimumOf(TinyPreparedDir());
  const testing::CliRun ram = RunCliArgs({TinyPreparedDir(), "--ids", kPromptText, "--gen", "4"});
  const testing::CliRun low = RunCliArgs(
      {TinyPreparedDir(), "--ids", kPromptText, "--gen", "4", "--trunk-gb",
       std::to_string(double(min.trunk_min) / 1e9), "--cache-gb",
       std::to_string(double(min.cache_min + 4096) / 1e9)});
  EXPECT_EQ(ram.exit_code, 0) << ram.stderr_text;
  EXPECT_EQ(low.exit_code, 0) << low.stderr_text;
  EXPECT_EQ(ram.stdout_text(), low.stdout_text());
  EXPECT_NE(low.stderr_text.find("streaming plan:"), std::string::npos) << low.stderr_text;
}

// --- experts published one by one ------------------------------------------------------------

// Bytes of an MXFP4 expert matrix (packed nibbles and scales).
std::string MatrixBytes(const kernels::Matrix& m) {
  std::string b(static_cast<const char*>(m.data), static_cast<size_t>(m.rows * m.cols / 2));
  b.append(reinterpret_cast<const char*>(m.scales),
           static_cast<size_t>(m.rows * m.cols / kernels::kMxfp4GroupSize));
  return b;
}

// Each expert of a wave can be used as soon as its OWN read is done: with one expert's read held
// back, the others are ready and returned while it is still blocked, it is not ready, and it is
// returned (with the bytes RAM weights give) once its read is let go. Through both readers.
void CheckExpertsPublishedOneByOne(bool force_pread) {
  const std::string& dir = TinyPreparedDir();
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), dir);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const ModelConfig& c = p->manifest.config;
  const int layer = c.first_dense;  // the first MoE layer
  std::vector<int32_t> wave = {0, 1, 2};
  // The io_uring reader reads descriptor-less (fault-injected) files one by one in request
  // order, which is file-offset order: hold back the LAST read, so the others can finish first.
  auto rec = [&](int32_t e) -> const prepared::ExpertRecord& {
    return p->experts.At(static_cast<uint32_t>(layer), static_cast<uint32_t>(e));
  };
  const int32_t held = *std::max_element(wave.begin(), wave.end(), [&](int32_t a, int32_t b) {
    return std::make_pair(rec(a).file_id, rec(a).offset) <
           std::make_pair(rec(b).file_id, rec(b).offset);
  });
  std::mutex mu;
  std::condition_variable cv;
  bool open = false, timed_out = false;
  test::FaultRule gate;
  gate.before_read = [&](uint64_t offset, size_t n) {
    if (offset + n <= rec(held).offset || offset >= rec(held).offset + rec(held).length) return;
    std::unique_lock<std::mutex> lk(mu);
    if (!cv.wait_for(lk, std::chrono::seconds(10), [&] { return open; })) timed_out = true;
  };
  test::FaultEnv env;
  for (const std::string& path : p->expert_paths) env.SetRule(path, gate);

  BudgetRequest req;
  req.budget_gb = 1e6;
  Result<StreamingPlan> plan = PlanStreaming(*p, req, 0);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  StreamingOptions options;
  options.force_pread = force_pread;
  Result<std::unique_ptr<StreamingWeights>> w = StreamingWeights::Open(&env, &*p, *plan, options);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  Result<std::unique_ptr<RamWeights>> ram = RamWeights::Open(Env::Default(), &*p);
  ASSERT_TRUE(ram.ok()) << ram.status().ToString();

  (*w)->WillUse(layer, wave);
  for (int32_t e : wave) {
    if (e == held) continue;
    const ops::GluWeights* got = (*w)->Expert(layer, e);
    ASSERT_NE(got, nullptr) << "expert " << e;
    EXPECT_TRUE((*w)->ExpertReady(layer, e));
    const ops::GluWeights* want = (*ram)->Expert(layer, e);
    ASSERT_NE(want, nullptr);
    EXPECT_EQ(MatrixBytes(got->gate), MatrixBytes(want->gate)) << "expert " << e;
    EXPECT_EQ(MatrixBytes(got->down), MatrixBytes(want->down)) << "expert " << e;
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    EXPECT_FALSE(timed_out) << "the other experts waited for the held read (the whole batch)";
  }
  EXPECT_FALSE((*w)->ExpertReady(layer, held)) << "its read is still held back";
  {
    std::lock_guard<std::mutex> lk(mu);
    open = true;
  }
  cv.notify_all();
  const ops::GluWeights* got = (*w)->Expert(layer, held);
  ASSERT_NE(got, nullptr);
  EXPECT_TRUE((*w)->ExpertReady(layer, held));
  EXPECT_EQ(MatrixBytes(got->up), MatrixBytes((*ram)->Expert(layer, held)->up));
  (*w)->ReleaseExperts(layer);
  EXPECT_EQ((*w)->stats().expert_reads, wave.size());
  EXPECT_EQ((*w)->stats().expert_hits, 0u);
  EXPECT_TRUE((*w)->Failures().empty());
}

TEST(StreamingExperts, EachExpertUsableWhenItsOwnReadIsDoneThroughIoUring) {
  CheckExpertsPublishedOneByOne(false);
}
TEST(StreamingExperts, EachExpertUsableWhenItsOwnReadIsDoneThroughPreadPool) {
  CheckExpertsPublishedOneByOne(true);
}

// --- read faults ----------------------------------------------------------------------------

TEST(StreamingFaults, ExpertEioSkipsCountsAndExitsFour) {
  const std::string& dir = TinyPreparedDir();
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), dir);
  ASSERT_TRUE(p.ok());
  // Find an expert the prompt routes to: run once and ask the cache what it holds.
  BudgetRequest req;
  req.budget_gb = 1e6;
  Result<StreamingPlan> plan = PlanStreaming(*p, req, 0);
  ASSERT_TRUE(plan.ok());
  Result<std::unique_ptr<StreamingWeights>> w = StreamingWeights::Open(Env::Default(), &*p, *plan);
  ASSERT_TRUE(w.ok());
  const ModelConfig& c = p->manifest.config;
  Model model(c, w->get(), c.n_layers);
  (void)RunGen(&model, w->get(), c.vocab, 1);
  int layer = -1, expert = -1;
  for (int L = c.first_dense; L < c.n_layers && layer < 0; ++L) {
    for (int e = 0; e < c.n_experts; ++e) {
      if ((*w)->Resident(L, e)) {
        layer = L;
        expert = e;
        break;
      }
    }
  }
  ASSERT_GE(layer, 0);
  const prepared::ExpertRecord& rec =
      p->experts.At(static_cast<uint32_t>(layer), static_cast<uint32_t>(expert));
  test::FaultEnv fault;
  fault.SetRule(p->expert_paths[rec.file_id], test::FaultRule::EioAt(rec.offset + 1));
  CliIo io;
  io.env = &fault;
  const testing::CliRun run = RunCliArgs(
      {dir, "--ids", kPromptText, "--gen", "1", "--budget-gb", "1000"}, io);
  EXPECT_EQ(run.exit_code, 4) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("RUN INVALID"), std::string::npos) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("layer " + std::to_string(layer) + " expert " +
                                 std::to_string(expert)),
            std::string::npos)
      << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("byte offset " + std::to_string(rec.offset)), std::string::npos)
      << run.stderr_text;
}

TEST(StreamingFaults, TrunkEioExitsOneNamingFileAndOffset) {
  const std::string& dir = TinyPreparedDir();
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), dir);
  ASSERT_TRUE(p.ok());
  const StreamingPlan min = MinimumOf(dir);
  BudgetRequest req;
  req.trunk_gb = double(min.trunk_min) / 1e9;
  req.cache_gb = double(min.cache_min) / 1e9;
  Result<StreamingPlan> plan = PlanStreaming(*p, req, 0);
  ASSERT_TRUE(plan.ok());
  // A layer the ring streams (not pinned): its read happens mid-run, not at start-up.
  const prepared::TrunkRun* target = nullptr;
  for (const prepared::TrunkRun& r : p->manifest.runs) {
    bool pinned = false;
    for (int l : plan->pinned) pinned = pinned || l == r.layer;
    if (!pinned) target = &r;
  }
  ASSERT_NE(target, nullptr);
  test::FaultEnv fault;
  fault.SetRule(JoinPath(dir, "trunk.bin"), test::FaultRule::EioAt(target->offset + 8));
  CliIo io;
  io.env = &fault;
  const testing::CliRun run =
      RunCliArgs({dir, "--ids", kPromptText, "--gen", "1", "--trunk-gb",
                  std::to_string(double(min.trunk_min) / 1e9), "--cache-gb",
                  std::to_string(double(min.cache_min + 4096) / 1e9)},
                 io);
  EXPECT_EQ(run.exit_code, 1) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("trunk.bin"), std::string::npos) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("byte offset " + std::to_string(target->offset)),
            std::string::npos)
      << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("layer " + std::to_string(target->layer)), std::string::npos)
      << run.stderr_text;
}

}  // namespace
}  // namespace k3::run
