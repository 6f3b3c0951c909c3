// engine/scheduler.h: every scheduled request gets exactly the ids and logit bits of its own
// Generate run on a fresh sequence, whatever shares its passes, however many slots, however its
// prompt is split; requests end for the documented reasons; the prompt cache feeds only the
// rest and evicts by bytes. Every expectation comes from Generate (or the Session API) run
// alone, never from the scheduler itself.
#include "k3run/engine/scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "engine_fixture.h"
#include "k3run/engine/generate.h"
#include "k3run/engine/session.h"
#include "tests/support/fault_env.h"
#include "tests/support/temp_dir.h"

namespace k3::run {
namespace {

using testing::SmallPreparedDir;
using testing::TinyPreparedDir;

std::unique_ptr<Engine> OpenPlanned(const std::string& dir, int64_t positions, int64_t chunk = 0) {
  PlanOptions po = testing::ContextPlan(positions);
  po.chunk = chunk;
  return testing::OpenPlanned(dir, po);
}

// n ids below `vocab`, not periodic; `salt` makes different prompts.
std::vector<int32_t> Prompt(int64_t n, uint32_t salt, int64_t vocab) {
  std::vector<int32_t> p;
  uint32_t x = 12345u + salt * 7919u;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    p.push_back(static_cast<int32_t>((x >> 8) % static_cast<uint32_t>(vocab)));
  }
  return p;
}

// What a request asks for, without its callbacks.
struct Spec {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 0;
  std::vector<int64_t> stop_ids;
  SamplerOptions sampling;
  uint64_t seed = 0;
};

// The ids and every chosen token's logits [vocab], in order.
struct Solo {
  std::vector<int32_t> ids;
  std::vector<float> logits;
};

// The reference: Generate on a fresh sequence made with the request's sampler.
Solo Alone(Engine* e, const Spec& r) {
  const int64_t V = e->config().vocab;
  std::unique_ptr<Sequence> seq = e->NewSequence(r.sampling, r.seed, 0);
  GenerateOptions g;
  g.prompt = r.prompt;
  g.gen = r.max_tokens;
  g.stop_ids = r.stop_ids;
  Solo out;
  Result<GenerateResult> res = Generate(e, seq.get(), g, [&](const StepRecord& s, const float* l) {
    if (s.token >= 0) out.logits.insert(out.logits.end(), l, l + V);
    return Status::Ok();
  });
  EXPECT_TRUE(res.ok()) << res.status().ToString();
  if (res.ok()) out.ids = res->generated;
  return out;
}

// What the scheduler gave one request.
struct Outcome {
  Solo run;
  RequestResult result;
  int done_calls = 0;
  std::vector<std::pair<int64_t, int64_t>> prefill;
};

Request MakeRequest(const Spec& s, Outcome* out, int64_t vocab) {
  Request r;
  r.prompt = s.prompt;
  r.max_tokens = s.max_tokens;
  r.stop_ids = s.stop_ids;
  r.sampling = s.sampling;
  r.seed = s.seed;
  r.on_token = [out, vocab](int32_t, const float* l) {
    out->run.logits.insert(out->run.logits.end(), l, l + vocab);
    return true;
  };
  r.on_prefill = [out](int64_t fed, int64_t total) { out->prefill.emplace_back(fed, total); };
  r.on_done = [out](const RequestResult& rr) {
    out->result = rr;
    out->run.ids = rr.generated;
    ++out->done_calls;
  };
  return r;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Submits every spec, runs until idle, and returns the outcomes in submission order.
std::vector<Outcome> Schedule(Engine* e, const std::vector<Spec>& specs, SchedulerOptions o) {
  std::vector<Outcome> out(specs.size());
  Scheduler sched(e, o);
  for (size_t i = 0; i < specs.size(); ++i) {
    Result<int64_t> id = sched.Submit(MakeRequest(specs[i], &out[i], e->config().vocab));
    EXPECT_TRUE(id.ok()) << id.status().ToString();
  }
  const Status s = sched.RunUntilIdle();
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(sched.Idle());
  return out;
}

void ExpectSameAsAlone(const std::vector<Outcome>& got, const std::vector<Solo>& want,
                       const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].done_calls, 1) << what << " request " << i;
    EXPECT_TRUE(got[i].result.status.ok()) << what << " request " << i << ": "
                                           << got[i].result.status.ToString();
    EXPECT_EQ(got[i].run.ids, want[i].ids) << what << " request " << i;
    EXPECT_TRUE(SameBits(got[i].run.logits, want[i].logits)) << what << " request " << i;
  }
}

// Requests of prompt lengths 1..14 and 2..9 tokens each.
std::vector<Spec> MixedSpecs(int64_t vocab, size_t n) {
  std::vector<Spec> specs;
  for (size_t i = 0; i < n; ++i) {
    Spec s;
    s.prompt = Prompt(static_cast<int64_t>(1 + (i * 4) % 15), static_cast<uint32_t>(i), vocab);
    s.max_tokens = static_cast<int64_t>(2 + (i * 3) % 8);
    specs.push_back(s);
  }
  return specs;
}

TEST(Scheduler, EveryRequestGetsTheBitsOfItsOwnRunOnTiny) {
  std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), 32);
  ASSERT_NE(e, nullptr);
  const std::vector<Spec> all = MixedSpecs(e->config().vocab, 8);
  std::vector<Solo> want;
  for (const Spec& s : all) want.push_back(Alone(e.get(), s));
  for (size_t n = 1; n <= 8; ++n) {
    for (int64_t seqs : {1, 2, 3, 8}) {
      const std::vector<Spec> specs(all.begin(), all.begin() + static_cast<int64_t>(n));
      SchedulerOptions o;
      o.max_seqs = seqs;
      ExpectSameAsAlone(Schedule(e.get(), specs, o),
                        std::vector<Solo>(want.begin(), want.begin() + static_cast<int64_t>(n)),
                        std::to_string(n) + " requests, max_seqs " + std::to_string(seqs));
    }
  }
}

