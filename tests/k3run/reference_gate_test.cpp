// The reference-model gates (DESIGN.md §7, §10): the engine against the independent PyTorch
// reference (tests/reference/k3_ref.py, float64), on the checkpoints the fixtures came from.
//
// Each fixture records the synth command and the XXH3-128 of every checkpoint file. The gate first
// compares those with the preset as synthesised in this run (the shared test fixture), so a
// change in synth cannot be mistaken for an engine bug (or hide one). Then: (1) the prompt's final
// logits within the fixture's stated bound, (2) greedy continuation identical up to and including
// the first step whose reference top-2 gap is ≤ the gap threshold (nothing compared after it),
// and the teacher-forced argmax identical at every position whose reference gap exceeds it.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/hash.h"
#include "k3run/engine/model.h"
#include "tests/k3run/engine_fixture.h"
#include "tests/support/files.h"
#include "tests/support/synth_fixture.h"

namespace k3::run::testing {
namespace {

nlohmann::json LoadFixture(const std::string& preset) {
  const std::string path = std::string(K3_SOURCE_DIR) + "/tests/data/reference/" + preset + ".json";
  std::string text;
  EXPECT_TRUE(test::ReadWholeFile(path, &text)) << "missing " << path;
  return nlohmann::json::parse(text);
}

int32_t ArgMax(const float* v, int64_t n) {
  int32_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (v[i] > v[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

class ReferenceGate : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    fixture_ = LoadFixture(GetParam());
    // The preset at the fixture's seed, synthesised and packed (link mode) once per CTest run.
    const test::FixtureDirs& dirs = test::SynthFixture(
        {fixture_["preset"].get<std::string>(), fixture_["seed"].get<uint64_t>(),
         prepared::ExpertsMode::kLink});
    ASSERT_FALSE(dirs.prepared.empty());
    checkpoint_ = dirs.checkpoint;
    prepared_ = dirs.prepared;

    // The checkpoint must be the one the reference saw.
    for (const auto& [name, want] : fixture_["files"].items()) {
      auto got = Xxh3_128File(Env::Default(), JoinPath(checkpoint_, name));
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ASSERT_EQ(got->Hex(), want.get<std::string>())
          << name << ": synth output changed: rerun tests/reference/regen.sh (needs python3-torch)";
    }

    engine_ = OpenEngine(prepared_);
    ASSERT_NE(engine_, nullptr);
    atol_ = fixture_["tolerance"]["atol"].get<double>();
    rtol_ = fixture_["tolerance"]["rtol"].get<double>();
    gap_threshold_ = fixture_["tolerance"]["gap_threshold"].get<double>();
  }

  nlohmann::json fixture_;
  std::string checkpoint_, prepared_;
  std::unique_ptr<Engine> engine_;
  double atol_ = 0, rtol_ = 0, gap_threshold_ = 0;
};

TEST_P(ReferenceGate, FinalLogitsWithinTheStatedBound) {
  const ModelConfig& c = engine_->prepared.manifest.config;
  for (const auto& cs : fixture_["cases"]) {
    const auto prompt = cs["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = cs["final_logits"].get<std::vector<double>>();
    ASSERT_EQ(static_cast<int64_t>(want.size()), c.vocab);
    Model model(c, engine_->weights.get(), c.n_layers);
    State state = State::Make(c, c.n_layers, static_cast<int64_t>(prompt.size()));
    std::vector<float> logits(static_cast<size_t>(c.vocab));
    ASSERT_TRUE(model.Forward(prompt.data(), static_cast<int64_t>(prompt.size()), &state, false,
                              logits.data()).ok());
    int bad = 0;
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const double err = std::fabs(static_cast<double>(logits[i]) - want[i]);
      const double bound = atol_ + rtol_ * std::fabs(want[i]);
      worst = std::max(worst, err / bound);
      if (err > bound && ++bad <= 5) {
        ADD_FAILURE() << GetParam() << " prompt of " << prompt.size() << ": logit " << i
                      << " got " << logits[i] << " want " << want[i] << " (bound " << bound << ")";
      }
    }
    EXPECT_EQ(bad, 0) << "worst error / bound = " << worst;
  }
}

TEST_P(ReferenceGate, GreedyAndTeacherForcedArgmaxMatchWhereTheGapAllows) {
  const ModelConfig& c = engine_->prepared.manifest.config;
  for (const auto& cs : fixture_["cases"]) {
    const auto prompt = cs["prompt_ids"].get<std::vector<int32_t>>();
    const auto want_ids = cs["greedy_ids"].get<std::vector<int32_t>>();
    const auto gaps = cs["greedy_gaps"].get<std::vector<double>>();
    ASSERT_EQ(want_ids.size(), gaps.size());
    std::vector<float> logits;
    const std::vector<int32_t> got =
        GenerateLogits(engine_.get(), prompt, static_cast<int64_t>(want_ids.size()), false, &logits);
    ASSERT_EQ(got.size(), want_ids.size());
    size_t compared = 0;
    for (size_t s = 0; s < want_ids.size(); ++s) {
      EXPECT_EQ(got[s], want_ids[s]) << GetParam() << " prompt of " << prompt.size()
                                     << ": greedy step " << s << " (reference gap " << gaps[s] << ")";
      ++compared;
      if (gaps[s] <= gap_threshold_) break;  // this step is compared; nothing after it
    }
    EXPECT_GT(compared, 0u);

    // Teacher forcing over prompt + reference continuation, all rows in one pass.
    std::vector<int32_t> full = prompt;
    full.insert(full.end(), want_ids.begin(), want_ids.end());
    const auto tf_want = cs["teacher_forced_argmax"].get<std::vector<int32_t>>();
    const auto tf_gaps = cs["tf_gaps"].get<std::vector<double>>();
    ASSERT_EQ(tf_want.size(), full.size());
    Model model(c, engine_->weights.get(), c.n_layers);
    const int64_t T = static_cast<int64_t>(full.size());
    State state = State::Make(c, c.n_layers, T);
    std::vector<float> all(static_cast<size_t>(T * c.vocab));
    ASSERT_TRUE(model.Forward(full.data(), T, &state, true, all.data()).ok());
    int checked = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (tf_gaps[static_cast<size_t>(t)] <= gap_threshold_) continue;
      ++checked;
      EXPECT_EQ(ArgMax(all.data() + t * c.vocab, c.vocab), tf_want[static_cast<size_t>(t)])
          << GetParam() << " teacher-forced position " << t;
    }
    EXPECT_GT(checked, T / 2) << "too few positions with a clear gap to compare";
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, ReferenceGate, ::testing::Values("tiny", "small"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
}  // namespace k3::run::testing
