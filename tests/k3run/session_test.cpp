// engine/session.h: the Session API. Several sequences in one pass give each exactly the bits
// it gets alone; Commit keeps what a step appended; the rules of Step and Commit are enforced.
#include "k3run/engine/session.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "engine_fixture.h"
#include "k3run/engine/generate.h"

namespace k3::run {
namespace {

using testing::TinyPreparedDir;

std::unique_ptr<Engine> OpenTiny(int64_t positions) {
  return testing::OpenPlanned(TinyPreparedDir(), testing::ContextPlan(positions));
}

// Every row's logits of `ids` fed to a fresh sequence in one pass, then `more` one row at a time.
std::vector<float> Alone(Engine* e, const std::vector<int32_t>& ids,
                         const std::vector<int32_t>& more) {
  std::unique_ptr<Sequence> seq = e->NewSequence();
  std::vector<StepInput> in{{seq.get(), ids, Logits::kAll}};
  Result<StepResult> r = e->Step(in);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  std::vector<float> out = r->logits;
  EXPECT_TRUE(e->Commit(seq.get(), static_cast<int64_t>(ids.size())).ok());
  for (int32_t id : more) {
    std::vector<StepInput> one{{seq.get(), {id}, Logits::kLast}};
    Result<StepResult> s = e->Step(one);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    out.insert(out.end(), s->logits.begin(), s->logits.end());
    EXPECT_TRUE(e->Commit(seq.get(), 1).ok());
  }
  return out;
}

bool SameBits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// Three sequences of different lengths share every pass (a prompt chunk beside decode rows of
// others, then decode rows together), and each gets exactly its own run's logits.
TEST(Session, SequencesSharingPassesGetTheBitsOfTheirOwnRuns) {
  std::unique_ptr<Engine> e = OpenTiny(16);
  ASSERT_NE(e, nullptr);
  const int64_t V = e->config().vocab;
  const std::vector<std::vector<int32_t>> prompts = {{3, 7, 11, 5, 9}, {300}, {1000, 42, 8}};
  const std::vector<std::vector<int32_t>> more = {{12, 13}, {14, 15}, {16, 17}};
  std::vector<std::vector<float>> want;
  for (size_t i = 0; i < prompts.size(); ++i) want.push_back(Alone(e.get(), prompts[i], more[i]));

  std::vector<std::unique_ptr<Sequence>> seqs;
  for (size_t i = 0; i < prompts.size(); ++i) seqs.push_back(e->NewSequence());
  std::vector<std::vector<float>> got(prompts.size());
  // Pass 1: sequence 0's prompt alone; pass 2: sequence 1's and 2's prompts beside 0's first
  // decode row; then decode rows of all three (1 and 2 one step behind 0).
  auto step = [&](std::vector<StepInput> in) {
    Result<StepResult> r = e->Step(in);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    for (size_t k = 0; k < in.size(); ++k) {
      size_t i = 0;
      while (seqs[i].get() != in[k].seq) ++i;
      const int64_t rows = in[k].logits == Logits::kAll ? static_cast<int64_t>(in[k].ids.size()) : 1;
      const float* l = r->LogitsOf(k, V);
      got[i].insert(got[i].end(), l, l + rows * V);
      ASSERT_TRUE(e->Commit(in[k].seq, static_cast<int64_t>(in[k].ids.size())).ok());
    }
  };
  step({{seqs[0].get(), prompts[0], Logits::kAll}});
  step({{seqs[1].get(), prompts[1], Logits::kAll},
        {seqs[0].get(), {more[0][0]}, Logits::kLast},
        {seqs[2].get(), prompts[2], Logits::kAll}});
  step({{seqs[2].get(), {more[2][0]}, Logits::kLast},
        {seqs[1].get(), {more[1][0]}, Logits::kLast},
        {seqs[0].get(), {more[0][1]}, Logits::kLast}});
  step({{seqs[1].get(), {more[1][1]}, Logits::kLast},
        {seqs[2].get(), {more[2][1]}, Logits::kLast}});
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size()) << "sequence " << i;
    EXPECT_TRUE(SameBits(got[i].data(), want[i].data(), want[i].size())) << "sequence " << i;
    EXPECT_EQ(seqs[i]->length(), static_cast<int64_t>(prompts[i].size() + more[i].size()));
  }
}