TEST(Scheduler, EveryRequestGetsTheBitsOfItsOwnRunOnSmall) {
  std::unique_ptr<Engine> e = OpenPlanned(SmallPreparedDir(), 24);
  ASSERT_NE(e, nullptr);
  const std::vector<Spec> specs = MixedSpecs(e->config().vocab, 5);
  std::vector<Solo> want;
  for (const Spec& s : specs) want.push_back(Alone(e.get(), s));
  for (int64_t seqs : {1, 3, 5}) {
    SchedulerOptions o;
    o.max_seqs = seqs;
    ExpectSameAsAlone(Schedule(e.get(), specs, o), want, "max_seqs " + std::to_string(seqs));
  }
}

// The first position of a token that does not occur before it in `ids` (a stop id that stops
// exactly there), or -1.
int64_t FirstNew(const std::vector<int32_t>& ids, size_t from) {
  for (size_t i = from; i < ids.size(); ++i) {
    if (std::find(ids.begin(), ids.begin() + static_cast<int64_t>(i), ids[i]) ==
        ids.begin() + static_cast<int64_t>(i)) {
      return static_cast<int64_t>(i);
    }
  }
  return -1;
}

// Two slots, five requests ending at different steps (token limits and stop ids): each freed
// slot takes the next request in the same RunPass, and every request gets its own run's bits.
TEST(Scheduler, ContinuousAdmissionWithMembersStoppingAtDifferentSteps) {
  std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), 32);
  ASSERT_NE(e, nullptr);
  const int64_t V = e->config().vocab;
  std::vector<Spec> specs;
  for (int i = 0; i < 5; ++i) {
    Spec s;
    s.prompt = Prompt(3 + i, static_cast<uint32_t>(40 + i), V);
    s.max_tokens = 2 + 3 * i;
    specs.push_back(s);
  }
  // Requests 1 and 3 stop at an id of their own long run.
  std::vector<FinishReason> reasons(5, FinishReason::kLength);
  for (int i : {1, 3}) {
    Spec longer = specs[static_cast<size_t>(i)];
    longer.max_tokens = 12;
    const Solo r = Alone(e.get(), longer);
    const int64_t at = FirstNew(r.ids, 1);
    ASSERT_GE(at, 1) << "no usable stop id in request " << i << "'s run";
    specs[static_cast<size_t>(i)].max_tokens = 12;
    specs[static_cast<size_t>(i)].stop_ids = {r.ids[static_cast<size_t>(at)]};
    reasons[static_cast<size_t>(i)] = FinishReason::kStopId;
  }
  std::vector<Solo> want;
  for (const Spec& s : specs) want.push_back(Alone(e.get(), s));
  EXPECT_LT(want[1].ids.size(), 12u);
  EXPECT_LT(want[3].ids.size(), 12u);

  std::vector<Outcome> out(specs.size());
  SchedulerOptions o;
  o.max_seqs = 2;
  Scheduler sched(e.get(), o);
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSERT_TRUE(sched.Submit(MakeRequest(specs[i], &out[i], V)).ok());
  }
  int64_t passes = 0;
  while (true) {
    Result<bool> ran = sched.RunPass();
    ASSERT_TRUE(ran.ok());
    if (!*ran) break;
    ++passes;
    const SchedulerStats st = sched.Stats();
    // Never an idle slot while a request waits.
    if (st.queued > 0) {
      EXPECT_EQ(st.active, 2) << "after pass " << passes;
    }
    ASSERT_LT(passes, 1000);
  }
  ExpectSameAsAlone(out, want, "max_seqs 2");
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i].result.reason, reasons[i]) << "request " << i;
  }
  const SchedulerStats st = sched.Stats();
  int64_t generated = 0, own_passes = 0;
  for (const Outcome& x : out) {
    generated += static_cast<int64_t>(x.run.ids.size());
    own_passes += x.result.passes;
  }
  EXPECT_EQ(st.generated, generated);
  EXPECT_EQ(st.finished, 5);
  EXPECT_EQ(st.passes, passes);
  // Passes were shared: fewer than the requests' passes added up.
  EXPECT_LT(st.passes, own_passes);
}

// Prompts longer than a pass are fed over several passes beside other requests' rows; no pass
// holds more than pass_rows rows, and the bits are those of one pass.
TEST(Scheduler, LongPromptsSplitOverPassesKeepTheBits) {
  std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), 40);
  ASSERT_NE(e, nullptr);
  const int64_t V = e->config().vocab;
  std::vector<Spec> specs;
  for (int i = 0; i < 4; ++i) {
    Spec s;
    s.prompt = Prompt(10 + 7 * i, static_cast<uint32_t>(70 + i), V);
    s.max_tokens = 4;
    specs.push_back(s);
  }
  std::vector<Solo> want;
  for (const Spec& s : specs) want.push_back(Alone(e.get(), s));
  for (int64_t pass_rows : {1, 3, 5}) {
    std::vector<Outcome> out(specs.size());
    SchedulerOptions o;
    o.max_seqs = 3;
    o.pass_rows = pass_rows;
    Scheduler sched(e.get(), o);
    for (size_t i = 0; i < specs.size(); ++i) {
      ASSERT_TRUE(sched.Submit(MakeRequest(specs[i], &out[i], V)).ok());
    }
    int64_t rows = 0;
    while (true) {
      Result<bool> ran = sched.RunPass();
      ASSERT_TRUE(ran.ok());
      if (!*ran) break;
      const int64_t now = sched.Stats().rows;
      EXPECT_LE(now - rows, pass_rows);
      rows = now;
    }
    ExpectSameAsAlone(out, want, "pass_rows " + std::to_string(pass_rows));
    // Progress reaches each prompt's end, counting up.
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_FALSE(out[i].prefill.empty());
      const int64_t P = static_cast<int64_t>(specs[i].prompt.size());
      EXPECT_EQ(out[i].prefill.back(), std::make_pair(P, P));
      EXPECT_EQ(out[i].result.prompt_fed, P);
      if (pass_rows < P) {
        EXPECT_GT(out[i].prefill.size(), 1u);
      }
    }
  }
}

