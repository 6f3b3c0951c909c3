// The small-preset budget ladder: StreamingWeights at the minimum, a middle
// budget, lm_head held with layers streamed, the trunk held with experts streamed, and everything
// held, each × 1/2 threads × LRU / S3-FIFO and with the CLI's default guesses read ahead, against everything-resident RamWeights: every step's logits bit-identical (memcmp)
// and the same ids. Plus prefill vs one token at a time and --recompute at the minimum, and the
// fault paths of a streamed run: truncated files (refused at start-up, or shrinking under a
// running engine), short reads, and an lm_head chunk EIO through the ring.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "formats/prepared_layout.h"
#include "k3prep/pack/pack.h"
#include "k3prep/synth/checkpoint.h"
#include "k3run/app/cli.h"
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

using testing::SmallPreparedDir;
using testing::RunCliArgs;

// 4 prompt ids (< the small vocab of 4352) and 3 generated tokens: a prefill step with
// several rows plus two decode steps, so the ring wraps across passes of the walk.
const std::vector<int32_t> kSmallPrompt = {3, 7, 300, 1000};
const std::string kSmallPromptText = "3,7,300,1000";
constexpr int64_t kGen = 3;

struct Output {
  std::vector<int32_t> ids;
  std::vector<float> logits;  // [steps][vocab]
  StreamingStats stats;
  ReadCounters bytes;
  int64_t experts_skipped = 0;
  size_t failures = 0;
};

Output Run(Model* model, WeightSource* w, int64_t /*vocab*/, bool recompute,
           int64_t gen = kGen) {
  Output out;
  out.ids = testing::GenerateThrough(w, model->config(), model->layers(), kSmallPrompt, gen,
                                     recompute, &out.logits, &out.experts_skipped);
  out.failures = w->Failures().size();
  return out;
}

const prepared::PreparedDir& Prepared() {
  static const prepared::PreparedDir p = [] {
    Result<prepared::PreparedDir> r = prepared::OpenPrepared(Env::Default(), SmallPreparedDir());
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : prepared::PreparedDir{};
  }();
  return p;
}

// Everything resident (RamWeights), one thread: the bits every other run must reproduce.
const Output& Reference() {
  static const Output out = [] {
    const int saved = kernels::Threads();
    kernels::SetThreads(1);
    Output o;
    std::unique_ptr<testing::Engine> e = testing::OpenEngine(SmallPreparedDir());
    if (e) {
      const ModelConfig& c = e->prepared.manifest.config;
      Model model(c, e->weights.get(), c.n_layers);
      o = Run(&model, e->weights.get(), c.vocab, false);
    }
    kernels::SetThreads(saved);
    return o;
  }();
  return out;
}

Result<StreamingPlan> Plan(const BudgetRequest& req) {
  return PlanStreaming(Prepared(), req, 0);
}

StreamingPlan Must(Result<StreamingPlan> p) {
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? *p : StreamingPlan{};
}

// The plan's minimum numbers (trunk_min, cache_min) from a generous plan.
const StreamingPlan& Generous() {
  static const StreamingPlan p = [] {
    BudgetRequest r;
    r.budget_gb = 1e6;
    return Must(Plan(r));
  }();
  return p;
}

uint64_t LmHeadBytes() {
  const prepared::Region* lm = Prepared().manifest.FindRegion(prepared::kLmHeadName);
  return lm == nullptr ? 0 : lm->length;
}

uint64_t TrunkAll() {
  uint64_t s = 0;
  for (const prepared::TrunkRun& r : Prepared().manifest.runs) s += r.length;
  return s;
}

BudgetRequest Minimum(CachePolicy policy) {
  BudgetRequest r;
  r.trunk_gb = double(Generous().trunk_min) / 1e9;
  r.cache_gb = double(Generous().cache_min) / 1e9;
  r.policy = policy;
  return r;
}

