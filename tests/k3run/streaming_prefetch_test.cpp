// Reading ahead (StreamingWeights::Prefetch, DESIGN.md §7 "Overlap"): guesses of the next layer's
// experts are read behind the current batch; its routing claims the ones it picks (counted as
// guesses used, not as true hits, their bytes as expert bytes) and settles the rest as unused
// (their bytes apart, never in the floor). A guess whose read fails is only dropped, and read
// again if routing picks it; guesses still loading count against the budget; no guesses where
// the cache has no room for them. Bit identity with guesses on is in streaming_budget_test.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "k3run/stream/cache_trace.h"
#include "k3run/stream/streaming_plan.h"
#include "k3run/stream/streaming_weights.h"
#include "k3run/weights/weights.h"
#include "tests/k3run/engine_fixture.h"
#include "tests/support/fault_env.h"
#include "tests/support/temp_dir.h"

namespace k3::run {
namespace {

using testing::TinyPreparedDir;

constexpr int kGuesses = 4;

struct Tiny {
  prepared::PreparedDir p;
  int layer = 0;  // a MoE layer whose trunk is pinned in the generous plan
  uint64_t record = 0;  // every tiny expert record has this length
};

Tiny OpenTiny() {
  Tiny t;
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), TinyPreparedDir());
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  if (!p.ok()) return t;
  t.p = std::move(p).value();
  t.layer = t.p.manifest.config.first_dense + 1;
  t.record = t.p.experts.records.at(0).length;
  for (const prepared::ExpertRecord& r : t.p.experts.records) EXPECT_EQ(r.length, t.record);
  return t;
}

StreamingPlan Everything(const prepared::PreparedDir& p) {
  BudgetRequest req;
  req.budget_gb = 1e6;
  Result<StreamingPlan> plan = PlanStreaming(p, req, 0);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  return plan.ok() ? *plan : StreamingPlan{};
}

std::unique_ptr<StreamingWeights> Open(Env* env, const prepared::PreparedDir& p,
                                       const StreamingPlan& plan, int guesses) {
  StreamingOptions o;
  o.prefetch_experts = guesses;
  Result<std::unique_ptr<StreamingWeights>> w = StreamingWeights::Open(env, &p, plan, o);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  return w.ok() ? std::move(w).value() : nullptr;
}

