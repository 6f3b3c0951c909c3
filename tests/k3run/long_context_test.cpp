// Long contexts (DESIGN.md §11.2–§11.3) through the Session API: chunked prefill gives the bits
// of every other chunk size, a saved and loaded sequence continues with the bits of never having
// stopped, loading refuses what does not belong to this engine, and a TOTAL budget pays for the
// caches, states and scratch.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "engine_fixture.h"
#include "k3run/app/prefill_progress.h"
#include "k3run/engine/generate.h"
#include "k3run/engine/session.h"
#include "tests/support/temp_dir.h"

namespace k3::run {
namespace {

using testing::SmallPreparedDir;
using testing::TinyPreparedDir;

using testing::OpenPlanned;

PlanOptions Context(int64_t positions, int64_t chunk = 0, int layers = 0) {
  PlanOptions po = testing::ContextPlan(positions);
  po.chunk = chunk;
  po.layers = layers;
  return po;
}

// A prompt of n ids < 1280 (the tiny vocab) that is not periodic.
std::vector<int32_t> LongPrompt(int64_t n) {
  std::vector<int32_t> p;
  uint32_t x = 12345;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    p.push_back(static_cast<int32_t>((x >> 8) % 1280));
  }
  return p;
}

// Every step's logits of greedy generation on a fresh (or the given) sequence.
std::vector<float> GreedyLogits(Engine* e, Sequence* seq, const std::vector<int32_t>& prompt, int64_t gen,
                       std::vector<int32_t>* ids = nullptr) {
  const int64_t V = e->config().vocab;
  std::vector<float> logits;
  GenerateOptions g;
  g.prompt = prompt;
  g.gen = gen;
  Result<GenerateResult> r = Generate(e, seq, g, [&](const StepRecord&, const float* l) {
    logits.insert(logits.end(), l, l + V);
    return Status::Ok();
  });
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (ids && r.ok()) *ids = r->generated;
  return logits;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(LongContext, ChunkSizesGiveTheSameBits) {
  const std::vector<int32_t> prompt = LongPrompt(150);
  std::vector<float> want;
  std::vector<int32_t> want_ids;
  for (int64_t chunk : {int64_t{150}, int64_t{64}, int64_t{7}, int64_t{1}}) {
    std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), Context(160, chunk));
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->chunk(), chunk);
    std::unique_ptr<Sequence> seq = e->NewSequence();
    std::vector<int32_t> ids;
    const std::vector<float> got = GreedyLogits(e.get(), seq.get(), prompt, 6, &ids);
    if (want.empty()) {
      want = got;
      want_ids = ids;
      continue;
    }
    EXPECT_TRUE(SameBits(got, want)) << "chunk " << chunk;
    EXPECT_EQ(ids, want_ids) << "chunk " << chunk;
  }
}

// The small preset's 93 layers (MLA every fourth) and top-8 MoE, chunks of 5 against one pass.
TEST(LongContext, ChunkedPrefillOnTheSmallPresetGivesTheSameBits) {
  const std::vector<int32_t> prompt = LongPrompt(23);
  std::unique_ptr<Engine> whole = OpenPlanned(SmallPreparedDir(), Context(32, 23));
  std::unique_ptr<Engine> chunked = OpenPlanned(SmallPreparedDir(), Context(32, 5));
  ASSERT_NE(whole, nullptr);
  ASSERT_NE(chunked, nullptr);
  std::unique_ptr<Sequence> a = whole->NewSequence(), b = chunked->NewSequence();
  EXPECT_TRUE(SameBits(GreedyLogits(whole.get(), a.get(), prompt, 3), GreedyLogits(chunked.get(), b.get(), prompt, 3)));
}