// (b): the smallest trunk budget (in 1/64 steps between the minimum and everything) whose plan
// streams lm_head, pins some layers and still has a ring of more than 2 slots.
std::optional<BudgetRequest> Middle(CachePolicy policy) {
  const uint64_t lo = Generous().trunk_min, hi = TrunkAll() + LmHeadBytes();
  for (int i = 1; i < 64; ++i) {
    BudgetRequest r;
    r.trunk_gb = double(lo + (hi - lo) * uint64_t(i) / 64) / 1e9;
    r.cache_gb = double(Generous().cache_min * 3) / 1e9;
    r.policy = policy;
    Result<StreamingPlan> p = Plan(r);
    if (p.ok() && !p->lm_head_held && !p->pinned.empty() && p->ring_slots > 2) return r;
  }
  return std::nullopt;
}

// (c): lm_head held while layers still stream. PlanStreaming never makes this shape (it holds
// lm_head only once every layer is pinned: lm_head is read every token like the trunk), so the
// plan is built by hand from (b)'s: same pins and ring, lm_head in RAM.
StreamingPlan HeldLmHeadWithRing(CachePolicy policy) {
  std::optional<BudgetRequest> mid = Middle(policy);
  if (!mid) return {};
  StreamingPlan p = Must(Plan(*mid));
  p.lm_head_held = true;
  p.lm_head_bytes = LmHeadBytes();
  p.lm_head_chunk_rows = 0;
  p.ring_slots = 2;
  return p;
}

BudgetRequest Everything(CachePolicy policy) {
  BudgetRequest r;
  r.budget_gb = 1e6;
  r.policy = policy;
  return r;
}

// (d): every layer and lm_head held, experts streamed through a cache of a few waves: the rung
// where reading ahead matters most.
BudgetRequest TrunkHeld(CachePolicy policy) {
  BudgetRequest r;
  r.trunk_gb = double(TrunkAll() + LmHeadBytes()) / 1e9;
  r.cache_gb = double(Generous().cache_min * 3) / 1e9;
  r.policy = policy;
  return r;
}

// Whether some MoE layer follows a MoE layer and is pinned: only then can a guess be made (the
// next layer's router must be held).
bool CanGuess(const StreamingPlan& p) {
  const ModelConfig& c = Prepared().manifest.config;
  for (int L : p.pinned) {
    if (L - 1 >= c.first_dense) return true;
  }
  return false;
}

StreamingPlan PlanFor(const std::string& level, CachePolicy policy) {
  if (level == "minimum") return Must(Plan(Minimum(policy)));
  if (level == "trunkheld") return Must(Plan(TrunkHeld(policy)));
  if (level == "middle") {
    std::optional<BudgetRequest> m = Middle(policy);
    EXPECT_TRUE(m.has_value()) << "no trunk budget gives a middle plan (pins + ring > 2)";
    return m ? Must(Plan(*m)) : StreamingPlan{};
  }
  if (level == "lmheld") return HeldLmHeadWithRing(policy);
  return Must(Plan(Everything(policy)));
}

// With the CLI's default number of guesses read ahead: they must never change a bit.
Output Streamed(const StreamingPlan& plan, bool recompute = false,
                int guesses = kDefaultPrefetchExperts) {
  StreamingOptions options;
  options.prefetch_experts = guesses;
  Result<std::unique_ptr<StreamingWeights>> w =
      StreamingWeights::Open(Env::Default(), &Prepared(), plan, options);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  if (!w.ok()) return {};
  const ModelConfig& c = Prepared().manifest.config;
  Model model(c, w->get(), c.n_layers);
  Output out = Run(&model, w->get(), c.vocab, recompute);
  out.stats = (*w)->stats();
  out.bytes = (*w)->Counters();
  return out;
}

void ExpectSameBits(const Output& want, const Output& got) {
  EXPECT_EQ(got.experts_skipped, 0);
  EXPECT_EQ(got.failures, 0u);
  EXPECT_EQ(want.ids, got.ids);
  ASSERT_EQ(want.logits.size(), got.logits.size());
  ASSERT_EQ(want.logits.size(), size_t(kGen) * size_t(Prepared().manifest.config.vocab));
  for (size_t step = 0; step < size_t(kGen); ++step) {
    const size_t V = size_t(Prepared().manifest.config.vocab);
    EXPECT_EQ(0, std::memcmp(want.logits.data() + step * V, got.logits.data() + step * V,
                             V * sizeof(float)))
        << "step " << step << ": logits differ from the everything-resident RamWeights run";
  }
}