// One slot: A runs, B and C wait. Cancelling A (running) and C (queued) ends them with
// kCancelled exactly once; B then runs in A's reused slot with its own run's bits.
TEST(Scheduler, CancelQueuedAndRunningRequests) {
  std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), 32);
  ASSERT_NE(e, nullptr);
  const int64_t V = e->config().vocab;
  std::vector<Spec> specs(3);
  for (int i = 0; i < 3; ++i) {
    specs[static_cast<size_t>(i)].prompt = Prompt(5, static_cast<uint32_t>(90 + i), V);
    specs[static_cast<size_t>(i)].max_tokens = 10;
  }
  const Solo want_a = Alone(e.get(), specs[0]);
  const Solo want_b = Alone(e.get(), specs[1]);
  std::vector<Outcome> out(3);
  SchedulerOptions o;
  o.max_seqs = 1;
  Scheduler sched(e.get(), o);
  std::vector<int64_t> ids;
  for (size_t i = 0; i < 3; ++i) ids.push_back(*sched.Submit(MakeRequest(specs[i], &out[i], V)));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(*sched.RunPass());
  sched.Cancel(ids[0]);
  sched.Cancel(ids[2]);
  sched.Cancel(12345);  // unknown: ignored
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  EXPECT_EQ(out[0].result.reason, FinishReason::kCancelled);
  EXPECT_EQ(out[0].done_calls, 1);
  ASSERT_EQ(out[0].run.ids.size(), 3u);  // three passes, one token each
  EXPECT_EQ(out[0].run.ids, std::vector<int32_t>(want_a.ids.begin(), want_a.ids.begin() + 3));
  EXPECT_EQ(out[2].result.reason, FinishReason::kCancelled);
  EXPECT_EQ(out[2].done_calls, 1);
  EXPECT_TRUE(out[2].run.ids.empty());
  EXPECT_EQ(out[2].result.passes, 0);
  EXPECT_EQ(out[1].result.reason, FinishReason::kLength);
  EXPECT_EQ(out[1].run.ids, want_b.ids);
  EXPECT_TRUE(SameBits(out[1].run.logits, want_b.logits));
  sched.Cancel(ids[1]);  // finished: ignored
  EXPECT_FALSE(*sched.RunPass());
  EXPECT_EQ(out[1].done_calls, 1);
}

// CancelAll and destruction end every request, queued or running, exactly once.
TEST(Scheduler, CancelAllAndShutdownEndEveryRequestOnce) {
  std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), 32);
  ASSERT_NE(e, nullptr);
  const int64_t V = e->config().vocab;
  std::vector<Outcome> out(6);
  {
    SchedulerOptions o;
    o.max_seqs = 2;
    Scheduler sched(e.get(), o);
    for (size_t i = 0; i < 3; ++i) {
      Spec s{Prompt(4, static_cast<uint32_t>(i), V), 8, {}, {}, 0};
      ASSERT_TRUE(sched.Submit(MakeRequest(s, &out[i], V)).ok());
    }
    ASSERT_TRUE(*sched.RunPass());
    sched.CancelAll();
    ASSERT_TRUE(sched.RunUntilIdle().ok());
    for (size_t i = 3; i < 6; ++i) {
      Spec s{Prompt(4, static_cast<uint32_t>(i), V), 8, {}, {}, 0};
      ASSERT_TRUE(sched.Submit(MakeRequest(s, &out[i], V)).ok());
    }
    ASSERT_TRUE(*sched.RunPass());
  }  // destroyed with two running and one queued
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i].done_calls, 1) << i;
    EXPECT_EQ(out[i].result.reason, FinishReason::kCancelled) << i;
  }
}

TEST(Scheduler, OnTokenFalseStopsWithTheTokenKept) {
  std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), 32);
  ASSERT_NE(e, nullptr);
  const int64_t V = e->config().vocab;
  const Spec spec{Prompt(6, 5, V), 9, {}, {}, 0};
  const Solo want = Alone(e.get(), spec);
  Outcome out;
  Request r = MakeRequest(spec, &out, V);
  int calls = 0;
  r.on_token = [&](int32_t, const float*) { return ++calls < 4; };
  Scheduler sched(e.get(), SchedulerOptions{});
  ASSERT_TRUE(sched.Submit(std::move(r)).ok());
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  EXPECT_EQ(out.result.reason, FinishReason::kStopped);
  EXPECT_EQ(out.run.ids, std::vector<int32_t>(want.ids.begin(), want.ids.begin() + 4));
}

// A sequence of 6 positions, a prompt of 4: the third token fills it (prompt + 3 − 1 fed), so
// a request for 10 ends there with kContext; the ids are those of a run of 3.
TEST(Scheduler, ContextFullEndsWithKContext) {
  std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), 6);
  ASSERT_NE(e, nullptr);
  const int64_t V = e->config().vocab;
  Spec spec{Prompt(4, 6, V), 3, {}, {}, 0};
  const Solo want = Alone(e.get(), spec);
  spec.max_tokens = 10;
  const std::vector<Outcome> out = Schedule(e.get(), {spec}, SchedulerOptions{});
  EXPECT_EQ(out[0].result.reason, FinishReason::kContext);
  EXPECT_EQ(out[0].run.ids, want.ids);
  EXPECT_TRUE(SameBits(out[0].run.logits, want.logits));
}