TEST(LongContext, FeedEmitsProgressPerPassAndRefusesWhatDoesNotFit) {
  std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), Context(40, 16));
  ASSERT_NE(e, nullptr);
  std::vector<std::pair<int64_t, int64_t>> events;
  e->SetEventSink([&](const EngineEvent& ev) {
    if (ev.kind == EngineEvent::Kind::kPrefill) events.emplace_back(ev.done, ev.total);
  });
  std::unique_ptr<Sequence> seq = e->NewSequence();
  ASSERT_TRUE(e->Feed(seq.get(), LongPrompt(35)).ok());
  EXPECT_EQ(events, (std::vector<std::pair<int64_t, int64_t>>{{16, 35}, {32, 35}, {35, 35}}));
  EXPECT_EQ(seq->length(), 35);
  const Result<StepResult> r = e->Feed(seq.get(), LongPrompt(6));
  ASSERT_EQ(r.status().code(), Code::kInvalid);
  EXPECT_NE(r.status().message().find("holds 35 of its 40 positions; 6 more do not fit"),
            std::string::npos)
      << r.status().message();
  EXPECT_EQ(seq->length(), 35);
}

// Save after N generated tokens, load into another engine, feed the last token: the logits are
// those of one run that never stopped.
TEST(LongContext, SaveLoadContinueEqualsNeverStopping) {
  test::TempDir tmp;
  const std::string path = tmp.Join("s.k3state");
  const std::vector<int32_t> prompt = LongPrompt(20);
  const int64_t V = 1280;
  std::vector<int32_t> all_ids;
  std::vector<float> all;
  {
    std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), Context(40, 8));
    std::unique_ptr<Sequence> seq = e->NewSequence();
    all = GreedyLogits(e.get(), seq.get(), prompt, 9, &all_ids);
  }
  std::vector<int32_t> first_ids;
  {
    std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), Context(40, 3));
    std::unique_ptr<Sequence> seq = e->NewSequence();
    GreedyLogits(e.get(), seq.get(), prompt, 5, &first_ids);
    ASSERT_TRUE(e->SaveSequence(*seq, path).ok());
  }
  ASSERT_EQ(first_ids, std::vector<int32_t>(all_ids.begin(), all_ids.begin() + 5));
  std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), Context(40));
  std::unique_ptr<Sequence> seq = e->NewSequence();
  ASSERT_TRUE(e->LoadSequence(path, seq.get()).ok());
  EXPECT_EQ(seq->length(), 20 + 4);  // the prompt and the generated tokens fed back
  std::vector<int32_t> rest_ids;
  const std::vector<float> rest = GreedyLogits(e.get(), seq.get(), {first_ids.back()}, 4, &rest_ids);
  EXPECT_EQ(rest_ids, std::vector<int32_t>(all_ids.begin() + 5, all_ids.end()));
  EXPECT_TRUE(SameBits(rest, std::vector<float>(all.begin() + 5 * V, all.end())));
}

TEST(LongContext, LoadRefusesAnotherLayersCountAModelAndTooSmallAContext) {
  test::TempDir tmp;
  const std::string path = tmp.Join("s.k3state");
  {
    std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), Context(40));
    std::unique_ptr<Sequence> seq = e->NewSequence();
    GreedyLogits(e.get(), seq.get(), LongPrompt(30), 1);
    ASSERT_TRUE(e->SaveSequence(*seq, path).ok());
  }
  auto load = [&](const std::string& dir, PlanOptions po) {
    std::unique_ptr<Engine> e = OpenPlanned(dir, po);
    std::unique_ptr<Sequence> seq = e->NewSequence();
    const Status s = e->LoadSequence(path, seq.get());
    EXPECT_EQ(seq->length(), 0);
    return s;
  };
  const Status layers = load(TinyPreparedDir(), Context(40, 0, 4));
  EXPECT_EQ(layers.code(), Code::kInvalid);
  EXPECT_NE(layers.message().find("saved with --layers 13, this run has 4"), std::string::npos)
      << layers.message();
  const Status small = load(TinyPreparedDir(), Context(20));
  EXPECT_EQ(small.code(), Code::kInvalid);
  EXPECT_NE(small.message().find("holds 30 positions, more than the 20"), std::string::npos)
      << small.message();
  const Status model = load(SmallPreparedDir(), Context(40));
  EXPECT_EQ(model.code(), Code::kInvalid);
  EXPECT_NE(model.message().find("another prepared directory"), std::string::npos)
      << model.message();
}