// The plan shape each rung is meant to have; a plan change that quietly collapses two rungs
// into one fails here rather than leaving a rung untested.
void ExpectShape(const std::string& level, const StreamingPlan& p) {
  const ModelConfig& c = Prepared().manifest.config;
  if (level == "minimum") {
    EXPECT_EQ(p.ring_slots, 2);
    EXPECT_EQ(p.expert_slots, c.topk + 1);
    EXPECT_FALSE(p.lm_head_held);
    EXPECT_TRUE(p.pinned.empty());
  } else if (level == "middle") {
    EXPECT_FALSE(p.lm_head_held);
    EXPECT_FALSE(p.pinned.empty());
    EXPECT_LT(p.pinned.size(), size_t(c.n_layers));
    EXPECT_GT(p.ring_slots, 2);
    EXPECT_GT(p.expert_slots, c.topk + 1);
  } else if (level == "trunkheld") {
    EXPECT_TRUE(p.lm_head_held);
    EXPECT_EQ(p.pinned.size(), size_t(c.n_layers));
    EXPECT_EQ(p.ring_slots, 0);
    EXPECT_GT(p.expert_slots, c.topk + 1 + kDefaultPrefetchExperts);
    EXPECT_LT(uint64_t(p.expert_slots), Prepared().experts.records.size());
  } else if (level == "lmheld") {
    EXPECT_TRUE(p.lm_head_held);
    EXPECT_FALSE(p.pinned.empty());
    EXPECT_LT(p.pinned.size(), size_t(c.n_layers));
    EXPECT_EQ(p.ring_slots, 2);
  } else {
    EXPECT_TRUE(p.lm_head_held);
    EXPECT_EQ(p.pinned.size(), size_t(c.n_layers));
    EXPECT_EQ(p.ring_slots, 0);
    EXPECT_EQ(uint64_t(p.expert_slots), Prepared().experts.records.size());
  }
}

struct Case {
  std::string level;
  CachePolicy policy;
  int threads;
};

class StreamingLadderSmall : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { saved_ = kernels::Threads(); }
  void TearDown() override { kernels::SetThreads(saved_); }
  int saved_ = 1;
};

TEST_P(StreamingLadderSmall, LogitsAndIdsBitIdenticalToRamWeights) {
  const Case& k = GetParam();
  const Output& want = Reference();
  ASSERT_EQ(want.ids.size(), size_t(kGen));
  const StreamingPlan plan = PlanFor(k.level, k.policy);
  ExpectShape(k.level, plan);
  ASSERT_EQ(plan.policy, k.policy);
  kernels::SetThreads(k.threads);
  const Output got = Streamed(plan);
  ExpectSameBits(want, got);
  if (k.level == "trunkheld") {
    EXPECT_GT(got.stats.expert_evictions, 0u) << "the cache never evicted: nothing streamed";
  } else if (k.level != "everything") {
    EXPECT_GT(got.stats.ring_loads, 0u) << "the ring never loaded: nothing streamed";
  }
  if (k.level == "minimum") {
    EXPECT_GT(got.stats.expert_evictions, 0u) << "top-k + 1 slots never evicted";
    EXPECT_EQ(got.stats.prefetches, 0u) << "guesses read into a cache of top-k + 1 slots";
  } else if (CanGuess(plan)) {
    EXPECT_GT(got.stats.prefetches, 0u) << "no guess was read ahead: the path went untested";
    EXPECT_GT(got.stats.prefetch_used, 0u) << "no guess was ever used";
  } else {
    EXPECT_EQ(got.stats.prefetches, 0u) << "a guess without the next layer's router held";
  }
  if (k.level == "trunkheld" || k.level == "everything") {
    EXPECT_TRUE(CanGuess(plan)) << "every layer is pinned: guesses must be tested here";
  }
  // Every request is a true hit, a guess used or a read; expert bytes are the last two only,
  // and the guesses not used are counted apart (every small expert record has one length).
  const uint64_t record = Prepared().experts.records.at(0).length;
  const StreamingStats& st = got.stats;
  EXPECT_EQ(got.bytes.experts, (st.expert_requests - st.expert_hits) * record);
  EXPECT_EQ(got.bytes.prefetch_unused,
            (st.prefetches - st.prefetch_used - st.prefetch_failed) * record);
}