TEST(Scheduler, SubmitRefusesPastTheQueueLimitAndInvalidRequests) {
  std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), 8);
  ASSERT_NE(e, nullptr);
  const int64_t V = e->config().vocab;
  SchedulerOptions o;
  o.max_queue = 2;
  Scheduler sched(e.get(), o);
  std::vector<Outcome> out(5);
  const Spec spec{Prompt(3, 1, V), 2, {}, {}, 0};
  // One request takes the free slot, two wait: the queue is full.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(sched.Submit(MakeRequest(spec, &out[i], V)).ok()) << i;
  Result<int64_t> fourth = sched.Submit(MakeRequest(spec, &out[3], V));
  ASSERT_FALSE(fourth.ok());
  EXPECT_EQ(fourth.status().code(), Code::kIo);
  EXPECT_NE(fourth.status().message().find("max_queue 2"), std::string::npos);
  EXPECT_EQ(out[3].done_calls, 0);
  // A finished request makes room.
  while (sched.Stats().finished == 0) ASSERT_TRUE(*sched.RunPass());
  EXPECT_TRUE(sched.Submit(MakeRequest(spec, &out[4], V)).ok());
  Request empty;
  EXPECT_EQ(sched.Submit(std::move(empty)).status().code(), Code::kInvalid);
  Request outside;
  outside.prompt = {1, static_cast<int32_t>(V)};
  EXPECT_EQ(sched.Submit(std::move(outside)).status().code(), Code::kInvalid);
  Request too_long;
  too_long.prompt = Prompt(9, 2, V);  // 8 positions
  EXPECT_EQ(sched.Submit(std::move(too_long)).status().code(), Code::kInvalid);
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  EXPECT_EQ(sched.Stats().finished, 4);
  // max_queue 0: only as many as the free slots.
  SchedulerOptions none;
  none.max_queue = 0;
  Scheduler strict(e.get(), none);
  Outcome x, y;
  EXPECT_TRUE(strict.Submit(MakeRequest(spec, &x, V)).ok());
  EXPECT_EQ(strict.Submit(MakeRequest(spec, &y, V)).status().code(), Code::kIo);
  ASSERT_TRUE(strict.RunUntilIdle().ok());
}

// A request extending a finished request's tokens starts from its snapshot: only the rest is
// fed, and every logit equals a cold run's.
TEST(Scheduler, PromptCacheFeedsOnlyTheRestWithTheBitsOfAColdRun) {
  std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), 40);
  ASSERT_NE(e, nullptr);
  const int64_t V = e->config().vocab;
  const Spec first{Prompt(9, 11, V), 4, {}, {}, 0};
  const Solo first_alone = Alone(e.get(), first);
  ASSERT_EQ(first_alone.ids.size(), 4u);
  Spec second{first.prompt, 5, {}, {}, 0};
  second.prompt.insert(second.prompt.end(), first_alone.ids.begin(), first_alone.ids.end());
  second.prompt.push_back(17);
  second.prompt.push_back(23);
  const Solo second_cold = Alone(e.get(), second);

  SchedulerOptions o;
  o.max_seqs = 2;
  o.prompt_cache_bytes = uint64_t{1} << 30;
  Scheduler sched(e.get(), o);
  Outcome a, b;
  ASSERT_TRUE(sched.Submit(MakeRequest(first, &a, V)).ok());
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  EXPECT_EQ(a.run.ids, first_alone.ids);
  EXPECT_GT(sched.Stats().prompt_cache_bytes, 0u);
  ASSERT_TRUE(sched.Submit(MakeRequest(second, &b, V)).ok());
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  // The snapshot holds the first prompt and 3 of its 4 tokens (the last was never fed).
  EXPECT_EQ(b.result.prompt_tokens, 15);
  EXPECT_EQ(b.result.prompt_fed, 15 - (9 + 3));
  EXPECT_EQ(b.run.ids, second_cold.ids);
  EXPECT_TRUE(SameBits(b.run.logits, second_cold.logits));
  const SchedulerStats st = sched.Stats();
  EXPECT_EQ(st.prompt_cache_hits, 1);
  EXPECT_EQ(st.prompt_cache_tokens, 12);
  EXPECT_EQ(st.prompt_rows, 9 + 3);
}

// The end of a prompt is kept too: a request that extends the first PROMPT with other tokens
// than its reply (a chat re-sent as text whose reply re-encodes differently) feeds only those.
TEST(Scheduler, PromptCacheKeepsTheEndOfEachPrompt) {
  std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), 40);
  ASSERT_NE(e, nullptr);
  const int64_t V = e->config().vocab;
  const Spec first{Prompt(9, 11, V), 4, {}, {}, 0};
  Spec other{first.prompt, 3, {}, {}, 0};
  for (int32_t id : {99, 98, 97}) other.prompt.push_back(id);
  const Solo other_cold = Alone(e.get(), other);
  SchedulerOptions o;
  o.prompt_cache_bytes = uint64_t{1} << 30;
  Scheduler sched(e.get(), o);
  Outcome a, b;
  ASSERT_TRUE(sched.Submit(MakeRequest(first, &a, V)).ok());
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  ASSERT_TRUE(sched.Submit(MakeRequest(other, &b, V)).ok());
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  EXPECT_EQ(b.result.prompt_fed, 3);
  EXPECT_EQ(b.run.ids, other_cold.ids);
  EXPECT_TRUE(SameBits(b.run.logits, other_cold.logits));
}

