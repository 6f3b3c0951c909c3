// Exact speculative decoding (DESIGN.md §11.4): prompt-lookup drafts, the adaptive draft length,
// rollback through Commit at every kept length, and `--spec 1..8` giving the ids and logits bits
// of plain greedy decoding on the tiny and small models.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <set>
#include <utility>
#include <vector>

#include "engine_fixture.h"
#include "k3run/engine/generate.h"
#include "k3run/engine/session.h"
#include "k3run/engine/speculation.h"

namespace k3::run {
namespace {

using testing::SmallPreparedDir;
using testing::TinyPreparedDir;

std::unique_ptr<Engine> OpenPlanned(const std::string& dir, int64_t positions, int64_t spec) {
  PlanOptions po = testing::ContextPlan(positions);
  po.spec_rows = spec;
  return testing::OpenPlanned(dir, po);
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Ids < vocab from a simple generator (drafts rarely hit).
std::vector<int32_t> RandomIds(int64_t n, uint32_t seed, int32_t vocab) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) {
    seed = seed * 1103515245u + 12345u;
    p.push_back(static_cast<int32_t>((seed >> 8) % static_cast<uint32_t>(vocab)));
  }
  return p;
}

// A passage repeated: the model's continuation often follows it, so drafts hit.
std::vector<int32_t> RepeatedIds(int64_t period, int64_t times, int32_t vocab) {
  const std::vector<int32_t> once = RandomIds(period, 777, vocab);
  std::vector<int32_t> p;
  for (int64_t t = 0; t < times; ++t) p.insert(p.end(), once.begin(), once.end());
  return p;
}

struct GreedyRun {
  std::vector<int32_t> ids;
  std::vector<float> logits;  // every step's, in order
  SpecStats spec;
  std::set<std::pair<int64_t, int64_t>> verified;  // (drafted, accepted) of each verifying pass
};

// Drafts from a known continuation `truth`, with the tokens where `wrong(g, j)` holds replaced:
// every kept length from 0 to the whole draft occurs (synthetic weights never repeat text, so a
// lookup alone rarely drafts anything on them).
using Drafter = std::function<std::vector<int32_t>(std::span<const int32_t>, int64_t, int64_t)>;
Drafter Oracle(std::vector<int32_t> truth, int32_t vocab, uint32_t salt) {
  return [truth, vocab, salt](std::span<const int32_t>, int64_t g, int64_t n) {
    std::vector<int32_t> d;
    for (int64_t j = g; j < g + n && j < static_cast<int64_t>(truth.size()); ++j) {
      const uint32_t h = static_cast<uint32_t>(j * 2654435761u) ^ salt;
      const bool wrong = salt % 3 != 0 && (h >> 7) % 4 == 0;  // a third of the salts: all right
      d.push_back(wrong ? (truth[static_cast<size_t>(j)] + 1) % vocab : truth[static_cast<size_t>(j)]);
    }
    return d;
  };
}

GreedyRun Greedy(Engine* e, const std::vector<int32_t>& prompt, int64_t gen, int64_t spec,
                 const SamplerOptions& sampling = {}, bool fixed = true,
                 Drafter drafter = nullptr) {
  const int64_t V = e->config().vocab;
  GreedyRun run;
  std::unique_ptr<Sequence> seq = e->NewSequence(sampling);
  GenerateOptions g;
  g.prompt = prompt;
  g.gen = gen;
  g.spec = spec;
  g.spec_fixed = fixed;
  g.drafter = std::move(drafter);
  Result<GenerateResult> r = Generate(e, seq.get(), g, [&](const StepRecord& s, const float* l) {
    if (s.drafted > 0) run.verified.insert({s.drafted, s.accepted});
    run.logits.insert(run.logits.end(), l, l + V);
    return Status::Ok();
  });
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return run;
  run.ids = r->generated;
  run.spec = r->spec;
  // The sequence holds the prompt and every generated token but the last, as plain decoding.
  EXPECT_EQ(seq->length(), static_cast<int64_t>(prompt.size() + run.ids.size()) - 1);
  return run;
}

TEST(PromptLookup, LongestSuffixAtItsMostRecentOccurrence) {
  // Suffix "7 8" occurs at 1 and 5; the most recent earlier one (5) is followed by 4 5 7 8.
  const std::vector<int32_t> t = {1, 7, 8, 2, 3, 7, 8, 4, 5, 7, 8};
  EXPECT_EQ(PromptLookupDraft(t, 3), (std::vector<int32_t>{4, 5, 7}));
  EXPECT_EQ(PromptLookupDraft(t, 10), (std::vector<int32_t>{4, 5, 7, 8}));
  // The longer suffix "3 7 8" wins over the more recent "7 8".
  const std::vector<int32_t> u = {3, 7, 8, 9, 9, 1, 7, 8, 6, 3, 7, 8};
  EXPECT_EQ(PromptLookupDraft(u, 2), (std::vector<int32_t>{9, 9}));
  // A one-token match is not enough; nothing recurs; no draft wanted.
  EXPECT_TRUE(PromptLookupDraft(std::vector<int32_t>{5, 1, 2, 5}, 4).empty());
  EXPECT_TRUE(PromptLookupDraft(std::vector<int32_t>{1, 2, 3, 4}, 4).empty());
  EXPECT_TRUE(PromptLookupDraft(t, 0).empty());
  // A period-1 run drafts into itself.
  EXPECT_EQ(PromptLookupDraft(std::vector<int32_t>{4, 4, 4}, 5), (std::vector<int32_t>{4}));
}

TEST(DraftPolicy, FollowsAcceptanceAndTheCostOfARow) {
  PassCost cost;
  cost.trunk_bytes = 100e6;
  cost.expert_bytes = 1e6;
  cost.experts = 256;
  cost.topk = 16;
  EXPECT_NEAR(cost.DistinctExperts(1), 16.0, 1e-9);
  EXPECT_NEAR(cost.DistinctExperts(5), 256.0 * (1 - std::pow(240.0 / 256.0, 5)), 1e-9);
  DraftPolicy high(8, cost);
  for (int i = 0; i < 20; ++i) high.Record(8, 8);
  EXPECT_GT(high.acceptance(), 0.9);
  EXPECT_GE(high.Length(), 6);  // the trunk dominates: long drafts pay
  DraftPolicy low(8, cost);
  for (int i = 0; i < 20; ++i) low.Record(4, 0);
  EXPECT_LT(low.acceptance(), 0.1);
  int probes = 0;
  for (int i = 0; i < 4 * kProbeEvery; ++i) {
    const int64_t n = low.Length();
    EXPECT_LE(n, 1);
    probes += n == 1 ? 1 : 0;
  }
  EXPECT_EQ(probes, 4);  // one draft token every kProbeEvery passes, no more
  // Experts that dominate make an extra row dear: the same acceptance drafts less.
  PassCost experts_heavy = cost;
  experts_heavy.trunk_bytes = 0;
  DraftPolicy dear(8, experts_heavy), cheap(8, cost);
  for (int i = 0; i < 20; ++i) {
    dear.Record(4, 3);
    cheap.Record(4, 3);
  }
  EXPECT_LT(dear.Length(), cheap.Length());
}

// Timed passes replace the byte model's cost of an extra row: where experts dominate, the model
// says a draft never pays; passes that took little longer per row (the expert cache's hits, the
// work that does not grow with rows) make long drafts pay, and dear ones keep them off.
TEST(DraftPolicy, TimedPassesReplaceTheByteModelsCostOfARow) {
  PassCost experts_heavy;
  experts_heavy.expert_bytes = 1e6;
  experts_heavy.experts = 256;
  experts_heavy.topk = 16;
  auto policy = [&] {
    DraftPolicy p(8, experts_heavy);
    for (int i = 0; i < 30; ++i) p.Record(4, 2);  // p → 2/3
    return p;
  };
  DraftPolicy untimed = policy();
  EXPECT_NEAR(untimed.RelativeCost(5), experts_heavy.DistinctExperts(5) / 16.0, 1e-9);
  EXPECT_EQ(untimed.Length(), 0);

  DraftPolicy cheap = policy();
  for (int i = 0; i < 4; ++i) cheap.Observe(1, 1.0);
  cheap.Observe(2, 1.1);
  EXPECT_NEAR(cheap.RelativeCost(2), 1.1, 1e-9);  // timed: the measured ratio
  // Not timed: the model's extra cost scaled by measured ÷ modelled at 2 rows.
  const double q = 0.1 / (experts_heavy.DistinctExperts(2) / 16.0 - 1.0);
  EXPECT_NEAR(cheap.RelativeCost(5), 1.0 + q * (experts_heavy.DistinctExperts(5) / 16.0 - 1.0),
              1e-9);
  EXPECT_GE(cheap.Length(), 3);

  DraftPolicy dear = policy();
  dear.Observe(1, 1.0);
  dear.Observe(2, 3.0);
  EXPECT_EQ(dear.Length(), 0);
  // Probes kept whole come twice as long and twice as soon: with a 2-row pass timed at 1.8
  // one-row passes, drafting pays once p > 0.8; probes of 1 (pass 16) and 2 (pass 24) tokens
  // get there, and the policy drafts at pass 25 (one-token probes every 16 passes: pass 49).
  DraftPolicy learning(4, experts_heavy);
  learning.Observe(1, 1.0);
  learning.Observe(2, 1.8);
  std::vector<std::pair<int, int64_t>> drafts;  // (pass, length)
  for (int pass = 1; pass <= 40 && drafts.size() < 3; ++pass) {
    const int64_t n = learning.Length();
    if (n == 0) continue;
    drafts.emplace_back(pass, n);
    learning.Record(n, n);
  }
  ASSERT_EQ(drafts.size(), 3u);
  EXPECT_EQ(drafts[0], std::make_pair(16, int64_t{1}));
  EXPECT_EQ(drafts[1], std::make_pair(24, int64_t{2}));
  EXPECT_EQ(drafts[2].first, 25);
  // A refused probe starts over: one token, kProbeEvery passes later.
  DraftPolicy refused(4, experts_heavy);
  refused.Observe(1, 1.0);
  refused.Observe(2, 1.8);
  for (int pass = 1; pass <= kProbeEvery; ++pass) {
    const int64_t n = refused.Length();
    if (n > 0) refused.Record(n, 0);
  }
  int next = 0;
  for (int pass = 1; pass <= kProbeEvery && next == 0; ++pass) {
    const int64_t n = refused.Length();
    if (n > 0) {
      EXPECT_EQ(n, 1);
      next = pass;
    }
  }
  EXPECT_EQ(next, kProbeEvery);

  // Ignored: row counts past max_draft + 1, non-positive times.
  dear.Observe(10, 0.5);
  dear.Observe(2, 0.0);
  EXPECT_NEAR(dear.RelativeCost(2), 3.0, 1e-9);
}

// Rollback at every kept length, 0 (drop the whole pass) to all: the sequence then continues
// with the bits of a sequence fed only the kept rows.
TEST(SpecRollback, CommitKeepsExactlyTheFirstRowsAtEveryLength) {
  const int64_t k = 5;
  std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), 64, k);
  ASSERT_NE(e, nullptr);
  const int64_t V = e->config().vocab;
  const std::vector<int32_t> prompt = RandomIds(9, 3, static_cast<int32_t>(V));
  const std::vector<int32_t> rows = RandomIds(k + 1, 4, static_cast<int32_t>(V));
  const std::vector<int32_t> after = RandomIds(3, 5, static_cast<int32_t>(V));
  for (int64_t keep = 0; keep <= k + 1; ++keep) {
    std::unique_ptr<Sequence> spec = e->NewSequence(), plain = e->NewSequence();
    ASSERT_TRUE(e->Feed(spec.get(), prompt, Logits::kNone).ok());
    ASSERT_TRUE(e->Feed(plain.get(), prompt, Logits::kNone).ok());
    StepInput in{spec.get(), rows, Logits::kAll, true};
    Result<StepResult> tentative = e->Step(std::span<StepInput>(&in, 1));
    ASSERT_TRUE(tentative.ok()) << tentative.status().ToString();
    ASSERT_TRUE(e->Commit(spec.get(), keep).ok());
    ASSERT_EQ(spec->length(), static_cast<int64_t>(prompt.size()) + keep);
    std::vector<int32_t> kept(rows.begin(), rows.begin() + keep);
    kept.insert(kept.end(), after.begin(), after.end());
    // The plain sequence: the kept rows and what follows, one row per pass.
    std::vector<float> want, got;
    for (size_t i = 0; i < kept.size(); ++i) {
      StepInput p{plain.get(), {kept[i]}, Logits::kLast};
      Result<StepResult> r = e->Step(std::span<StepInput>(&p, 1));
      ASSERT_TRUE(r.ok());
      ASSERT_TRUE(e->Commit(plain.get(), 1).ok());
      // The tentative pass's row i is the plain pass's logits for the rows it kept.
      if (static_cast<int64_t>(i) < keep) {
        EXPECT_EQ(std::memcmp(tentative->LogitsOf(0, V) + i * V, r->LogitsOf(0, V),
                              sizeof(float) * V), 0)
            << "row " << i << " keeping " << keep;
      } else {
        want.insert(want.end(), r->LogitsOf(0, V), r->LogitsOf(0, V) + V);
      }
    }
    for (int32_t id : after) {
      StepInput s{spec.get(), {id}, Logits::kLast};
      Result<StepResult> r = e->Step(std::span<StepInput>(&s, 1));
      ASSERT_TRUE(r.ok());
      ASSERT_TRUE(e->Commit(spec.get(), 1).ok());
      got.insert(got.end(), r->LogitsOf(0, V), r->LogitsOf(0, V) + V);
    }
    EXPECT_TRUE(SameBits(got, want)) << "continuing after keeping " << keep << " of " << k + 1;
    EXPECT_EQ(spec->tokens(), plain->tokens());
  }
}