// A pass's split (model.h PassTimes) covers the pass: every part is timed inside Model::Pass,
// which Step times from outside, so the parts add up to at most the step's seconds; the tiny
// model's pass runs attention and routed experts, so those parts are not zero; and the
// engine's running total is the sum of its passes' splits.
TEST(Session, PassSplitAddsUpToAtMostThePassTime) {
  std::unique_ptr<Engine> e = OpenTiny(16);
  ASSERT_NE(e, nullptr);
  std::unique_ptr<Sequence> a = e->NewSequence(), b = e->NewSequence();
  const PassTimes before = e->times();
  PassTimes summed;
  for (int i = 0; i < 3; ++i) {
    std::vector<StepInput> in{{a.get(), {int32_t(3 + i), 7}, Logits::kLast},
                              {b.get(), {int32_t(40 + i)}, Logits::kLast}};
    Result<StepResult> r = e->Step(in);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const PassTimes& t = r->times;
    for (double part : {t.attention, t.experts, t.waits, t.trunk, t.mla}) EXPECT_GE(part, 0);
    EXPECT_GT(t.attention, 0);
    EXPECT_GT(t.experts, 0);
    EXPECT_LE(t.mla, t.attention);
    EXPECT_LE(t.total(), r->seconds * (1 + 1e-9));
    summed += t;
    ASSERT_TRUE(e->Commit(a.get(), 2).ok());
    ASSERT_TRUE(e->Commit(b.get(), 1).ok());
  }
  const PassTimes engine = e->times() - before;
  EXPECT_NEAR(engine.total(), summed.total(), 1e-9);
  EXPECT_NEAR(engine.experts, summed.experts, 1e-9);
}

// Generate on a Session gives the fixture's greedy ids (the path every earlier test pinned).
TEST(Session, GenerateEqualsTheGreedyIdsOfTheEngineFixture) {
  std::unique_ptr<Engine> e = OpenTiny(testing::kPrompt.size() + 5);
  ASSERT_NE(e, nullptr);
  std::unique_ptr<testing::Engine> ram = testing::OpenEngine(TinyPreparedDir());
  std::vector<float> want_logits;
  const std::vector<int32_t> want =
      testing::GenerateLogits(ram.get(), testing::kPrompt, 6, false, &want_logits);
  std::unique_ptr<Sequence> seq = e->NewSequence();
  GenerateOptions g;
  g.prompt = testing::kPrompt;
  g.gen = 6;
  std::vector<float> logits;
  Result<GenerateResult> r = Generate(e.get(), seq.get(), g, [&](const StepRecord&, const float* l) {
    logits.insert(logits.end(), l, l + e->config().vocab);
    return Status::Ok();
  });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->generated, want);
  ASSERT_EQ(logits.size(), want_logits.size());
  EXPECT_TRUE(SameBits(logits.data(), want_logits.data(), logits.size()));
  EXPECT_EQ(seq->length(), static_cast<int64_t>(testing::kPrompt.size()) + 5);
}

TEST(Session, StepAndCommitRulesAreEnforced) {
  std::unique_ptr<Engine> e = OpenTiny(8);
  ASSERT_NE(e, nullptr);
  std::unique_ptr<Sequence> seq = e->NewSequence();
  std::vector<StepInput> in{{seq.get(), {3, 7}, Logits::kLast}};
  ASSERT_TRUE(e->Step(in).ok());
  EXPECT_EQ(seq->pending(), 2);
  EXPECT_EQ(seq->length(), 0);
  Result<StepResult> again = e->Step(in);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("not committed"), std::string::npos);
  EXPECT_FALSE(e->Commit(seq.get(), 3).ok()) << "more rows than the step appended";
  // The tiny model has KDA layers: discarding rows needs records this engine does not keep.
  Status partial = e->Commit(seq.get(), 1);
  ASSERT_FALSE(partial.ok());
  EXPECT_NE(partial.message().find("KDA"), std::string::npos) << partial.message();
  ASSERT_TRUE(e->Commit(seq.get(), 2).ok());
  EXPECT_EQ(seq->tokens(), (std::vector<int32_t>{3, 7}));
  std::vector<StepInput> twice{{seq.get(), {1}, Logits::kLast}, {seq.get(), {2}, Logits::kLast}};
  EXPECT_FALSE(e->Step(twice).ok()) << "a sequence given twice in one pass";
  std::vector<StepInput> empty{{seq.get(), {}, Logits::kLast}};
  EXPECT_FALSE(e->Step(empty).ok());
  // Past the sequence's capacity: refused before anything changes.
  std::vector<StepInput> full{{seq.get(), {1, 2, 3, 4, 5, 6, 7}, Logits::kLast}};
  Result<StepResult> over = e->Step(full);
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.status().message().find("MLA KV cache full"), std::string::npos);
  EXPECT_EQ(seq->length(), 2);
}