// Room for one request's snapshots: after A, B and C finish, C's are kept (a hit), A's were
// evicted (a miss).
TEST(Scheduler, PromptCacheEvictsTheLeastRecentlyUsedByBytes) {
  std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), 40);
  ASSERT_NE(e, nullptr);
  const int64_t V = e->config().vocab;
  std::vector<Spec> firsts;
  for (int i = 0; i < 3; ++i) firsts.push_back(Spec{Prompt(8, 20 + i, V), 3, {}, {}, 0});
  // A request leaves two snapshots: the end of its prompt (8 ids) and its end (8 prompt ids + 2
  // of its 3 tokens).
  auto snapshot_bytes = [&](int64_t n) {
    std::unique_ptr<Sequence> seq = e->NewSequence();
    EXPECT_TRUE(e->Feed(seq.get(), Prompt(n, 99, V)).ok());
    return e->Snapshot(*seq).bytes();
  };
  const uint64_t one = snapshot_bytes(8) + snapshot_bytes(10);
  SchedulerOptions o;
  o.prompt_cache_bytes = one + one / 2;  // room for one request's two, not for two requests'
  Scheduler sched(e.get(), o);
  std::vector<Outcome> out(5);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(sched.Submit(MakeRequest(firsts[i], &out[i], V)).ok());
    ASSERT_TRUE(sched.RunUntilIdle().ok());
  }
  EXPECT_EQ(sched.Stats().prompt_cache_bytes, one);
  auto extend = [&](size_t i) {
    Spec s{firsts[i].prompt, 2, {}, {}, 0};
    s.prompt.insert(s.prompt.end(), out[i].run.ids.begin(), out[i].run.ids.end());
    return s;
  };
  ASSERT_TRUE(sched.Submit(MakeRequest(extend(2), &out[4], V)).ok());
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  EXPECT_EQ(out[4].result.prompt_fed, 1);  // hit on C's 10 tokens
  EXPECT_EQ(sched.Stats().prompt_cache_hits, 1);
  EXPECT_EQ(out[4].run.ids, Alone(e.get(), extend(2)).ids);
  ASSERT_TRUE(sched.Submit(MakeRequest(extend(0), &out[3], V)).ok());
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  EXPECT_EQ(out[3].result.prompt_fed, 11);  // miss: A's snapshots were evicted
  EXPECT_EQ(sched.Stats().prompt_cache_hits, 1);
}

// A pass that fails (trunk.bin unreadable) ends the requests it carried with kError and the
// read's status, each exactly once, and the scheduler goes on: a request submitted afterwards
// is admitted, run and ended the same way (the file stays unreadable: an opened FaultEnv file
// keeps its rule), then the scheduler is idle.
TEST(Scheduler, FailingPassEndsItsRequestsWithKErrorAndTheSchedulerGoesOn) {
  test::FaultEnv env;
  env.SetRule(TinyPreparedDir() + "/trunk.bin", test::FaultRule::EioAt(100));
  Result<std::unique_ptr<Engine>> opened = Engine::Open(&env, TinyPreparedDir());
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::unique_ptr<Engine> e = std::move(opened).value();
  PlanOptions po;
  po.positions = 16;
  po.pass_rows = 16;
  ASSERT_TRUE(e->Plan(po).ok());
  ASSERT_TRUE(e->LoadWeights().ok());
  const int64_t V = e->config().vocab;
  SchedulerOptions o;
  o.max_seqs = 2;
  Scheduler sched(e.get(), o);
  std::vector<Outcome> out(3);
  const Spec spec{Prompt(5, 8, V), 3, {}, {}, 0};
  ASSERT_TRUE(sched.Submit(MakeRequest(spec, &out[0], V)).ok());
  ASSERT_TRUE(sched.Submit(MakeRequest(spec, &out[1], V)).ok());
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  ASSERT_TRUE(sched.Submit(MakeRequest(spec, &out[2], V)).ok());
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i].done_calls, 1) << i;
    EXPECT_EQ(out[i].result.reason, FinishReason::kError) << i;
    EXPECT_EQ(out[i].result.status.code(), Code::kIo) << out[i].result.status.ToString();
    EXPECT_NE(out[i].result.status.message().find("trunk.bin"), std::string::npos)
        << out[i].result.status.ToString();
    EXPECT_EQ(out[i].result.passes, 1) << i;
    EXPECT_TRUE(out[i].run.ids.empty()) << i;
  }
  EXPECT_TRUE(sched.Idle());
  EXPECT_EQ(sched.Stats().finished, 3);
  EXPECT_EQ(sched.Stats().passes, 0);  // failed passes are not counted
}

// Rows routed to an expert that fails its hash make the sequence invalid: its request ends with
// kError and kUnreliable ("RUN INVALID"), with no token chosen from those logits.
TEST(Scheduler, ExpertReadFailureEndsItsRequestRunInvalid) {
  test::TempDir tmp;
  const std::string dir = testing::CopyTinyWithCorruptExperts(tmp.Join("prep"), 1);
  Result<std::unique_ptr<Engine>> opened = Engine::Open(Env::Default(), dir);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::unique_ptr<Engine> e = std::move(opened).value();
  PlanOptions po;
  po.positions = 16;
  po.pass_rows = 16;
  po.verify_reads = true;
  ASSERT_TRUE(e->Plan(po).ok());
  ASSERT_TRUE(e->LoadWeights().ok());
  const int64_t V = e->config().vocab;
  Scheduler sched(e.get(), SchedulerOptions{});
  Outcome out;
  ASSERT_TRUE(sched.Submit(MakeRequest(Spec{Prompt(5, 8, V), 3, {}, {}, 0}, &out, V)).ok());
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  EXPECT_GT(e->experts_skipped(), 0);
  EXPECT_EQ(out.done_calls, 1);
  EXPECT_EQ(out.result.reason, FinishReason::kError);
  EXPECT_EQ(out.result.status.code(), Code::kUnreliable) << out.result.status.ToString();
  EXPECT_NE(out.result.status.message().find("RUN INVALID"), std::string::npos);
  EXPECT_TRUE(out.run.ids.empty());
}