TEST(SpecRollback, OnlyTentativeRowsCanBeDroppedAndThePlanBoundsThem) {
  std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), 32, 2);
  ASSERT_NE(e, nullptr);
  std::unique_ptr<Sequence> seq = e->NewSequence();
  StepInput plain{seq.get(), {1, 2, 3}, Logits::kLast};
  ASSERT_TRUE(e->Step(std::span<StepInput>(&plain, 1)).ok());
  const Status partial = e->Commit(seq.get(), 1);
  EXPECT_EQ(partial.code(), Code::kInvalid);
  EXPECT_NE(partial.message().find("tentative"), std::string::npos) << partial.message();
  ASSERT_TRUE(e->Commit(seq.get(), 3).ok());
  StepInput wide{seq.get(), {4, 5, 6, 7}, Logits::kAll, true};  // 4 rows > spec_rows + 1 = 3
  Result<StepResult> r = e->Step(std::span<StepInput>(&wide, 1));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--spec"), std::string::npos) << r.status().message();
}

// --spec 1..8 on prompts where drafts hit (a repeated passage) and miss (random ids): the ids and
// every step's logits bits equal plain greedy decoding's; both kinds of verification happen.
void CheckSpecEqualsGreedy(const std::string& dir, int64_t gen, bool every_mode) {
  std::unique_ptr<Engine> e = OpenPlanned(dir, 256, 8);
  ASSERT_NE(e, nullptr);
  const auto V = static_cast<int32_t>(e->config().vocab);
  std::vector<std::vector<int32_t>> prompts = {RepeatedIds(7, 6, V), RandomIds(40, 11, V),
                                               RepeatedIds(3, 10, V)};
  if (!every_mode) prompts.resize(1);
  int64_t drafted = 0, accepted = 0;
  std::set<int64_t> kept_lengths;
  bool kept_all = false;
  for (size_t p = 0; p < prompts.size(); ++p) {
    const GreedyRun plain = Greedy(e.get(), prompts[p], gen, 0);
    ASSERT_EQ(static_cast<int64_t>(plain.ids.size()), gen);
    for (int64_t spec = 1; spec <= 8; ++spec) {
      // The prompt lookup (adaptive and fixed), then a known continuation with wrong tokens.
      for (int mode = every_mode ? 0 : 2; mode < 3; ++mode) {
        Drafter oracle = mode == 2 ? Oracle(plain.ids, V, static_cast<uint32_t>(spec + 8 * p))
                                   : nullptr;
        const GreedyRun s = Greedy(e.get(), prompts[p], gen, spec, {}, mode != 0, oracle);
        const std::string what = "prompt " + std::to_string(p) + " --spec " +
                                 std::to_string(spec) + " mode " + std::to_string(mode);
        EXPECT_EQ(s.ids, plain.ids) << what;
        EXPECT_TRUE(SameBits(s.logits, plain.logits)) << what;
        EXPECT_EQ(s.spec.passes + s.spec.accepted, gen - 1) << what;  // one token per pass + kept
        drafted += s.spec.drafted;
        accepted += s.spec.accepted;
        for (const auto& [d, a] : s.verified) {
          kept_lengths.insert(a);
          kept_all = kept_all || (a == d && d == spec);
        }
      }
    }
  }
  EXPECT_GT(accepted, 0) << "no draft was ever kept: the hit path was not exercised";
  EXPECT_GT(drafted, accepted) << "no draft was ever refused: the rollback path was not exercised";
  // Tiny sees every kept length; small (one prompt, fewer passes) at least none and all.
  for (int64_t a : every_mode ? std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}
                              : std::vector<int64_t>{0}) EXPECT_TRUE(kept_lengths.count(a)) << "never kept " << a;
  EXPECT_TRUE(kept_all) << "no --spec N pass kept all N drafts";
}