// Sampling sequences keep their own RNG: sharing passes never changes what a seed samples.
TEST(Session, SamplingSequencesSharingPassesSampleAsAlone) {
  std::unique_ptr<Engine> e = OpenTiny(12);
  ASSERT_NE(e, nullptr);
  SamplerOptions so;
  so.temperature = 1.5;
  const int64_t V = e->config().vocab;
  auto run = [&](bool shared) {
    std::vector<std::unique_ptr<Sequence>> s;
    s.push_back(e->NewSequence(so, 99, 1));
    s.push_back(e->NewSequence(so, 99, 2));
    std::vector<std::vector<int32_t>> ids = {{3, 7, 11}, {3, 7, 11}};
    std::vector<int32_t> next = {0, 0};
    for (int step = 0; step < 4; ++step) {
      std::vector<StepInput> in;
      for (size_t i = 0; i < 2; ++i) {
        in.push_back({s[i].get(), step == 0 ? ids[i] : std::vector<int32_t>{next[i]},
                      Logits::kLast});
      }
      auto take = [&](std::vector<StepInput> batch, size_t first) {
        Result<StepResult> r = e->Step(batch);
        EXPECT_TRUE(r.ok()) << r.status().ToString();
        for (size_t k = 0; k < batch.size(); ++k) {
          next[first + k] = batch[k].seq->sampler().Next(r->LogitsOf(k, V), V);
          ids[first + k].push_back(next[first + k]);
          EXPECT_TRUE(e->Commit(batch[k].seq, static_cast<int64_t>(batch[k].ids.size())).ok());
        }
      };
      if (shared) {
        take(in, 0);
      } else {
        take({in[0]}, 0);
        take({in[1]}, 1);
      }
    }
    return ids;
  };
  const auto alone = run(false);
  EXPECT_EQ(run(true), alone);
  EXPECT_NE(alone[0], alone[1]) << "the two streams should differ (else the test shows nothing)";
}

// docs/DESIGN-NOTES.md's example, verbatim (keep the two in step).
// Greedy continuation of "Hello" with a 2 GB total budget, one pass per token.
Result<std::string> Continue(const std::string& prepared_dir) {
  K3_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Open(Env::Default(), prepared_dir));
  const tok::Tokenizer* tokenizer = engine->tokenizer();
  if (tokenizer == nullptr) return Status::Invalid(prepared_dir + " has no tokenizer");
  PlanOptions plan;
  plan.positions = 64;        // the sequence's context
  plan.pass_rows = 64;        // the longest pass (the prompt)
  plan.budget.budget_gb = 2;  // stream within 2 GB; omit to hold every weight in RAM
  K3_RETURN_IF_ERROR(engine->Plan(plan));
  K3_RETURN_IF_ERROR(engine->LoadWeights());
  std::unique_ptr<Sequence> seq = engine->NewSequence();  // greedy: default SamplerOptions
  StepInput in{seq.get(), tokenizer->Encode("Hello", /*allow_special=*/false), Logits::kLast};
  std::string text;
  for (int i = 0; i < 8; ++i) {
    K3_ASSIGN_OR_RETURN(StepResult pass, engine->Step(std::span<StepInput>(&in, 1)));
    K3_RETURN_IF_ERROR(engine->Commit(seq.get(), static_cast<int64_t>(in.ids.size())));
    const int32_t next = Greedy(pass.LogitsOf(0, engine->config().vocab), engine->config().vocab);
    text += tokenizer->TokenBytes(next);
    in.ids = {next};  // the next pass feeds the chosen token
  }
  return text;
}

// A source that serves RamWeights' weights, logs the experts asked for, and fails one.
class OneExpertFails final : public WeightSource {
 public:
  explicit OneExpertFails(WeightSource* inner) : inner_(inner) {}
  std::set<std::pair<int, int>> asked;
  std::pair<int, int> failing{-1, -1};

  std::function<void(int)> on_layer;  // before each Layer(l) is served