// Reading ahead changes what is read and when, never a bit: the trunk-held rung with no guesses,
// the default and twice as many, against the everything-resident run.
TEST(StreamingPrefetchSmall, GuessCountNeverChangesABit) {
  const Output& want = Reference();
  const StreamingPlan plan = PlanFor("trunkheld", CachePolicy::kS3Fifo);
  for (int guesses : {0, kDefaultPrefetchExperts, 2 * kDefaultPrefetchExperts}) {
    SCOPED_TRACE("guesses " + std::to_string(guesses));
    const Output got = Streamed(plan, false, guesses);
    ExpectSameBits(want, got);
    if (guesses == 0) {
      EXPECT_EQ(got.stats.prefetches, 0u);
    } else {
      EXPECT_GT(got.stats.prefetch_used, 0u);
    }
  }
}

std::vector<Case> Cases() {
  std::vector<Case> v;
  for (const char* level : {"minimum", "middle", "lmheld", "trunkheld", "everything"}) {
    for (CachePolicy p : {CachePolicy::kLru, CachePolicy::kS3Fifo}) {
      for (int t : {1, 2}) v.push_back(Case{level, p, t});
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Budgets, StreamingLadderSmall, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return i.param.level + "_" + CachePolicyName(i.param.policy) + "_t" +
                                  std::to_string(i.param.threads);
                         });

// PlanStreaming holds lm_head only when every layer is pinned (which is why rung (c) is built
// by hand): checked over the whole range of trunk budgets.
// Library callers skip the flags' checks: a NaN or infinite budget must still be refused (NaN
// passes every comparison, and llround(NaN) is undefined).
TEST(StreamingPlanRequest, NonFiniteOrOutOfRangeBudgetsAreRefusedNamingTheFlag) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (double bad : {nan, inf, -inf, 0.0, -1.0, kMaxBudgetGb * 2}) {
    for (int which = 0; which < 3; ++which) {
      BudgetRequest r;
      std::optional<double>* field[] = {&r.budget_gb, &r.trunk_gb, &r.cache_gb};
      const char* flag[] = {"--budget-gb", "--trunk-gb", "--cache-gb"};
      *field[which] = bad;
      Result<StreamingPlan> p = Plan(r);
      ASSERT_FALSE(p.ok()) << flag[which] << " " << bad;
      EXPECT_EQ(p.status().code(), Code::kInvalid);
      EXPECT_EQ(p.status().message().rfind(flag[which], 0), 0u) << p.status().message();
      EXPECT_NE(p.status().message().find("a budget must be a finite number of GB"),
                std::string::npos)
          << p.status().message();
    }
  }
}

TEST(StreamingLadderPlan, LmHeadHeldOnlyWithEveryLayerPinned) {
  const uint64_t lo = Generous().trunk_min, hi = TrunkAll() + LmHeadBytes();
  for (int i = 0; i <= 32; ++i) {
    BudgetRequest r;
    r.trunk_gb = double(lo + (hi - lo) * uint64_t(i) / 32) / 1e9;
    const StreamingPlan p = Must(Plan(r));
    if (p.lm_head_held) {
      EXPECT_EQ(p.pinned.size(), Prepared().manifest.runs.size()) << "trunk " << *r.trunk_gb;
      EXPECT_EQ(p.ring_slots, 0);
    }
  }
}