// Polls until the expert's read is done and bound (ExpertReady binds what arrived).
bool WaitReady(StreamingWeights* w, int layer, int expert) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!w->ExpertReady(layer, expert)) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(StreamingPrefetch, ClaimedGuessesAreUsedNotHitsAndTheRestAreUnused) {
  Tiny t = OpenTiny();
  std::unique_ptr<StreamingWeights> w = Open(Env::Default(), t.p, Everything(t.p), kGuesses);
  ASSERT_NE(w, nullptr);
  ASSERT_NE(w->HeldLayer(t.layer), nullptr) << "every layer is pinned in this plan";
  EXPECT_EQ(w->PrefetchBudget(t.layer), kGuesses);
  Result<std::unique_ptr<RamWeights>> ram = RamWeights::Open(Env::Default(), &t.p);
  ASSERT_TRUE(ram.ok()) << ram.status().ToString();

  // Six guesses, most likely first: only the budget's four are read (0, 1, 2, 3).
  const std::vector<int32_t> guesses = {0, 1, 2, 3, 4, 5};
  w->Prefetch(t.layer, guesses);
  EXPECT_EQ(w->stats().prefetches, uint64_t(kGuesses));
  EXPECT_FALSE(w->Resident(t.layer, 4)) << "a guess beyond the budget was read";
  // Routing picks 1 and 3 (guessed) and 7 (not): two guesses used, one miss, no true hit.
  const std::vector<int32_t> routed = {1, 3, 7};
  w->WillUse(t.layer, routed);
  for (int32_t e : routed) {
    const ops::GluWeights* got = w->Expert(t.layer, e);
    ASSERT_NE(got, nullptr) << "expert " << e;
    const ops::GluWeights* want = (*ram)->Expert(t.layer, e);
    ASSERT_NE(want, nullptr);
    EXPECT_EQ(0, std::memcmp(got->up.data, want->up.data, size_t(want->up.rows * want->up.cols / 2)))
        << "expert " << e << " has other bytes than RAM weights give";
  }
  w->ReleaseExperts(t.layer);
  StreamingStats s = w->stats();
  EXPECT_EQ(s.expert_requests, 3u);
  EXPECT_EQ(s.prefetch_used, 2u);
  EXPECT_EQ(s.expert_hits, 0u) << "an expert read for this layer's own guess is not a true hit";
  EXPECT_EQ(w->Counters().experts, 3 * t.record) << "the token needed all three experts";
  // The next wave collects the unused guesses (0, 2) that arrived meanwhile; 0 is then resident:
  // a true hit, from an earlier wave's read.
  ASSERT_TRUE(WaitReady(w.get(), t.layer, 0));
  ASSERT_TRUE(WaitReady(w.get(), t.layer, 2));
  const std::vector<int32_t> again = {0};
  w->WillUse(t.layer, again);
  ASSERT_NE(w->Expert(t.layer, 0), nullptr);
  w->ReleaseExperts(t.layer);
  s = w->stats();
  EXPECT_EQ(w->Counters().prefetch_unused, 2 * t.record);
  EXPECT_EQ(w->Counters().experts, 3 * t.record);
  EXPECT_EQ(s.expert_hits, 1u);
  EXPECT_EQ(w->Source().expert_guesses, uint64_t(kGuesses));
  EXPECT_EQ(w->Source().expert_guesses_used, 2u);
  EXPECT_TRUE(w->Failures().empty());
}

// A guess whose read fails is dropped without invalidating the run (nobody asked for it); when
// routing then picks that expert it is read again, and that failure is the run's: recorded,
// named, Expert() null.
TEST(StreamingPrefetch, FailedGuessIsDroppedThenReadAgainWhenRouted) {
  Tiny t = OpenTiny();
  const int32_t bad = 5;
  const prepared::ExpertRecord& rec =
      t.p.experts.At(static_cast<uint32_t>(t.layer), static_cast<uint32_t>(bad));
  test::FaultEnv env;
  env.SetRule(t.p.expert_paths[rec.file_id], test::FaultRule::EioAt(rec.offset + 1));
  std::unique_ptr<StreamingWeights> w = Open(&env, t.p, Everything(t.p), kGuesses);
  ASSERT_NE(w, nullptr);
  const std::vector<int32_t> guesses = {bad};
  w->Prefetch(t.layer, guesses);
  ASSERT_TRUE(WaitReady(w.get(), t.layer, bad));
  EXPECT_EQ(w->stats().prefetch_failed, 1u);
  EXPECT_TRUE(w->Failures().empty()) << "an unclaimed guess failing made the run invalid";
  EXPECT_FALSE(w->Resident(t.layer, bad));
  w->WillUse(t.layer, guesses);
  EXPECT_EQ(w->Expert(t.layer, bad), nullptr);
  w->ReleaseExperts(t.layer);
  ASSERT_EQ(w->Failures().size(), 1u) << "the routed read's failure must be recorded";
  EXPECT_EQ(w->Failures()[0].layer, t.layer);
  EXPECT_EQ(w->Failures()[0].expert, bad);
  EXPECT_NE(w->Failures()[0].reason.find("byte offset " + std::to_string(rec.offset)),
            std::string::npos)
      << w->Failures()[0].reason;
  EXPECT_EQ(w->stats().prefetch_used, 0u);
}