  Result<const ops::LayerWeights*> Layer(int l) override {
    if (on_layer) on_layer(l);
    return inner_->Layer(l);
  }
  void ReleaseLayer(int l) override { inner_->ReleaseLayer(l); }
  const ops::GluWeights* Expert(int l, int e) override {
    asked.insert({l, e});
    if (std::make_pair(l, e) == failing) {
      failures_.push_back(ExpertFailure{l, e, "injected"});
      return nullptr;
    }
    return inner_->Expert(l, e);
  }
  void ReleaseExperts(int l) override { inner_->ReleaseExperts(l); }
  Status EmbeddingRows(const int32_t* ids, int64_t n, float* out) override {
    return inner_->EmbeddingRows(ids, n, out);
  }
  int64_t LmHeadChunkRows() const override { return inner_->LmHeadChunkRows(); }
  Result<kernels::Matrix> LmHeadRows(int64_t b, int64_t n) override {
    return inner_->LmHeadRows(b, n);
  }
  Result<const HeadWeights*> Head() override { return inner_->Head(); }
  ReadCounters Counters() const override { return inner_->Counters(); }
  const std::vector<ExpertFailure>& Failures() const override { return failures_; }
  uint64_t PlannedResidentBytes() const override { return inner_->PlannedResidentBytes(); }

 private:
  WeightSource* inner_;
  std::vector<ExpertFailure> failures_;
};

// An expert that cannot be read makes RUN INVALID exactly the sequences whose rows it was
// routed to; a sequence beside them in the same pass keeps its own bits and stays valid.
TEST(Session, ExpertFailureMarksOnlyTheSequencesRoutedToIt) {
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), TinyPreparedDir());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  Result<std::unique_ptr<RamWeights>> ram = RamWeights::Open(Env::Default(), &*p);
  ASSERT_TRUE(ram.ok()) << ram.status().ToString();
  OneExpertFails source(ram->get());
  std::unique_ptr<Engine> e = Engine::WithSource(p->manifest.config, &source, 0, 8);
  const int64_t V = e->config().vocab;
  // Which experts each one-token sequence uses alone.
  auto alone = [&](int32_t id, std::vector<float>* logits) {
    source.asked.clear();
    std::unique_ptr<Sequence> s = e->NewSequence();
    std::vector<StepInput> in{{s.get(), {id}, Logits::kLast}};
    Result<StepResult> r = e->Step(in);
    EXPECT_TRUE(r.ok());
    if (logits && r.ok()) *logits = r->logits;
    return source.asked;
  };
  std::vector<float> b_alone;
  const std::set<std::pair<int, int>> a_uses = alone(3, nullptr), b_uses = alone(700, &b_alone);
  for (const auto& x : a_uses) {
    if (!b_uses.count(x)) source.failing = x;
  }
  ASSERT_NE(source.failing.first, -1) << "every expert of A is also one of B's";
  std::unique_ptr<Sequence> a = e->NewSequence(), b = e->NewSequence();
  std::vector<StepInput> both{{a.get(), {3}, Logits::kLast}, {b.get(), {700}, Logits::kLast}};
  Result<StepResult> r = e->Step(both);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(a->invalid());
  EXPECT_FALSE(b->invalid());
  EXPECT_TRUE(SameBits(r->LogitsOf(1, V), b_alone.data(), static_cast<size_t>(V)));
  ASSERT_TRUE(e->Commit(a.get(), 1).ok());
  a->Reset();
  EXPECT_FALSE(a->invalid());
}

// Shutdown: Interrupt() during a pass stops it before its next layer (no later layer is read)
// with kIo "interrupted", and every later Step is refused.
TEST(Session, InterruptStopsThePassInFlightAtTheNextLayerAndRefusesLaterSteps) {
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), TinyPreparedDir());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  Result<std::unique_ptr<RamWeights>> ram = RamWeights::Open(Env::Default(), &*p);
  ASSERT_TRUE(ram.ok()) << ram.status().ToString();
  OneExpertFails source(ram->get());  // fails no expert: `failing` stays unset
  std::unique_ptr<Engine> e = Engine::WithSource(p->manifest.config, &source, 0, 8);
  ASSERT_GE(p->manifest.config.n_layers, 3);
  std::vector<int> layers;
  source.on_layer = [&](int l) {
    layers.push_back(l);
    if (l == 1) e->Interrupt();  // from "another thread": only an atomic store
  };
  std::unique_ptr<Sequence> s = e->NewSequence();
  std::vector<StepInput> in{{s.get(), {3, 5, 7}, Logits::kLast}};
  Result<StepResult> r = e->Step(in);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kIo);
  EXPECT_NE(r.status().message().find("interrupted: the pass stopped before layer 2"),
            std::string::npos)
      << r.status().ToString();
  EXPECT_EQ(layers, (std::vector<int>{0, 1}));
  s->Reset();
  r = e->Step(in);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("shutting down"), std::string::npos)
      << r.status().ToString();
  EXPECT_EQ(layers.size(), 2u);  // the refused step read nothing
}