// Seeded sampled requests draw the same tokens alone and beside any other requests, in any
// order: one RNG per sequence.
TEST(Scheduler, SeededSampledRequestsAreReproducibleWhateverShareTheBatch) {
  std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), 32);
  ASSERT_NE(e, nullptr);
  const int64_t V = e->config().vocab;
  std::vector<Spec> specs = MixedSpecs(V, 6);
  for (size_t i = 0; i < specs.size(); i += 2) {
    specs[i].sampling.temperature = 1.5;
    specs[i].sampling.top_k = 50;
    specs[i].sampling.repeat_penalty = 1.3;
    specs[i].seed = 1000 + i;
    specs[i].max_tokens = 8;
  }
  std::vector<Solo> want;
  for (const Spec& s : specs) want.push_back(Alone(e.get(), s));
  SchedulerOptions o;
  o.max_seqs = 3;
  ExpectSameAsAlone(Schedule(e.get(), specs, o), want, "in order");
  std::vector<Spec> reversed(specs.rbegin(), specs.rend());
  std::vector<Solo> want_reversed(want.rbegin(), want.rend());
  o.max_seqs = 4;
  ExpectSameAsAlone(Schedule(e.get(), reversed, o), want_reversed, "reversed");
  // A different seed draws differently (the comparison above can fail).
  Spec other = specs[0];
  other.seed = 7;
  EXPECT_NE(Alone(e.get(), other).ids, want[0].ids);
}

// The server's shape: an engine thread that waits for work and runs passes while this thread
// submits `r` (after `delay`) and waits for its on_done.
void RunOnEngineThread(Scheduler* sched, Request r,
                       std::chrono::milliseconds delay = std::chrono::milliseconds(0)) {
  std::atomic<bool> stop{false};
  std::thread engine_thread([&] {
    while (!stop) {
      sched->WaitForWork();
      EXPECT_TRUE(sched->RunPass().ok());
    }
  });
  std::this_thread::sleep_for(delay);
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  auto inner = r.on_done;
  r.on_done = [&](const RequestResult& rr) {
    if (inner) inner(rr);
    std::lock_guard<std::mutex> l(mu);
    done = true;
    cv.notify_all();
  };
  const bool submitted = sched->Submit(std::move(r)).ok();
  EXPECT_TRUE(submitted);
  if (submitted) {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return done; });
  }
  stop = true;
  sched->Wake();
  engine_thread.join();
}

TEST(Scheduler, EngineThreadWaitsForWorkAndWakes) {
  std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), 32);
  ASSERT_NE(e, nullptr);
  const int64_t V = e->config().vocab;
  const Spec spec{Prompt(5, 3, V), 4, {}, {}, 0};
  const Solo want = Alone(e.get(), spec);
  Scheduler sched(e.get(), SchedulerOptions{});
  Outcome out;
  RunOnEngineThread(&sched, MakeRequest(spec, &out, V));
  EXPECT_EQ(out.run.ids, want.ids);
  EXPECT_TRUE(SameBits(out.run.logits, want.logits));
}

// The engine's idle time between passes (SchedulerStats::idle_*, the server's /metrics): the
// gaps between passes that follow each other are timed, with what runs there (here a callback
// that sleeps); the time the engine waits for a request is not.
TEST(Scheduler, IdleGapsAreTimedOnlyBetweenPassesThatFollowEachOther) {
  std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), 32);
  ASSERT_NE(e, nullptr);
  const int64_t V = e->config().vocab;
  static constexpr double kCallback = 0.004;
  SchedulerOptions o;
  o.max_seqs = 2;
  Scheduler sched(e.get(), o);
  std::vector<Outcome> out(3);
  for (size_t i = 0; i < 2; ++i) {
    Request r = MakeRequest(Spec{Prompt(4, static_cast<uint32_t>(i), V), 5, {}, {}, 0}, &out[i], V);
    auto inner = r.on_token;
    r.on_token = [inner](int32_t t, const float* l) {
      std::this_thread::sleep_for(std::chrono::duration<double>(kCallback));
      return inner(t, l);
    };
    ASSERT_TRUE(sched.Submit(std::move(r)).ok());
  }
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  SchedulerStats st = sched.Stats();
  ASSERT_GE(st.passes, 5);
  EXPECT_EQ(st.idle_gaps, st.passes - 1);
  // Every gap but the last holds two sleeping callbacks (both requests decode in each pass).
  EXPECT_GE(st.idle_median_seconds, 2 * kCallback);
  EXPECT_GE(st.idle_seconds, static_cast<double>(st.passes - 2) * 2 * kCallback);
  EXPECT_LE(st.idle_median_seconds, st.idle_p99_seconds);
  EXPECT_LE(st.idle_p99_seconds, st.idle_max_seconds);

  // The engine thread waits 300 ms for the next request: not a gap between passes.
  const int64_t passes_before = st.passes, gaps_before = st.idle_gaps;
  RunOnEngineThread(&sched, MakeRequest(Spec{Prompt(3, 9, V), 3, {}, {}, 0}, &out[2], V),
                    std::chrono::milliseconds(300));
  st = sched.Stats();
  EXPECT_EQ(st.passes - passes_before, 3);
  EXPECT_EQ(st.idle_gaps - gaps_before, 2);  // within the new request only
  EXPECT_LT(st.idle_max_seconds, 0.3);
  for (const Outcome& x : out) EXPECT_EQ(x.done_calls, 1);
}

// ---- Speculation (SchedulerOptions::spec) ----

std::unique_ptr<Engine> OpenSpec(const std::string& dir, int64_t positions, int64_t spec) {
  PlanOptions po = testing::ContextPlan(positions);
  po.spec_rows = spec;
  return testing::OpenPlanned(dir, po);
}

using Drafter = std::function<std::vector<int32_t>(std::span<const int32_t>, int64_t, int64_t)>;