// Guesses still loading hold pinned slots, so they count against the budget: while four are
// held back in their reads, a guess for the next layer reads nothing; once they arrive, it can.
TEST(StreamingPrefetch, GuessesStillLoadingCountAgainstTheBudget) {
  Tiny t = OpenTiny();
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  test::FaultRule gate;
  gate.before_read = [&](uint64_t, size_t) {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait_for(lk, std::chrono::seconds(10), [&] { return open; });
  };
  test::FaultEnv env;
  for (const std::string& path : t.p.expert_paths) env.SetRule(path, gate);
  std::unique_ptr<StreamingWeights> w = Open(&env, t.p, Everything(t.p), kGuesses);
  ASSERT_NE(w, nullptr);
  const std::vector<int32_t> guesses = {0, 1, 2, 3, 4, 5};
  w->Prefetch(t.layer, guesses);
  EXPECT_EQ(w->stats().prefetches, uint64_t(kGuesses));
  w->Prefetch(t.layer + 1, guesses);
  EXPECT_EQ(w->stats().prefetches, uint64_t(kGuesses)) << "the budget was exceeded";
  {
    std::lock_guard<std::mutex> lk(mu);
    open = true;
  }
  cv.notify_all();
  for (int32_t e = 0; e < kGuesses; ++e) ASSERT_TRUE(WaitReady(w.get(), t.layer, e));
  w->Prefetch(t.layer + 1, guesses);
  EXPECT_EQ(w->stats().prefetches, uint64_t(2 * kGuesses));
  // The first layer's guesses were settled unused when the second layer's replaced them.
  EXPECT_EQ(w->Counters().prefetch_unused, uint64_t(kGuesses) * t.record);
}

// No guesses where they would not fit: a cache of top-k + 1 slots (the minimum) keeps every slot
// for the wave; a layer whose trunk streams has no router at hand; 0 turns reading ahead off.
// Where they fit, waves give up the guesses' slots.
TEST(StreamingPrefetch, OnlyWhereTheCacheHasRoomAndTheNextRouterIsHeld) {
  Tiny t = OpenTiny();
  const ModelConfig& c = t.p.manifest.config;
  const StreamingPlan all = Everything(t.p);
  std::unique_ptr<StreamingWeights> on = Open(Env::Default(), t.p, all, kGuesses);
  ASSERT_NE(on, nullptr);
  EXPECT_EQ(on->ExpertWaveSize(), all.expert_slots - 1 - kGuesses);
  std::unique_ptr<StreamingWeights> off = Open(Env::Default(), t.p, all, 0);
  ASSERT_NE(off, nullptr);
  EXPECT_EQ(off->PrefetchBudget(t.layer), 0);
  EXPECT_EQ(off->ExpertWaveSize(), all.expert_slots - 1);
  off->Prefetch(t.layer, std::vector<int32_t>{0, 1});
  EXPECT_EQ(off->stats().prefetches, 0u);

  BudgetRequest req;
  req.trunk_gb = double(all.trunk_min) / 1e9;
  req.cache_gb = double(all.cache_min) / 1e9;
  Result<StreamingPlan> min = PlanStreaming(t.p, req, 0);
  ASSERT_TRUE(min.ok()) << min.status().ToString();
  ASSERT_EQ(min->expert_slots, c.topk + 1);
  std::unique_ptr<StreamingWeights> small = Open(Env::Default(), t.p, *min, kGuesses);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(small->ExpertWaveSize(), c.topk) << "the minimum cache gave slots to guesses";
  for (int L = c.first_dense; L < c.n_layers; ++L) {
    EXPECT_EQ(small->PrefetchBudget(L), 0) << "layer " << L;
  }
  // The smallest trunk with a roomy cache: the layers that stream get no guesses.
  req.cache_gb = double(all.cache_budget) / 1e9;
  Result<StreamingPlan> streamed = PlanStreaming(t.p, req, 0);
  ASSERT_TRUE(streamed.ok()) << streamed.status().ToString();
  std::unique_ptr<StreamingWeights> ring = Open(Env::Default(), t.p, *streamed, kGuesses);
  ASSERT_NE(ring, nullptr);
  int unpinned = 0;
  for (int L = c.first_dense; L < c.n_layers; ++L) {
    if (ring->HeldLayer(L) != nullptr) {
      EXPECT_EQ(ring->PrefetchBudget(L), kGuesses) << "layer " << L;
      continue;
    }
    ++unpinned;
    EXPECT_EQ(ring->PrefetchBudget(L), 0) << "layer " << L;
  }
  EXPECT_GT(unpinned, 0) << "the minimum trunk pinned every layer: nothing tested";
}