// The same from another thread during a streamed pass (reads in flight, a ring of trunk layers
// and the expert cache busy): Step fails with "interrupted", and the engine then closes
// without hanging. Whether the interrupt lands before the pass starts or in it, the pass of
// 400 rows on the small model (seconds on 2 cores) is never finished.
TEST(Session, InterruptDuringAStreamedPassLeavesTheEngineSafeToClose) {
  PlanOptions po = testing::ContextPlan(400);
  po.budget.trunk_gb = 0.03;
  po.budget.cache_gb = 0.02;
  std::unique_ptr<Engine> e = testing::OpenPlanned(testing::SmallPreparedDir(), po);
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(e->streaming_plan().has_value());
  std::unique_ptr<Sequence> s = e->NewSequence();
  std::vector<StepInput> in{{s.get(), {}, Logits::kLast}};
  for (int32_t i = 0; i < 400; ++i) in[0].ids.push_back((i * 7919) % 4000 + 1);
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    e->Interrupt();
  });
  Result<StepResult> r = e->Step(in);
  stopper.join();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kIo);
  EXPECT_NE(r.status().message().find("interrupted"), std::string::npos) << r.status().ToString();
  s.reset();
  e.reset();  // joins the reader threads: must not hang
}

// --max-seqs from the plan (PlanOptions::sequences = 0): as many sequences as the memory holds
// beside the weights and one row of scratch, at most kDefaultMaxSeqs.
TEST(Session, SequencesZeroTakesWhatTheMemoryHolds) {
  auto plan = [](int64_t sequences, uint64_t avail) -> std::optional<MemoryPlan> {
    Result<std::unique_ptr<Engine>> e = Engine::Open(Env::Default(), TinyPreparedDir());
    EXPECT_TRUE(e.ok());
    PlanOptions po;
    po.positions = 64;
    po.pass_rows = 1;
    po.sequences = sequences;
    po.mem_available = [avail]() -> Result<uint64_t> { return avail; };
    if (!(*e)->Plan(po).ok()) return std::nullopt;
    return (*e)->memory_plan();
  };
  const std::optional<MemoryPlan> one = plan(1, uint64_t{1} << 40);
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->sequences, 1);
  const uint64_t per_seq = one->kv_cache_bytes + one->state_bytes;
  const std::optional<MemoryPlan> ample = plan(0, uint64_t{1} << 40);
  ASSERT_TRUE(ample.has_value());
  EXPECT_EQ(ample->sequences, kDefaultMaxSeqs);
  EXPECT_EQ(ample->state_bytes, uint64_t(kDefaultMaxSeqs) * one->state_bytes);
  const std::optional<MemoryPlan> three = plan(0, one->total() + 5 * per_seq / 2);
  ASSERT_TRUE(three.has_value());
  EXPECT_EQ(three->sequences, 3);
  EXPECT_LE(three->total(), one->total() + 5 * per_seq / 2);
  // Asking for more than fits is refused, naming the sequences.
  EXPECT_FALSE(plan(4, one->total() + 5 * per_seq / 2).has_value());
}

TEST(Session, DocumentedExample) {
  Result<std::string> text = Continue(TinyPreparedDir());
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  // The same ids through Generate: 8 greedy tokens after "Hello".
  std::unique_ptr<Engine> e = OpenTiny(64);
  ASSERT_NE(e, nullptr);
  std::unique_ptr<Sequence> seq = e->NewSequence();
  GenerateOptions g;
  g.prompt = e->tokenizer()->Encode("Hello", false);
  g.gen = 8;
  Result<GenerateResult> r = Generate(e.get(), seq.get(), g, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*text, e->tokenizer()->Decode(r->generated));
}

}  // namespace
}  // namespace k3::run