// A total budget pays for everything: the plan's total stays inside it, and what the caches,
// states and scratch take is what the weights do not get.
TEST(LongContext, TotalBudgetCoversCachesStatesAndScratch) {
  auto plan = [](int64_t positions, double gb) {
    PlanOptions po = Context(positions);
    po.budget.budget_gb = gb;
    Result<std::unique_ptr<Engine>> e = Engine::Open(Env::Default(), TinyPreparedDir());
    EXPECT_TRUE(e.ok());
    const Status s = (*e)->Plan(po);
    return std::make_pair(s, s.ok() ? (*e)->memory_plan() : MemoryPlan{});
  };
  const auto [ok, all] = plan(1000, 1.0);  // every weight fits
  ASSERT_TRUE(ok.ok()) << ok.ToString();
  EXPECT_EQ(all.budget, 1'000'000'000u);
  const uint64_t reserved = all.kv_cache_bytes + all.state_bytes + all.scratch_bytes;
  EXPECT_EQ(all.kv_cache_bytes, 4u * 1000u * 160u);  // 4 MLA layers × (32 + 8) floats
  // A budget 1.5 MB above the reserved part: the weights get at most that.
  const auto [ok2, tight] = plan(1000, double(reserved + 1'500'000) / 1e9);
  ASSERT_TRUE(ok2.ok()) << ok2.ToString();
  EXPECT_LE(tight.total(), tight.budget);
  EXPECT_LE(tight.weights_bytes, 1'500'000u);
  EXPECT_LT(tight.weights_bytes, all.weights_bytes);
  const auto [refused, unused] = plan(1000000, 0.05);
  EXPECT_EQ(refused.code(), Code::kInvalid);
  EXPECT_NE(refused.message().find("--ctx"), std::string::npos) << refused.message();
}

TEST(PrefillProgress, LinesFollowTheProgressModes) {
  EXPECT_EQ(PrefillLine(1024, 4096, 8.0), "prefill 1024/4096 tokens (25%), 128.0 tok/s, ETA 24s");
  EXPECT_EQ(PrefillLine(4096, 4096, 32.0), "prefill 4096/4096 tokens (100%), 128.0 tok/s, took 32s");
  std::string out;
  auto sink = [&out](std::string_view s) { out += s; };
  PrefillProgress bar(ProgressMode::kBar, 16, sink);
  bar.Update(16, 48, 1.0);
  bar.Update(32, 48, 1.05);  // within 0.1 s of the last redraw: skipped
  bar.Update(48, 48, 2.0);   // the last one always
  EXPECT_EQ(out, "\r\x1b[K" + PrefillLine(16, 48, 1.0) + "\r\x1b[K" + PrefillLine(48, 48, 2.0) +
                     "\n");
  out.clear();
  PrefillProgress plain(ProgressMode::kPlain, 16, sink);
  plain.Update(16, 48, 1.0);
  plain.Update(32, 48, 20.0);  // within 30 s of the last line: skipped
  plain.Update(48, 48, 40.0);
  EXPECT_EQ(out, PrefillLine(16, 48, 1.0) + "\n" + PrefillLine(48, 48, 40.0) + "\n");
  out.clear();
  PrefillProgress one_pass(ProgressMode::kPlain, 64, sink);
  one_pass.Update(48, 48, 1.0);  // a prompt of one pass shows nothing
  PrefillProgress none(ProgressMode::kNone, 16, sink);
  none.Update(48, 48, 1.0);
  EXPECT_EQ(out, "");
}

}  // namespace
}  // namespace k3::run