// Ranks >= 1 of a scale-out run (BudgetRequest::experts_only): no pinned layer, no ring, no
// lm_head, the whole weight budget is expert cache, even below the one-process trunk minimum
// and with a --trunk-gb given; and such a source never reads a trunk byte.
TEST(StreamingExpertsOnlyPlan, TheWholeBudgetIsExpertCache) {
  BudgetRequest r;
  r.experts_only = true;
  r.budget_gb = double(Generous().cache_min + 4096) / 1e9;  // below trunk_min + cache_min
  r.trunk_gb = 1.0;
  const StreamingPlan p = Must(Plan(r));
  EXPECT_TRUE(p.experts_only);
  EXPECT_TRUE(p.pinned.empty());
  EXPECT_EQ(p.ring_slots, 0);
  EXPECT_FALSE(p.lm_head_held);
  EXPECT_EQ(p.trunk_min, 0u);
  EXPECT_EQ(p.bytes(), uint64_t(p.expert_slots) * p.expert_slot_bytes);
  EXPECT_LE(p.bytes(), static_cast<uint64_t>(std::llround(*r.budget_gb * 1e9)));
  EXPECT_NE(p.Describe().find("experts only (this rank reads no trunk)"), std::string::npos);
  BudgetRequest one;  // the same budget without experts_only is refused: the ring needs room
  one.budget_gb = r.budget_gb;
  EXPECT_FALSE(Plan(one).ok());
  StreamingOptions so;
  Result<std::unique_ptr<StreamingWeights>> w = StreamingWeights::Open(Env::Default(), &Prepared(), p, so);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const ops::GluWeights* e = (*w)->Expert(Prepared().manifest.config.first_dense, 0);
  EXPECT_NE(e, nullptr);
  EXPECT_EQ((*w)->Counters().trunk, 0u);
  EXPECT_EQ((*w)->Counters().lm_head, 0u);
  EXPECT_GT((*w)->Counters().experts, 0u);
}

// Every plan between the minimum and everything fits its budgets and can run: the trunk part
// (pins + ring) within the trunk budget, the expert slots within the cache budget, every
// streamed item (unpinned run, lm_head chunk) within a ring slot, a ring of ≥ 2 whenever
// something streams, top-k + 1 expert slots at least.
TEST(StreamingLadderPlan, EveryPlanFitsItsBudgets) {
  const ModelConfig& c = Prepared().manifest.config;
  const uint64_t row = LmHeadBytes() / uint64_t(c.vocab);
  const uint64_t lo = Generous().trunk_min, hi = TrunkAll() + LmHeadBytes();
  for (int i = 0; i <= 48; ++i) {
    for (uint64_t cache : {Generous().cache_min, Generous().cache_min * 5 + 77}) {
      BudgetRequest r;
      r.trunk_gb = double(lo + (hi - lo) * uint64_t(i) / 48) / 1e9;
      r.cache_gb = double(cache) / 1e9;
      const StreamingPlan p = Must(Plan(r));
      const std::string where = "trunk " + std::to_string(p.trunk_budget) + ", cache " +
                                std::to_string(p.cache_budget);
      EXPECT_LE(p.pinned_bytes + uint64_t(p.ring_slots) * p.ring_slot_bytes +
                    (p.lm_head_held ? p.lm_head_bytes : 0),
                p.trunk_budget)
          << where;
      EXPECT_LE(uint64_t(p.expert_slots) * p.expert_slot_bytes, p.cache_budget) << where;
      EXPECT_GE(p.expert_slots, c.topk + 1) << where;
      size_t streamed = 0;
      for (const prepared::TrunkRun& run : Prepared().manifest.runs) {
        if (std::find(p.pinned.begin(), p.pinned.end(), run.layer) != p.pinned.end()) continue;
        ++streamed;
        EXPECT_LE(run.length, p.ring_slot_bytes) << where << ": layer " << run.layer;
      }
      if (!p.lm_head_held) {
        ++streamed;
        EXPECT_GT(p.lm_head_chunk_rows, 0) << where;
        EXPECT_LE(uint64_t(p.lm_head_chunk_rows) * row, p.ring_slot_bytes) << where;
      }
      if (streamed > 0) {
        EXPECT_GE(p.ring_slots, 2) << where;
      } else {
        EXPECT_EQ(p.ring_slots, 0) << where;
      }
    }
  }
}

// A total budget of exactly the minimum is accepted (and is the minimum plan); one byte less is
// refused naming the flag and the minimum.
TEST(StreamingLadderPlan, TotalAtMinimumRunsOneByteLessRefused) {
  const uint64_t min = Generous().trunk_min + Generous().cache_min;
  BudgetRequest at;
  at.budget_gb = double(min) / 1e9;
  const StreamingPlan p = Must(Plan(at));
  EXPECT_EQ(p.ring_slots, 2);
  EXPECT_EQ(p.expert_slots, Prepared().manifest.config.topk + 1);
  EXPECT_LE(p.bytes(), min);
  BudgetRequest below;
  below.budget_gb = double(min - 1) / 1e9;
  Result<StreamingPlan> refused = Plan(below);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kInvalid);
  EXPECT_NE(refused.status().message().find("--budget-gb"), std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find("minimum " + FormatGb(min) + " = " +
                                            std::to_string(min) + " bytes"),
            std::string::npos)
      << refused.status().message();
}

