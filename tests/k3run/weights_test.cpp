// RamWeights: every weight through one interface, small vectors widened exactly, expert read
// failures recorded (never silent), both small-vector dtypes accepted.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "formats/prepared_layout.h"
#include "k3prep/pack/pack.h"
#include "k3prep/synth/checkpoint.h"
#include "tests/k3run/engine_fixture.h"
#include "tests/support/fault_env.h"
#include "tests/support/temp_dir.h"

namespace k3::run::testing {
namespace {

// Raw bytes of a region, read with the standard library (independent of RamWeights).
std::string RegionBytes(const std::string& dir, const prepared::Region& r) {
  Result<std::string> all = ReadFileToString(Env::Default(), dir + "/" + r.file);
  EXPECT_TRUE(all.ok());
  return all->substr(r.offset, r.length);
}

TEST(RamWeights, SmallBf16VectorsAreWidenedExactly) {
  auto e = OpenEngine(TinyPreparedDir());
  ASSERT_NE(e, nullptr);
  const std::string name = prepared::LayerPrefix(1) + "input_layernorm.weight";
  const prepared::Region* r = e->prepared.manifest.FindRegion(name);
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->dtype, DType::kBF16) << "synth --small-dtype mixed stores norm gains as BF16";
  const std::string raw = RegionBytes(TinyPreparedDir(), *r);
  Result<const ops::LayerWeights*> w = e->weights->Layer(1);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_EQ((*w)->input_layernorm.size() * 2, raw.size());
  for (size_t i = 0; i < (*w)->input_layernorm.size(); ++i) {
    uint16_t b;
    std::memcpy(&b, raw.data() + 2 * i, 2);
    uint32_t bits;
    std::memcpy(&bits, &(*w)->input_layernorm[i], 4);
    ASSERT_EQ(bits, uint32_t{b} << 16) << "element " << i;
  }
}

TEST(RamWeights, EmbeddingRowIsTheTableRowWidened) {
  auto e = OpenEngine(TinyPreparedDir());
  ASSERT_NE(e, nullptr);
  const prepared::Region* r =
      e->prepared.manifest.FindRegion(std::string(prepared::kModelPrefix) + "embed_tokens.weight");
  ASSERT_NE(r, nullptr);
  const std::string raw = RegionBytes(TinyPreparedDir(), *r);
  const int32_t id = 1000;
  std::vector<float> row(128);
  ASSERT_TRUE(e->weights->EmbeddingRows(&id, 1, row.data()).ok());
  for (size_t i = 0; i < 128; ++i) {
    uint16_t b;
    std::memcpy(&b, raw.data() + (size_t(id) * 128 + i) * 2, 2);
    uint32_t bits;
    std::memcpy(&bits, &row[i], 4);
    ASSERT_EQ(bits, uint32_t{b} << 16) << "element " << i;
  }
  EXPECT_EQ(e->weights->Counters().embedding, 256u);
}

TEST(RamWeights, ExpertReadFailureIsRecordedWithLayerAndExpert) {
  test::FaultEnv env;
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(&env, TinyPreparedDir());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const prepared::ExpertRecord& rec = p->experts.At(2, 5);
  env.SetRule(p->expert_paths[rec.file_id], test::FaultRule::EioAt(rec.offset + 7));
  Result<std::unique_ptr<RamWeights>> w = RamWeights::Open(&env, &*p);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->Expert(2, 5), nullptr);
  EXPECT_EQ((*w)->Expert(2, 5), nullptr);  // not retried, not double-counted
  ASSERT_EQ((*w)->Failures().size(), 1u);
  EXPECT_EQ((*w)->Failures()[0].layer, 2);
  EXPECT_EQ((*w)->Failures()[0].expert, 5);
  EXPECT_NE((*w)->Failures()[0].reason.find(p->expert_paths[rec.file_id]), std::string::npos)
      << (*w)->Failures()[0].reason;
  EXPECT_NE((*w)->Expert(2, 4), nullptr);  // a neighbour in the same file still loads
}

TEST(RamWeights, ExpertOutOfRangeIsNull) {
  auto e = OpenEngine(TinyPreparedDir());
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->weights->Expert(0, 0), nullptr);   // layer 0 is dense
  EXPECT_EQ(e->weights->Expert(1, 8), nullptr);   // 8 experts: 0..7
  EXPECT_EQ(e->weights->Expert(13, 0), nullptr);  // 13 layers
}

// synth --small-dtype bf16 and f32 make every small vector that dtype: both must load and run.
class SmallDType : public ::testing::TestWithParam<synth::SmallDType> {};

TEST_P(SmallDType, CheckpointLoadsAndGenerates) {
  test::TempDir tmp;
  synth::SynthOptions s;
  s.preset = "tiny";
  s.out = tmp.Join("ck");
  s.small = GetParam();
  ASSERT_TRUE(synth::RunSynth(Env::Default(), s).ok());
  prep::PackOptions p;
  p.model_dir = s.out;
  p.out = tmp.Join("prep");
  p.experts = prepared::ExpertsMode::kLink;
  p.jobs = 1;
  Result<prep::PackResult> pr = prep::RunPack(Env::Default(), p);
  ASSERT_TRUE(pr.ok()) << pr.status().ToString();
  auto e = OpenEngine(p.out);
  ASSERT_NE(e, nullptr);
  std::vector<float> logits;
  EXPECT_EQ(GenerateLogits(e.get(), kPrompt, 3, false, &logits).size(), 3u);
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  EXPECT_TRUE(e->weights->Failures().empty());
}

INSTANTIATE_TEST_SUITE_P(Both, SmallDType,
                         ::testing::Values(synth::SmallDType::kBF16, synth::SmallDType::kF32));

}  // namespace
}  // namespace k3::run::testing
