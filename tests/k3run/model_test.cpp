// The engine's self-consistency gates on the synth tiny model (DESIGN.md §7, gates 3–5):
// bits never depend on incremental vs recompute, prefill vs one token at a time, ISA path or
// thread count. Expectations come from a second run of the engine along a different path, never
// from constants the code produced.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <vector>

#include "k3run/engine/generate.h"
#include "k3run/kernels/matmul.h"
#include "k3run/engine/model.h"
#include "tests/k3run/engine_fixture.h"

namespace k3::run::testing {
namespace {

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// First index where two logit arrays differ bitwise, for a useful failure message.
std::string FirstDiff(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab) {
  if (a.size() != b.size()) return "sizes " + std::to_string(a.size()) + " vs " +
                                   std::to_string(b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return "step " + std::to_string(int64_t(i) / vocab) + " id " +
             std::to_string(int64_t(i) % vocab) + ": " + std::to_string(a[i]) + " vs " +
             std::to_string(b[i]);
    }
  }
  return "none";
}

class EngineGate : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = OpenEngine(TinyPreparedDir());
    ASSERT_NE(engine_, nullptr);
    vocab_ = engine_->prepared.manifest.config.vocab;
    saved_threads_ = kernels::Threads();
    saved_isa_ = kernels::ActiveIsa();
  }
  void TearDown() override {
    kernels::SetThreads(saved_threads_);
    kernels::SetIsa(saved_isa_);
  }
  std::unique_ptr<Engine> engine_;
  int64_t vocab_ = 0;
  int saved_threads_ = 1;
  kernels::Isa saved_isa_ = kernels::Isa::kScalar;
};

TEST_F(EngineGate, LogitsAreFiniteAndVaried) {
  std::vector<float> logits;
  const std::vector<int32_t> ids = GenerateLogits(engine_.get(), kPrompt, 12, false, &logits);
  ASSERT_EQ(ids.size(), 12u);
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  // Synth promises tiny greedy decoding does not collapse to one token (DESIGN.md §8).
  std::vector<int32_t> distinct(ids);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  EXPECT_GT(distinct.size(), 1u);
}

// Gate 3: incremental decode is bit-identical to --recompute.
TEST_F(EngineGate, IncrementalDecodeBitIdenticalToRecompute) {
  std::vector<float> inc, rec;
  const auto a = GenerateLogits(engine_.get(), kPrompt, 10, /*recompute=*/false, &inc);
  const auto b = GenerateLogits(engine_.get(), kPrompt, 10, /*recompute=*/true, &rec);
  EXPECT_EQ(a, b);
  EXPECT_TRUE(SameBits(inc, rec)) << "first difference: " << FirstDiff(inc, rec, vocab_);
}

// Gate 5: prefill of T tokens is bit-identical to feeding them one at a time.
TEST_F(EngineGate, PrefillBitIdenticalToOneTokenAtATime) {
  const ModelConfig& c = engine_->prepared.manifest.config;
  const int64_t T = static_cast<int64_t>(kPrompt.size());
  Model model(c, engine_->weights.get(), c.n_layers);
  State batch = State::Make(c, c.n_layers, T);
  std::vector<float> all(static_cast<size_t>(T * vocab_));
  ASSERT_TRUE(model.Forward(kPrompt.data(), T, &batch, /*all_rows=*/true, all.data()).ok());
  EXPECT_EQ(batch.pos, T);
  State single = State::Make(c, c.n_layers, T);
  std::vector<float> one(static_cast<size_t>(T * vocab_));
  for (int64_t t = 0; t < T; ++t) {
    ASSERT_TRUE(model.Forward(&kPrompt[size_t(t)], 1, &single, false, one.data() + t * vocab_)
                    .ok());
  }
  EXPECT_TRUE(SameBits(all, one)) << "first difference: " << FirstDiff(all, one, vocab_);
}