TEST(Speculation, Spec1To8GivesGreedyIdsAndBitsOnTiny) {
  CheckSpecEqualsGreedy(TinyPreparedDir(), 24, true);
}

TEST(Speculation, Spec1To8GivesGreedyIdsAndBitsOnSmall) {
  CheckSpecEqualsGreedy(SmallPreparedDir(), 12, false);
}

TEST(Speculation, PenalisedGreedyStaysExactAndSamplingIsRefused) {
  std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), 128, 4);
  ASSERT_NE(e, nullptr);
  const auto V = static_cast<int32_t>(e->config().vocab);
  SamplerOptions penalised;
  penalised.repeat_penalty = 1.3;
  penalised.frequency_penalty = 0.2;
  const std::vector<int32_t> prompt = RepeatedIds(5, 6, V);
  const GreedyRun plain = Greedy(e.get(), prompt, 20, 0, penalised);
  const GreedyRun spec = Greedy(e.get(), prompt, 20, 4, penalised);
  EXPECT_EQ(spec.ids, plain.ids);
  EXPECT_TRUE(SameBits(spec.logits, plain.logits));

  SamplerOptions sampled;
  sampled.temperature = 0.8;
  std::unique_ptr<Sequence> seq = e->NewSequence(sampled, 7);
  GenerateOptions g;
  g.prompt = prompt;
  g.gen = 4;
  g.spec = 2;
  Result<GenerateResult> r = Generate(e.get(), seq.get(), g, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("greedy"), std::string::npos) << r.status().message();
}