// Drafts from a request's plain run (`truth`: its ids), every `wrong`-th id altered (0: none) so
// that some drafts are refused; any draft gives the same output, only the passes differ.
Drafter FromTruth(std::vector<int32_t> truth, int64_t vocab, int64_t wrong) {
  return [truth, vocab, wrong](std::span<const int32_t>, int64_t done, int64_t n) {
    std::vector<int32_t> d;
    for (int64_t i = done; i < done + n && i < static_cast<int64_t>(truth.size()); ++i) {
      const int32_t id = truth[static_cast<size_t>(i)];
      d.push_back(wrong > 0 && i % wrong == wrong - 1 ? static_cast<int32_t>((id + 1) % vocab)
                                                      : id);
    }
    return d;
  };
}

// Schedule() with a drafter per request (null: the prompt lookup).
std::vector<Outcome> ScheduleDrafted(Engine* e, const std::vector<Spec>& specs,
                                     const std::vector<Drafter>& drafters, SchedulerOptions o,
                                     SchedulerStats* stats) {
  std::vector<Outcome> out(specs.size());
  Scheduler sched(e, o);
  for (size_t i = 0; i < specs.size(); ++i) {
    Request r = MakeRequest(specs[i], &out[i], e->config().vocab);
    r.drafter = drafters[i];
    Result<int64_t> id = sched.Submit(std::move(r));
    EXPECT_TRUE(id.ok()) << id.status().ToString();
  }
  const Status s = sched.RunUntilIdle();
  EXPECT_TRUE(s.ok()) << s.ToString();
  *stats = sched.Stats();
  return out;
}

// Greedy, penalised greedy and seeded sampled requests share passes under --spec 4 (known
// continuations with wrong ids, and the lookup): every request gets the ids and logit bits of
// its plain run alone; drafts were kept and refused (--spec-fixed: the adaptive policy's choices
// depend on timed passes); sampled requests never drafted. Then once adaptive: the same bits.
void CheckSpecKeepsTheBits(const std::string& dir, size_t n, const std::vector<int64_t>& seqs,
                           const std::vector<int64_t>& pass_rows) {
  std::unique_ptr<Engine> e = OpenSpec(dir, 40, 4);
  ASSERT_NE(e, nullptr);
  const int64_t V = e->config().vocab;
  std::vector<Spec> specs = MixedSpecs(V, n);
  for (size_t i = 0; i < specs.size(); ++i) {
    specs[i].max_tokens = static_cast<int64_t>(10 + i);
    if (i % 3 == 2) {  // seeded sampling: decodes a row per pass beside the drafts
      specs[i].sampling.temperature = 1.2;
      specs[i].seed = 500 + i;
    }
    if (i == 1) specs[i].sampling.repeat_penalty = 1.3;  // penalised greedy: still speculates
  }
  std::vector<Solo> want;
  std::vector<Drafter> drafters;
  for (size_t i = 0; i < specs.size(); ++i) {
    want.push_back(Alone(e.get(), specs[i]));
    drafters.push_back(i % 3 == 1 ? nullptr : FromTruth(want.back().ids, V, 1 + i % 4));
  }
  for (int64_t m : seqs) {
    for (int64_t rows : pass_rows) {
      SchedulerOptions o;
      o.max_seqs = m;
      o.pass_rows = rows;
      o.spec = 4;
      o.spec_fixed = true;
      SchedulerStats st;
      const std::vector<Outcome> out = ScheduleDrafted(e.get(), specs, drafters, o, &st);
      const std::string what = "max_seqs " + std::to_string(m) + ", pass_rows " +
                               std::to_string(rows);
      ExpectSameAsAlone(out, want, what);
      EXPECT_GT(st.spec_accepted, 0) << what << ": no draft was kept";
      EXPECT_GT(st.spec_drafted, st.spec_accepted) << what << ": no draft was refused";
      int64_t drafted = 0, accepted = 0;
      for (size_t i = 0; i < out.size(); ++i) {
        drafted += out[i].result.spec.drafted;
        accepted += out[i].result.spec.accepted;
        if (specs[i].sampling.sampling()) {
          EXPECT_EQ(out[i].result.spec.drafted, 0) << what;
        }
      }
      EXPECT_EQ(drafted, st.spec_drafted) << what;
      EXPECT_EQ(accepted, st.spec_accepted) << what;
    }
  }
  SchedulerOptions adaptive;
  adaptive.max_seqs = seqs.back();
  adaptive.spec = 4;
  SchedulerStats st;
  ExpectSameAsAlone(ScheduleDrafted(e.get(), specs, drafters, adaptive, &st), want, "adaptive");
}

TEST(SchedulerSpec, EveryRequestGetsThePlainBitsWhileDraftsAreKeptAndRefusedOnTiny) {
  CheckSpecKeepsTheBits(TinyPreparedDir(), 6, {1, 3, 6}, {0, 4});
}

TEST(SchedulerSpec, EveryRequestGetsThePlainBitsWhileDraftsAreKeptAndRefusedOnSmall) {
  CheckSpecKeepsTheBits(SmallPreparedDir(), 4, {4}, {0});
}