// The last-row-only path equals the last row of all_rows.
TEST_F(EngineGate, LastRowLogitsEqualAllRowsLastRow) {
  const ModelConfig& c = engine_->prepared.manifest.config;
  const int64_t T = static_cast<int64_t>(kPrompt.size());
  Model model(c, engine_->weights.get(), c.n_layers);
  State s1 = State::Make(c, c.n_layers, T), s2 = State::Make(c, c.n_layers, T);
  std::vector<float> all(static_cast<size_t>(T * vocab_)), last(static_cast<size_t>(vocab_));
  ASSERT_TRUE(model.Forward(kPrompt.data(), T, &s1, true, all.data()).ok());
  ASSERT_TRUE(model.Forward(kPrompt.data(), T, &s2, false, last.data()).ok());
  EXPECT_TRUE(SameBits(std::vector<float>(all.end() - vocab_, all.end()), last));
}

// Gate 4a: the thread count never changes a bit.
TEST_F(EngineGate, ThreadCountsBitIdentical) {
  std::vector<std::vector<float>> runs;
  std::vector<std::vector<int32_t>> ids;
  for (int threads : {1, 2, 3}) {
    kernels::SetThreads(threads);
    std::vector<float> l;
    ids.push_back(GenerateLogits(engine_.get(), kPrompt, 4, false, &l));
    runs.push_back(std::move(l));
  }
  for (size_t i = 1; i < runs.size(); ++i) {
    EXPECT_EQ(ids[0], ids[i]);
    EXPECT_TRUE(SameBits(runs[0], runs[i]))
        << "threads " << (i + 1) << " vs 1: " << FirstDiff(runs[0], runs[i], vocab_);
  }
}

// Gate 4b: every ISA path gives the scalar path's bits. Paths the CPU lacks are visible skips.
class EngineIsa : public EngineGate, public ::testing::WithParamInterface<kernels::Isa> {};

TEST_P(EngineIsa, LogitsBitIdenticalToScalar) {
  const kernels::Isa isa = GetParam();
  if (!kernels::IsaSupported(isa)) {
    GTEST_SKIP() << "this CPU lacks the " << kernels::IsaName(isa) << " path";
  }
  kernels::SetIsa(kernels::Isa::kScalar);
  std::vector<float> want;
  const auto want_ids = GenerateLogits(engine_.get(), kPrompt, 4, false, &want);
  kernels::SetIsa(isa);
  std::vector<float> got;
  const auto got_ids = GenerateLogits(engine_.get(), kPrompt, 4, false, &got);
  EXPECT_EQ(got_ids, want_ids);
  EXPECT_TRUE(SameBits(got, want)) << kernels::IsaName(isa)
                                   << " vs scalar: " << FirstDiff(got, want, vocab_);
}

INSTANTIATE_TEST_SUITE_P(Paths, EngineIsa,
                         ::testing::Values(kernels::Isa::kAvx2, kernels::Isa::kAvx512),
                         [](const auto& p) { return std::string(kernels::IsaName(p.param)); });

// --layers N runs a prefix of the model: different logits, same machinery.
TEST_F(EngineGate, LayersPrefixDiffersFromFullModel) {
  std::vector<float> full, part;
  GenerateLogits(engine_.get(), kPrompt, 0, false, &full);
  GenerateLogits(engine_.get(), kPrompt, 0, false, &part, /*layers=*/2);
  ASSERT_EQ(full.size(), size_t(vocab_));
  ASSERT_EQ(part.size(), size_t(vocab_));
  EXPECT_FALSE(SameBits(full, part));
}

TEST(Greedy, TieBreaksToLowestId) {
  const float l[] = {0.5f, 2.0f, -1.0f, 2.0f, 2.0f};
  EXPECT_EQ(Greedy(l, 5), 1);
  const float same[] = {1.0f, 1.0f, 1.0f};
  EXPECT_EQ(Greedy(same, 3), 0);
  const float last[] = {-3.0f, -2.0f, -1.0f};
  EXPECT_EQ(Greedy(last, 3), 2);
}

TEST(Greedy, NegativeZeroTiesPositiveZero) {
  // −0 == +0 under >, so the lower id wins.
  const float l[] = {-0.0f, 0.0f};
  EXPECT_EQ(Greedy(l, 2), 0);
}

}  // namespace
}  // namespace k3::run::testing
