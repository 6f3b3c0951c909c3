// k3verify tensors: emit → check round trips on a checkpoint and its prepared directories (both
// expert modes), each changed fixture field failing by name, sample bits checked against values
// the test computes itself from the bytes it wrote.
#include "k3verify/verify_tensors.h"

#include <cmath>
#include <cstring>
#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "formats/tensor_fixture.h"
#include "tests/k3verify/mini_pack.h"
#include "tests/support/fault_env.h"
#include "tests/support/temp_dir.h"

namespace k3::verify {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using test::ExpertsMode;

class VerifyTensorsTest : public ::testing::Test {
 protected:
  void SetUp() override { test::WriteTinyCheckpoint(model_.path()); }

  TensorsReport Run(const std::string& dir, const std::string& fixtures, const std::string& emit,
                    std::vector<std::string> names = {}, Env* env = Env::Default()) {
    TensorsOptions o;
    o.dir = dir;
    o.fixtures = fixtures;
    o.emit = emit;
    o.names = std::move(names);
    o.jobs = 2;
    o.progress = ProgressMode::kNone;
    Result<TensorsReport> r = VerifyTensors(env, o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : TensorsReport{};
  }

  // Emits from the checkpoint into work_/fx.json and returns its path.
  std::string Emit() {
    const std::string fx = work_.Join("fx.json");
    TensorsReport r = Run(model_.path(), "", fx);
    EXPECT_TRUE(r.Verdict().ok()) << RenderTensorsText(r);
    return fx;
  }

  // Replaces the first occurrence of `from` after `anchor` in the fixture file.
  void EditFixture(const std::string& path, const std::string& anchor, const std::string& from,
                   const std::string& to) {
    std::string text = test::ReadBytes(path);
    const size_t a = text.find(anchor);
    ASSERT_NE(a, std::string::npos) << anchor;
    const size_t p = text.find(from, a);
    ASSERT_NE(p, std::string::npos) << from;
    text.replace(p, from.size(), to);
    test::WriteBytes(path, text);
  }

  test::TempDir model_;
  test::TempDir prep_;
  test::TempDir work_;
};

const std::string kQProj = test::L(2, "self_attn.q_proj.weight");  // BF16 [32, 64]

TEST_F(VerifyTensorsTest, EmitThenCheckPassesOnTheCheckpoint) {
  const std::string fx = Emit();
  TensorsReport r = Run(model_.path(), fx, "");
  EXPECT_TRUE(r.Verdict().ok()) << RenderTensorsText(r);
  // Every language-model tensor, expert pairs folded: (all − vision) − 12 experts × 3.
  EXPECT_EQ(r.tensors, test::TinyTensors().size() - 1 - 12 * 3);
}

TEST_F(VerifyTensorsTest, CheckpointFixtureChecksCopyModePreparedDir) {
  test::PackTiny(model_.path(), prep_.path(), ExpertsMode::kCopy);
  TensorsReport r = Run(prep_.path(), Emit(), "");
  EXPECT_TRUE(r.Verdict().ok()) << RenderTensorsText(r);
  EXPECT_EQ(r.kind, "prepared directory");
}

TEST_F(VerifyTensorsTest, CheckpointFixtureChecksLinkModePreparedDir) {
  test::PackTiny(model_.path(), prep_.path(), ExpertsMode::kLink);
  TensorsReport r = Run(prep_.path(), Emit(), "");
  EXPECT_TRUE(r.Verdict().ok()) << RenderTensorsText(r);
}

TEST_F(VerifyTensorsTest, EmitFromPreparedDirEqualsEmitFromCheckpoint) {
  test::PackTiny(model_.path(), prep_.path(), ExpertsMode::kCopy);
  const std::string a = Emit();
  const std::string b = work_.Join("fx-prepared.json");
  TensorsReport r = Run(prep_.path(), "", b);
  ASSERT_TRUE(r.Verdict().ok()) << RenderTensorsText(r);
  EXPECT_EQ(test::ReadBytes(a), test::ReadBytes(b));
}

TEST_F(VerifyTensorsTest, RawSamplesAreTheLittleEndianElementBits) {
  Result<fixture::FixtureFile> fx = fixture::LoadFixture(Env::Default(), Emit());
  ASSERT_TRUE(fx.ok()) << fx.status().ToString();
  auto index = st::CheckpointIndex::Open(Env::Default(), model_.path());
  ASSERT_TRUE(index.ok());
  const std::string bytes = test::SourceBytes(*index, kQProj);
  for (const fixture::Entry& e : fx->entries) {
    if (e.name != kQProj) continue;
    EXPECT_EQ(e.dtype, DType::kBF16);
    ASSERT_EQ(e.samples.size(), 8u);
    EXPECT_EQ(e.samples.back().index, 32u * 64u - 1);
    for (const fixture::Sample& s : e.samples) {
      const auto lo = static_cast<uint8_t>(bytes[2 * s.index]);
      const auto hi = static_cast<uint8_t>(bytes[2 * s.index + 1]);
      EXPECT_EQ(s.bits, uint64_t{lo} | (uint64_t{hi} << 8)) << s.index;
    }
    EXPECT_EQ(e.xxh3_128, Xxh3_128(bytes.data(), bytes.size()));
    return;
  }
  FAIL() << kQProj << " not emitted";
}

// The dequantised value computed here from MODEL.md §4 directly (not formats/mxfp4.h).
uint32_t ExpectedMxfp4Bits(const std::string& packed, const std::string& scale, uint64_t cols,
                           uint64_t index) {
  static const float kValues[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const uint64_t row = index / cols, col = index % cols;
  const auto byte = static_cast<uint8_t>(packed[row * cols / 2 + col / 2]);
  const uint8_t code = col % 2 == 0 ? byte & 15 : byte >> 4;
  const auto e = static_cast<uint8_t>(scale[row * cols / 32 + col / 32]);
  float v = (e == 255) ? 0.0f : std::ldexp(kValues[code & 7], static_cast<int>(e) - 127);
  if (code & 8) v = -v;
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return bits;
}

TEST_F(VerifyTensorsTest, Mxfp4SamplesAreExactDequantisedValues) {
  Result<fixture::FixtureFile> fx = fixture::LoadFixture(Env::Default(), Emit());
  ASSERT_TRUE(fx.ok()) << fx.status().ToString();
  auto index = st::CheckpointIndex::Open(Env::Default(), model_.path());
  ASSERT_TRUE(index.ok());
  const std::string name = "language_model.model.layers.3.block_sparse_moe.experts.2.w2";
  const std::string packed = test::SourceBytes(*index, name + ".weight_packed");
  const std::string scale = test::SourceBytes(*index, name + ".weight_scale");
  for (const fixture::Entry& e : fx->entries) {
    if (e.name != name) continue;
    EXPECT_TRUE(e.mxfp4);
    EXPECT_EQ(e.shape, (std::vector<uint64_t>{32, 64}));  // w2: [latent 32][moe_inter 64]
    ASSERT_EQ(e.samples.size(), 8u);
    for (const fixture::Sample& s : e.samples) {
      EXPECT_EQ(s.bits, ExpectedMxfp4Bits(packed, scale, 64, s.index)) << s.index;
    }
    const std::string both = packed + scale;
    EXPECT_EQ(e.xxh3_128, Xxh3_128(both.data(), both.size()));
    return;
  }
  FAIL() << name << " not emitted";
}

TEST_F(VerifyTensorsTest, ChangedDtypeFailsNamingTheField) {
  const std::string fx = Emit();
  EditFixture(fx, "\"" + kQProj + "\"", "\"BF16\"", "\"F16\"");  // same width: still parses
  const Status v = Run(model_.path(), fx, "").Verdict();
  EXPECT_EQ(v.code(), Code::kIntegrity);
  EXPECT_THAT(v.message(), HasSubstr("tensor \"" + kQProj + "\": dtype: the fixture records F16"));
}

TEST_F(VerifyTensorsTest, ChangedShapeFailsNamingTheField) {
  const std::string fx = Emit();
  EditFixture(fx, "\"" + kQProj + "\"", "32", "33");
  const Status v = Run(model_.path(), fx, "").Verdict();
  EXPECT_EQ(v.code(), Code::kIntegrity);
  EXPECT_THAT(v.message(), HasSubstr("tensor \"" + kQProj + "\": shape: the fixture records [33,64]"));
}

TEST_F(VerifyTensorsTest, ChangedHashFailsNamingTheField) {
  const std::string fx = Emit();
  std::string text = test::ReadBytes(fx);
  const size_t h = text.find("\"xxh3_128\":\"", text.find("\"" + kQProj + "\"")) + 12;
  text[h] = text[h] == 'f' ? 'e' : 'f';
  const std::string edited = text.substr(h, 32);
  test::WriteBytes(fx, text);
  const Status v = Run(model_.path(), fx, "").Verdict();
  EXPECT_EQ(v.code(), Code::kIntegrity);
  EXPECT_THAT(v.message(),
              HasSubstr("tensor \"" + kQProj + "\": xxh3_128: the fixture records " + edited));
}

TEST_F(VerifyTensorsTest, ChangedSampleFailsNamingTheIndex) {
  const std::string fx = Emit();
  std::string text = test::ReadBytes(fx);
  const size_t b = text.find("\"bits\":\"", text.find("\"" + kQProj + "\"")) + 8;
  text[b] = text[b] == '0' ? '1' : '0';
  test::WriteBytes(fx, text);
  const TensorsReport r = Run(model_.path(), fx, "");
  ASSERT_EQ(r.problems.size(), 1u) << RenderTensorsText(r);
  EXPECT_EQ(r.problems[0].code(), Code::kIntegrity);
  EXPECT_THAT(r.problems[0].message(), HasSubstr("tensor \"" + kQProj + "\": sample[index 0]"));
}

TEST_F(VerifyTensorsTest, FlippedPreparedExpertByteFailsTheMxfp4Entry) {
  test::PackTiny(model_.path(), prep_.path(), ExpertsMode::kCopy);
  const std::string fx = Emit();
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), prep_.path());
  ASSERT_TRUE(p.ok());
  const prepared::ExpertRecord& rec = p->experts.At(1, 2);
  test::FlipByte(p->expert_paths[rec.file_id], rec.offset);  // w1 packed byte 0: sample 0
  const TensorsReport r = Run(prep_.path(), fx, "");
  const std::string w1 = "language_model.model.layers.1.block_sparse_moe.experts.2.w1";
  ASSERT_EQ(r.problems.size(), 2u) << RenderTensorsText(r);
  EXPECT_THAT(r.problems[0].message(), HasSubstr("tensor \"" + w1 + "\": xxh3_128"));
  EXPECT_THAT(r.problems[1].message(), HasSubstr("tensor \"" + w1 + "\": sample[index 0]"));
  EXPECT_THAT(r.problems[1].message(), HasSubstr("dequantised"));
}

TEST_F(VerifyTensorsTest, ListedTensorMissingIsInvalid) {
  const std::string fx = Emit();
  EditFixture(fx, "\"" + kQProj + "\"", "q_proj", "q_projection");
  const Status v = Run(model_.path(), fx, "").Verdict();
  EXPECT_EQ(v.code(), Code::kInvalid);
  EXPECT_THAT(v.message(), HasSubstr("q_projection.weight\": listed in the fixture but not found"));
}

TEST_F(VerifyTensorsTest, NamesRestrictEmitAndCheck) {
  const std::string fx = work_.Join("some.json");
  TensorsReport r = Run(model_.path(), "", fx, {"layers\\.2\\..*q_proj", "^language_model\\.lm_head"});
  ASSERT_TRUE(r.Verdict().ok()) << RenderTensorsText(r);
  EXPECT_EQ(r.tensors, 2u);
  Result<fixture::FixtureFile> f = fixture::LoadFixture(Env::Default(), fx);
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(f->entries.size(), 2u);
  EXPECT_EQ(f->entries[0].name, "language_model.lm_head.weight");
  EXPECT_EQ(f->entries[1].name, kQProj);
  EXPECT_EQ(Run(model_.path(), Emit(), "", {"lm_head"}).tensors, 1u);
}

TEST_F(VerifyTensorsTest, BadRegexIsAUsageError) {
  TensorsOptions o;
  o.dir = model_.path();
  o.emit = work_.Join("x.json");
  o.names = {"(unclosed"};
  Result<TensorsReport> r = VerifyTensors(Env::Default(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalid);
  EXPECT_THAT(r.status().message(), HasSubstr("--names \"(unclosed\""));
}

TEST_F(VerifyTensorsTest, NeitherOrBothModesIsAUsageError) {
  TensorsOptions o;
  o.dir = model_.path();
  EXPECT_EQ(VerifyTensors(Env::Default(), o).status().code(), Code::kInvalid);
  o.emit = "a";
  o.fixtures = "b";
  EXPECT_EQ(VerifyTensors(Env::Default(), o).status().code(), Code::kInvalid);
}

TEST_F(VerifyTensorsTest, MalformedFixtureFileIsInvalidNamingIt) {
  const std::string fx = work_.WriteFile("bad.json", "{\"format\": \"k3-tensor-fixture\", ");
  const Status v = Run(model_.path(), fx, "").Verdict();
  EXPECT_EQ(v.code(), Code::kInvalid);
  EXPECT_THAT(v.message(), HasSubstr(fx + ": malformed JSON"));
}

TEST_F(VerifyTensorsTest, ReadErrorDuringEmitWritesNoFixture) {
  test::FaultEnv env;
  auto index = st::CheckpointIndex::Open(Env::Default(), model_.path());
  ASSERT_TRUE(index.ok());
  const auto* loc = index->Find(kQProj);
  env.SetRule(loc->shard->path, test::FaultRule::EioAt(loc->file_offset() + 1));
  const std::string fx = work_.Join("fx.json");
  const TensorsReport r = Run(model_.path(), "", fx, {}, &env);
  EXPECT_EQ(r.Verdict().code(), Code::kIo) << RenderTensorsText(r);
  EXPECT_THAT(RenderTensorsText(r), HasSubstr("tensor \"" + kQProj + "\""));
  EXPECT_FALSE(fs::exists(fx));
  EXPECT_TRUE(work_.List().empty());
}

}  // namespace
}  // namespace k3::verify