// The prompt fed one token at a time (carried state) at the minimum budget gives the prefill
// step's logits bit for bit, and the decode steps after it too.
TEST(StreamingMinimumSmall, OneTokenAtATimeEqualsPrefill) {
  const Output& want = Reference();
  ASSERT_EQ(want.ids.size(), size_t(kGen));
  const StreamingPlan plan = Must(Plan(Minimum(CachePolicy::kS3Fifo)));
  Result<std::unique_ptr<StreamingWeights>> w =
      StreamingWeights::Open(Env::Default(), &Prepared(), plan);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const ModelConfig& c = Prepared().manifest.config;
  Model model(c, w->get(), c.n_layers);
  State state = State::Make(c, c.n_layers, PositionsNeeded(int64_t(kSmallPrompt.size()), kGen));
  std::vector<float> logits(size_t(c.vocab)), all;
  for (int32_t id : kSmallPrompt) {
    ASSERT_TRUE(model.Forward(&id, 1, &state, false, logits.data()).ok());
  }
  std::vector<int32_t> ids;
  for (int64_t s = 0; s < kGen; ++s) {
    if (s > 0) {
      const int32_t id = ids.back();
      ASSERT_TRUE(model.Forward(&id, 1, &state, false, logits.data()).ok());
    }
    all.insert(all.end(), logits.begin(), logits.end());
    ids.push_back(Greedy(logits.data(), c.vocab));
  }
  Output got;
  got.ids = ids;
  got.logits = all;
  got.experts_skipped = model.experts_skipped();
  got.failures = (*w)->Failures().size();
  ExpectSameBits(want, got);
}

TEST(StreamingMinimumSmall, RecomputeEqualsIncremental) {
  const Output& want = Reference();
  ASSERT_EQ(want.ids.size(), size_t(kGen));
  const Output got = Streamed(Must(Plan(Minimum(CachePolicy::kLru))), /*recompute=*/true);
  ExpectSameBits(want, got);
}

// --- faults on the small preset through the CLI -------------------------------------------------

// Flags for a minimum-budget CLI run (the cache a page above its minimum: the flag is in GB).
std::vector<std::string> MinimumArgs(const std::string& dir) {
  return {dir, "--ids", kSmallPromptText, "--gen", "2", "--no-floor", "--trunk-gb",
          std::to_string(double(Generous().trunk_min) / 1e9), "--cache-gb",
          std::to_string(double(Generous().cache_min + 4096) / 1e9)};
}

// The same run without faults: what a fault the engine absorbs must reproduce.
const testing::CliRun& CleanRun() {
  static const testing::CliRun run = RunCliArgs(MinimumArgs(SmallPreparedDir()));
  return run;
}

// A copy of the prepared dir: hard links, except `victim` (a real copy, cut to `keep` bytes).
struct TruncatedCopy {
  test::TempDir root;
  std::string dir;
  TruncatedCopy(const std::string& victim, uint64_t keep) {
    namespace fs = std::filesystem;
    dir = root.Join("prep");
    const fs::path src(SmallPreparedDir());
    for (const fs::directory_entry& e : fs::recursive_directory_iterator(src)) {
      const fs::path to = fs::path(dir) / fs::relative(e.path(), src);
      if (e.is_directory()) {
        fs::create_directories(to);
        continue;
      }
      fs::create_directories(to.parent_path());
      if (fs::relative(e.path(), src) == fs::path(victim)) {
        fs::copy_file(e.path(), to);
        fs::resize_file(to, keep);
      } else {
        fs::create_hard_link(e.path(), to);
      }
    }
  }
};