// A generation that stops inside a verified draft (a stop id among the kept tokens) keeps the
// sequence exactly where plain decoding leaves it.
TEST(Speculation, StopInsideADraftKeepsThePlainSequence) {
  std::unique_ptr<Engine> e = OpenPlanned(TinyPreparedDir(), 128, 8);
  ASSERT_NE(e, nullptr);
  const auto V = static_cast<int32_t>(e->config().vocab);
  const std::vector<int32_t> prompt = RepeatedIds(4, 8, V);
  const GreedyRun plain = Greedy(e.get(), prompt, 16, 0);
  ASSERT_GE(plain.ids.size(), 6u);
  for (size_t stop_at : {size_t{2}, size_t{5}}) {
    const int32_t stop = plain.ids[stop_at];
    const auto first = static_cast<size_t>(
        std::find(plain.ids.begin(), plain.ids.end(), stop) - plain.ids.begin());
    for (int64_t spec : {int64_t{0}, int64_t{8}}) {
      std::unique_ptr<Sequence> seq = e->NewSequence();
      GenerateOptions g;
      g.prompt = prompt;
      g.gen = 16;
      g.spec = spec;
      g.stop_ids = {stop};
      Result<GenerateResult> r = Generate(e.get(), seq.get(), g, nullptr);
      ASSERT_TRUE(r.ok());
      EXPECT_EQ(r->generated, std::vector<int32_t>(plain.ids.begin(),
                                                   plain.ids.begin() + first + 1));
      EXPECT_EQ(seq->length(), static_cast<int64_t>(prompt.size() + first));
    }
  }
}

}  // namespace
}  // namespace k3::run