// Recording a cache trace turns guesses off: the replay re-runs routing only, so the engine's
// cache must be driven by routing alone for the replay to reproduce it.
TEST(StreamingPrefetch, OffWhileACacheTraceIsRecorded) {
  Tiny t = OpenTiny();
  const StreamingPlan all = Everything(t.p);
  test::TempDir dir;
  Result<std::unique_ptr<CacheTraceWriter>> trace = CacheTraceWriter::Create(
      Env::Default(), dir.path(), TraceHeaderFor(t.p.manifest.config, all, TinyPreparedDir()));
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  StreamingOptions o;
  o.prefetch_experts = kGuesses;
  o.trace = trace->get();
  Result<std::unique_ptr<StreamingWeights>> w = StreamingWeights::Open(Env::Default(), &t.p, all, o);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ((*w)->PrefetchBudget(t.layer), 0);
  EXPECT_EQ((*w)->ExpertWaveSize(), all.expert_slots - 1);
  (*w)->Prefetch(t.layer, std::vector<int32_t>{0, 1});
  EXPECT_EQ((*w)->stats().prefetches, 0u);
}

// Once every guess of many rounds in a row was resident (a cache that holds what routing wants),
// the budget is 0 except to every 16th ask, so the model stops ranking guesses; a round that
// reads again brings the budget back at once.
TEST(StreamingPrefetch, QuietAfterManyRoundsOfResidentGuessesThenBack) {
  Tiny t = OpenTiny();
  std::unique_ptr<StreamingWeights> w = Open(Env::Default(), t.p, Everything(t.p), kGuesses);
  ASSERT_NE(w, nullptr);
  const std::vector<int32_t> resident = {0, 1};
  w->WillUse(t.layer, resident);
  for (int32_t e : resident) ASSERT_NE(w->Expert(t.layer, e), nullptr);
  w->ReleaseExperts(t.layer);
  for (int i = 0; i < 63; ++i) {
    ASSERT_EQ(w->PrefetchBudget(t.layer), kGuesses) << "round " << i;
    w->Prefetch(t.layer, resident);
  }
  EXPECT_EQ(w->PrefetchBudget(t.layer), kGuesses) << "63 quiet rounds are not yet enough";
  w->Prefetch(t.layer, resident);  // the 64th
  int answered = 0;
  for (int i = 0; i < 32; ++i) answered += w->PrefetchBudget(t.layer) > 0 ? 1 : 0;
  EXPECT_EQ(answered, 2) << "quiet: only every 16th ask may be answered";
  EXPECT_EQ(w->stats().prefetches, 0u);
  // A probe round finds a guess to read: the budget is back for every ask.
  const std::vector<int32_t> fresh = {5};
  w->Prefetch(t.layer, fresh);
  EXPECT_EQ(w->stats().prefetches, 1u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(w->PrefetchBudget(t.layer), kGuesses) << "ask " << i;
}

// With every expert preloaded there is nothing to guess: no budget, so the model does not even
// rank guesses (a router product per layer).
TEST(StreamingPrefetch, OffWithEveryExpertPreloaded) {
  Tiny t = OpenTiny();
  StreamingOptions o;
  o.prefetch_experts = kGuesses;
  o.preload_experts = true;
  Result<std::unique_ptr<StreamingWeights>> w =
      StreamingWeights::Open(Env::Default(), &t.p, Everything(t.p), o);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ((*w)->PrefetchBudget(t.layer), 0);
}

}  // namespace
}  // namespace k3::run