// Two slots, four requests: A ends at a stop id inside a kept draft, B's callback stops it inside
// another, while C speculates beside them; D waits and takes a freed slot. Each has its plain
// run's ids and bits and its reason.
TEST(SchedulerSpec, RequestsEndingInsideADraftFreeTheirSlotWhileOthersSpeculate) {
  std::unique_ptr<Engine> e = OpenSpec(TinyPreparedDir(), 40, 4);
  ASSERT_NE(e, nullptr);
  const int64_t V = e->config().vocab;
  std::vector<Spec> specs;
  for (int i = 0; i < 4; ++i) {
    Spec s;
    s.prompt = Prompt(3 + i, static_cast<uint32_t>(90 + i), V);
    s.max_tokens = 16;
    specs.push_back(s);
  }
  // A stops at the first id of its run (from index 2) that did not occur before.
  const Solo a_long = Alone(e.get(), specs[0]);
  const int64_t at = FirstNew(a_long.ids, 2);
  ASSERT_GE(at, 2) << "no usable stop id in A's run";
  specs[0].stop_ids = {a_long.ids[static_cast<size_t>(at)]};
  std::vector<Solo> want;
  std::vector<Drafter> drafters;
  for (const Spec& s : specs) {
    want.push_back(Alone(e.get(), s));
    drafters.push_back(FromTruth(want.back().ids, V, 0));  // every draft right: 5 tokens a pass
  }
  ASSERT_EQ(static_cast<int64_t>(want[0].ids.size()), at + 1);
  std::vector<Outcome> out(specs.size());
  SchedulerOptions o;
  o.max_seqs = 2;
  o.spec = 4;
  o.spec_fixed = true;  // draft 4 whenever 4 are asked for
  Scheduler sched(e.get(), o);
  for (size_t i = 0; i < specs.size(); ++i) {
    Request r = MakeRequest(specs[i], &out[i], V);
    r.drafter = drafters[i];
    if (i == 1) {  // B: its callback stops it at its 4th token, the 3rd of a 5-token pass
      auto inner = r.on_token;
      auto calls = std::make_shared<int>(0);
      r.on_token = [inner, calls](int32_t t, const float* l) {
        inner(t, l);
        return ++*calls < 4;
      };
    }
    ASSERT_TRUE(sched.Submit(std::move(r)).ok());
  }
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  want[1].ids.resize(4);
  want[1].logits.resize(static_cast<size_t>(4 * V));
  ExpectSameAsAlone(out, want, "max_seqs 2, --spec 4");
  EXPECT_EQ(out[0].result.reason, FinishReason::kStopId);
  EXPECT_EQ(out[1].result.reason, FinishReason::kStopped);
  EXPECT_EQ(out[2].result.reason, FinishReason::kLength);
  EXPECT_EQ(out[3].result.reason, FinishReason::kLength);
  for (const Outcome& x : out) {
    EXPECT_GT(x.result.spec.accepted, 0);
    // Several tokens a pass: the prompt's pass, then at most ceil((n − 1) / 5) decode passes.
    const auto n = static_cast<int64_t>(x.run.ids.size());
    EXPECT_LE(x.result.passes, 1 + (n - 1 + 4) / 5) << x.result.id;
  }
}

// A speculating request that stops at a stop id inside its draft leaves a prompt snapshot of
// exactly what a plain run leaves (its prompt and generated ids but the last): the next request
// that extends it feeds only the rest, with the bits of a cold run.
TEST(SchedulerSpec, PromptCacheAfterADraftHoldsWhatAPlainRunHolds) {
  std::unique_ptr<Engine> e = OpenSpec(TinyPreparedDir(), 40, 4);
  ASSERT_NE(e, nullptr);
  const int64_t V = e->config().vocab;
  Spec first{Prompt(9, 11, V), 12, {}, {}, 0};
  const Solo free_run = Alone(e.get(), first);
  const int64_t at = FirstNew(free_run.ids, 2);
  ASSERT_GE(at, 2);
  ASSERT_LE(at, 4) << "the stop id must fall inside the first decode pass's 5 tokens";
  first.stop_ids = {free_run.ids[static_cast<size_t>(at)]};
  const Solo first_alone = Alone(e.get(), first);
  ASSERT_EQ(static_cast<int64_t>(first_alone.ids.size()), at + 1);
  Spec second{first.prompt, 5, {}, {}, 0};
  second.prompt.insert(second.prompt.end(), first_alone.ids.begin(), first_alone.ids.end());
  second.prompt.push_back(17);
  second.prompt.push_back(23);
  const Solo second_cold = Alone(e.get(), second);

  SchedulerOptions o;
  o.spec = 4;
  o.spec_fixed = true;
  o.prompt_cache_bytes = uint64_t{1} << 30;
  Scheduler sched(e.get(), o);
  Outcome a, b;
  Request ra = MakeRequest(first, &a, V);
  ra.drafter = FromTruth(free_run.ids, V, 0);
  ASSERT_TRUE(sched.Submit(std::move(ra)).ok());
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  EXPECT_EQ(a.run.ids, first_alone.ids);
  EXPECT_EQ(a.result.reason, FinishReason::kStopId);
  EXPECT_EQ(a.result.spec.accepted, at - 1);  // the stop came inside the draft
  ASSERT_TRUE(sched.Submit(MakeRequest(second, &b, V)).ok());
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  const auto P = static_cast<int64_t>(second.prompt.size());
  EXPECT_EQ(b.result.prompt_fed, P - (9 + at));  // the snapshot: 9 + at ids
  EXPECT_EQ(b.run.ids, second_cold.ids);
  EXPECT_TRUE(SameBits(b.run.logits, second_cold.logits));
}

// A sequence of 6 positions and a prompt of 4 under --spec 4: the draft is cut to the one
// position left, and the request ends with kContext on the ids of a plain run of 3.
TEST(SchedulerSpec, DraftsNeverRunPastTheContext) {
  std::unique_ptr<Engine> e = OpenSpec(TinyPreparedDir(), 6, 4);
  ASSERT_NE(e, nullptr);
  const int64_t V = e->config().vocab;
  Spec spec{Prompt(4, 6, V), 3, {}, {}, 0};
  const Solo want = Alone(e.get(), spec);
  spec.max_tokens = 10;
  SchedulerOptions o;
  o.spec = 4;
  o.spec_fixed = true;
  SchedulerStats st;
  const std::vector<Outcome> out =
      ScheduleDrafted(e.get(), {spec}, {FromTruth(want.ids, V, 0)}, o, &st);
  EXPECT_EQ(out[0].result.reason, FinishReason::kContext);
  EXPECT_EQ(out[0].run.ids, want.ids);
  EXPECT_TRUE(SameBits(out[0].run.logits, want.logits));
  EXPECT_EQ(st.spec_drafted, 1);
  EXPECT_EQ(st.spec_accepted, 1);
}

}  // namespace
}  // namespace k3::run