// An expert the prompt's prefill routes to (layer, expert) and its record: read from a cache
// that holds everything after a one-step run, so every CLI run below reads it in step 0.
struct Routed {
  int layer = -1, expert = -1;
  prepared::ExpertRecord rec;
};
Routed FindFirstRoutedExpert() {
  Result<std::unique_ptr<StreamingWeights>> w =
      StreamingWeights::Open(Env::Default(), &Prepared(), Generous());
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  if (!w.ok()) return {};
  const ModelConfig& c = Prepared().manifest.config;
  Model model(c, w->get(), c.n_layers);
  (void)Run(&model, w->get(), c.vocab, false, /*gen=*/1);
  Routed r;
  for (int L = c.first_dense; L < c.n_layers && r.layer < 0; ++L) {
    for (int e = 0; e < c.n_experts; ++e) {
      if ((*w)->Resident(L, e)) {
        r.layer = L;
        r.expert = e;
        r.rec = Prepared().experts.At(uint32_t(L), uint32_t(e));
        break;
      }
    }
  }
  return r;
}

const Routed& FirstRoutedExpert() {
  static const Routed r = FindFirstRoutedExpert();
  return r;
}

// The streamed (unpinned) layer run that lies last in trunk.bin at the minimum budget: read
// mid-run by the ring, and cutting the file inside it damages no other run.
const prepared::TrunkRun* LastStreamedRun() {
  const StreamingPlan plan = Must(Plan(Minimum(CachePolicy::kS3Fifo)));
  const prepared::TrunkRun* last = nullptr;
  for (const prepared::TrunkRun& r : Prepared().manifest.runs) {
    if (std::find(plan.pinned.begin(), plan.pinned.end(), r.layer) == plan.pinned.end() &&
        (last == nullptr || r.offset > last->offset)) {
      last = &r;
    }
  }
  return last;
}

// DESIGN.md §5: "at start-up k3run checks every referenced file's size against k3.json (exit 2
// naming the file)": a truncated expert file never reaches the engine.
TEST(StreamingFaultsSmall, TruncatedExpertFileRefusedAtStartNamingFile) {
  const Routed& r = FirstRoutedExpert();
  ASSERT_GE(r.layer, 0);
  const std::string rel = Prepared().manifest.expert_files[r.rec.file_id].path;
  TruncatedCopy copy(rel, r.rec.offset + r.rec.length / 2);
  const testing::CliRun run = RunCliArgs(MinimumArgs(copy.dir));
  EXPECT_EQ(run.exit_code, 2) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find(rel), std::string::npos) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("k3.json records"), std::string::npos) << run.stderr_text;
  EXPECT_TRUE(run.stdout_text().empty()) << "nothing may be generated";
}

TEST(StreamingFaultsSmall, TruncatedTrunkRefusedAtStartNamingFile) {
  const prepared::TrunkRun* run_t = LastStreamedRun();
  ASSERT_NE(run_t, nullptr);
  TruncatedCopy copy(std::string(prepared::kTrunkFile), run_t->offset + 8);
  const testing::CliRun run = RunCliArgs(MinimumArgs(copy.dir));
  EXPECT_EQ(run.exit_code, 2) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("trunk.bin"), std::string::npos) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("truncated"), std::string::npos) << run.stderr_text;
  EXPECT_TRUE(run.stdout_text().empty());
}

// A file that shrinks under a running engine (its size passed the start-up check; its reads
// end early): FaultEnv's truncation on reads only.
class ShrinksAfterCheckEnv : public test::FaultEnv {
 public:
  Result<uint64_t> FileSize(const std::string& path) override { return target()->FileSize(path); }
};

// An expert whose bytes end early is skipped and named, the run finishes: RUN INVALID, exit 4.
TEST(StreamingFaultsSmall, ExpertFileShrinkingMidRunExitsFourNamingExpert) {
  const Routed& r = FirstRoutedExpert();
  ASSERT_GE(r.layer, 0);
  // Cut at a 4 KiB boundary inside the record: expert files are read with O_DIRECT, and a
  // real file can only end short at a block the device returns.
  const uint64_t cut = (r.rec.offset + r.rec.length / 2) / 4096 * 4096;
  ASSERT_LT(cut, r.rec.offset + r.rec.length);
  ShrinksAfterCheckEnv env;
  env.SetRule(Prepared().expert_paths[r.rec.file_id], test::FaultRule::Truncated(cut));
  CliIo io;
  io.env = &env;
  const testing::CliRun run = RunCliArgs(MinimumArgs(SmallPreparedDir()), io);
  EXPECT_EQ(run.exit_code, 4) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("RUN INVALID"), std::string::npos) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("layer " + std::to_string(r.layer) + " expert " +
                                 std::to_string(r.expert) + ":"),
            std::string::npos)
      << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("premature end of file"), std::string::npos) << run.stderr_text;
}

// A trunk layer whose bytes end early: the forward pass cannot go on, exit 1 naming trunk.bin,
// the layer and the offset.
TEST(StreamingFaultsSmall, TrunkShrinkingMidRunExitsOneNamingLayer) {
  const prepared::TrunkRun* t = LastStreamedRun();
  ASSERT_NE(t, nullptr);
  ASSERT_GT(t->length, 8192u);
  ShrinksAfterCheckEnv env;  // cut one block into the run (trunk.bin is read with O_DIRECT)
  env.SetRule(JoinPath(SmallPreparedDir(), std::string(prepared::kTrunkFile)),
              test::FaultRule::Truncated(t->offset + 4096));
  CliIo io;
  io.env = &env;
  const testing::CliRun run = RunCliArgs(MinimumArgs(SmallPreparedDir()), io);
  EXPECT_EQ(run.exit_code, 1) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("trunk.bin"), std::string::npos) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("layer " + std::to_string(t->layer) + "'s trunk run"),
            std::string::npos)
      << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("byte offset " + std::to_string(t->offset)), std::string::npos)
      << run.stderr_text;
}

// Short reads are looped by the batch reader (common/direct_reader.cpp ReadWindow; io_uring
// re-queues the rest): the run is valid and its output identical to the clean run.
TEST(StreamingFaultsSmall, ShortReadsOnExpertFileAreLoopedRunValid) {
  ASSERT_EQ(CleanRun().exit_code, 0) << CleanRun().stderr_text;
  const Routed& r = FirstRoutedExpert();
  ASSERT_GE(r.layer, 0);
  test::FaultEnv env;
  env.SetRule(Prepared().expert_paths[r.rec.file_id], test::FaultRule::ShortReads(4096));
  CliIo io;
  io.env = &env;
  const testing::CliRun run = RunCliArgs(MinimumArgs(SmallPreparedDir()), io);
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_EQ(run.stdout_text(), CleanRun().stdout_text());
  EXPECT_EQ(run.stderr_text.find("RUN INVALID"), std::string::npos) << run.stderr_text;
}

TEST(StreamingFaultsSmall, ShortReadsOnTrunkAreLoopedRunValid) {
  ASSERT_EQ(CleanRun().exit_code, 0) << CleanRun().stderr_text;
  test::FaultEnv env;
  env.SetRule(JoinPath(SmallPreparedDir(), std::string(prepared::kTrunkFile)),
              test::FaultRule::ShortReads(4096));
  CliIo io;
  io.env = &env;
  const testing::CliRun run = RunCliArgs(MinimumArgs(SmallPreparedDir()), io);
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_EQ(run.stdout_text(), CleanRun().stdout_text());
}

// lm_head streamed through the ring: an EIO inside one of its chunks is exit 1 naming
// resident.bin, lm_head (the chunk's rows) and the offset.
TEST(StreamingFaultsSmall, LmHeadChunkEioExitsOneNamingResidentAndLmHead) {
  const prepared::Region* lm = Prepared().manifest.FindRegion(prepared::kLmHeadName);
  ASSERT_NE(lm, nullptr);
  ASSERT_FALSE(Must(Plan(Minimum(CachePolicy::kS3Fifo))).lm_head_held);
  test::FaultEnv env;
  env.SetRule(JoinPath(SmallPreparedDir(), std::string(prepared::kResidentFile)),
              test::FaultRule::EioAt(lm->offset + lm->length / 2));
  CliIo io;
  io.env = &env;
  const testing::CliRun run = RunCliArgs(MinimumArgs(SmallPreparedDir()), io);
  EXPECT_EQ(run.exit_code, 1) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("resident.bin"), std::string::npos) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("reading " + std::string(prepared::kLmHeadName) + " rows ["),
            std::string::npos)
      << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("byte offset " + std::to_string(lm->offset + lm->length / 2)),
            std::string::npos)
      << run.stderr_text;
  EXPECT_EQ(run.stderr_text.find("RUN INVALID"), std::string::npos) << run.stderr_text;
}

}  // namespace
}  // namespace k3::run
