// k3verify prepared: one test per way a prepared directory can be corrupted, each building a
// prepared directory (prepared_fixture.h, or PackTiny from a real checkpoint for --against),
// breaking one thing, and asserting the exit category and that the message names what it must.
#include "k3verify/verify_prepared.h"

#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "k3verify/cli.h"
#include "tests/k3verify/mini_pack.h"
#include "tests/support/fault_env.h"
#include "tests/support/temp_dir.h"

namespace k3::verify {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using test::ExpertsMode;

class VerifyPreparedTest : public ::testing::Test {
 protected:
  void Build(ExpertsMode mode) {
    test::BuildPrepared(prep_.path(), mode, model_.path());
    test::Reseal(prep_.path());
    manifest_ = Open().manifest;
  }

  prepared::PreparedDir Open() {
    Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), prep_.path());
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? std::move(p).value() : prepared::PreparedDir{};
  }

  PreparedReport Run(bool deep, Env* env = Env::Default(), std::string against = "",
                     std::string model_dir = "") {
    PreparedOptions o;
    o.dir = prep_.path();
    o.deep = deep;
    o.against = std::move(against);
    o.model_dir = std::move(model_dir);
    o.jobs = 2;
    o.progress = ProgressMode::kNone;
    Result<PreparedReport> r = VerifyPrepared(env, o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : PreparedReport{};
  }

  const prepared::Region& RegionNamed(const std::string& name) {
    const prepared::Region* r = manifest_.FindRegion(name);
    EXPECT_NE(r, nullptr) << name;
    return *r;
  }

  test::TempDir prep_;
  test::TempDir model_;
  prepared::Manifest manifest_;
};

TEST_F(VerifyPreparedTest, GoodCopyModePassesDeep) {
  Build(ExpertsMode::kCopy);
  PreparedReport r = Run(true);
  EXPECT_TRUE(r.Verdict().ok()) << RenderPreparedText(r);
  EXPECT_EQ(r.experts, 12u);
  // Every region (experts.idx included) and every expert was hashed.
  EXPECT_EQ(r.items_hashed, manifest_.regions.size() + 12);
  EXPECT_EQ(r.experts_mode, "copy");
}

TEST_F(VerifyPreparedTest, GoodLinkModePassesDeep) {
  Build(ExpertsMode::kLink);
  PreparedReport r = Run(true);
  EXPECT_TRUE(r.Verdict().ok()) << RenderPreparedText(r);
  EXPECT_EQ(r.items_hashed, manifest_.regions.size() + 12);
}

TEST_F(VerifyPreparedTest, StructureOnlyDoesNotReadRegionBytes) {
  Build(ExpertsMode::kCopy);
  const prepared::Region& reg = RegionNamed(test::L(2, "self_attn.q_proj.weight"));
  test::FlipByte(prep_.Join("trunk.bin"), reg.offset);
  PreparedReport r = Run(false);
  EXPECT_TRUE(r.Verdict().ok()) << RenderPreparedText(r);
  EXPECT_EQ(r.items_hashed, 0u);
  EXPECT_THAT(RenderPreparedText(r), HasSubstr("add --deep"));
}

// (a)
TEST_F(VerifyPreparedTest, FlippedTrunkLayerByteNamesRegionFileAndOffset) {
  Build(ExpertsMode::kCopy);
  const std::string name = test::L(2, "self_attn.q_proj.weight");
  const prepared::Region& reg = RegionNamed(name);
  test::FlipByte(prep_.Join("trunk.bin"), reg.offset + 7);
  const Status v = Run(true).Verdict();
  EXPECT_EQ(v.code(), Code::kIntegrity);
  EXPECT_THAT(v.message(), HasSubstr("region \"" + name + "\""));
  EXPECT_THAT(v.message(), HasSubstr("trunk.bin, offset " + std::to_string(reg.offset)));
  EXPECT_THAT(v.message(), HasSubstr("XXH3-128"));
}

// (b)
TEST_F(VerifyPreparedTest, FlippedResidentByteNamesRegion) {
  Build(ExpertsMode::kCopy);
  const std::string name = "language_model.lm_head.weight";
  const prepared::Region& reg = RegionNamed(name);
  test::FlipByte(prep_.Join("resident.bin"), reg.offset + reg.length - 1);
  const Status v = Run(true).Verdict();
  EXPECT_EQ(v.code(), Code::kIntegrity);
  EXPECT_THAT(v.message(), HasSubstr("region \"" + name + "\""));
  EXPECT_THAT(v.message(), HasSubstr("resident.bin, offset " + std::to_string(reg.offset)));
}

// (c)
TEST_F(VerifyPreparedTest, FlippedCopyModeExpertByteNamesLayerAndExpert) {
  Build(ExpertsMode::kCopy);
  const prepared::PreparedDir p = Open();
  const prepared::ExpertRecord& rec = p.experts.At(2, 3);
  const std::string path = p.expert_paths[rec.file_id];
  test::FlipByte(path, rec.offset + 100);
  const PreparedReport r = Run(true);
  const Status v = r.Verdict();
  EXPECT_EQ(v.code(), Code::kIntegrity);
  EXPECT_THAT(v.message(), HasSubstr("layer 2 expert 3 (" + path + ", offset " +
                                     std::to_string(rec.offset)));
  EXPECT_THAT(v.message(), HasSubstr("XXH3-64"));
  EXPECT_EQ(r.problems.size(), 1u) << RenderPreparedText(r);
}

// (d)
TEST_F(VerifyPreparedTest, FlippedExpertByteInsideLinkModeShardNamesLayerAndExpert) {
  Build(ExpertsMode::kLink);
  const prepared::PreparedDir p = Open();
  const prepared::ExpertRecord& rec = p.experts.At(3, 1);
  test::FlipByte(model_.Join("model.safetensors"), rec.offset + 5);
  const Status v = Run(true).Verdict();
  EXPECT_EQ(v.code(), Code::kIntegrity);
  EXPECT_THAT(v.message(), HasSubstr("layer 3 expert 1 (" + model_.Join("model.safetensors") +
                                     ", offset " + std::to_string(rec.offset)));
}

// (e)
TEST_F(VerifyPreparedTest, FlippedExpertsIdxByteIsIntegrityNamingTheFile) {
  Build(ExpertsMode::kCopy);
  // A byte of the last record's XXH3-64 field: the file still decodes, only its hash tells.
  const uint64_t size = fs::file_size(prep_.Join("experts.idx"));
  test::FlipByte(prep_.Join("experts.idx"), size - 128 + 96);
  const Status v = Run(true).Verdict();
  EXPECT_EQ(v.code(), Code::kIntegrity);
  EXPECT_THAT(v.message(), HasSubstr("experts.idx altered"));
}

// (f)
TEST_F(VerifyPreparedTest, EditedManifestIsCaughtByTheSum) {
  Build(ExpertsMode::kCopy);
  std::string text = test::ReadBytes(prep_.Join("k3.json"));
  text[text.find("\"tiny\"") + 1] = 'T';
  test::WriteBytes(prep_.Join("k3.json"), text);
  const Status v = Run(true).Verdict();
  EXPECT_EQ(v.code(), Code::kIntegrity);
  EXPECT_THAT(v.message(), HasSubstr("k3.json altered"));
}

TEST_F(VerifyPreparedTest, MissingSumIsInvalid) {
  Build(ExpertsMode::kCopy);
  fs::remove(prep_.Join("k3.sum"));
  const Status v = Run(false).Verdict();
  EXPECT_EQ(v.code(), Code::kInvalid);
  EXPECT_THAT(v.message(), HasSubstr("k3.sum: missing"));
}

TEST_F(VerifyPreparedTest, InvalidManifestMatchingItsSumIsInvalid) {
  Build(ExpertsMode::kCopy);
  const std::string text = "{\"format\":\"k3-prepared\"}\n";
  test::WriteBytes(prep_.Join("k3.json"), text);
  test::WriteBytes(prep_.Join("k3.sum"), prepared::RenderSumLine(text));
  const Status v = Run(false).Verdict();
  EXPECT_EQ(v.code(), Code::kInvalid);
  EXPECT_THAT(v.message(), HasSubstr("k3.json"));
}

TEST_F(VerifyPreparedTest, TruncatedTrunkNamesTheFileAndStillChecksTheRest) {
  Build(ExpertsMode::kCopy);
  // A damaged expert too: the audit must not stop at the first problem.
  const prepared::ExpertRecord rec = Open().experts.At(1, 0);
  const uint64_t size = fs::file_size(prep_.Join("trunk.bin"));
  fs::resize_file(prep_.Join("trunk.bin"), size - 4096);
  test::FlipByte(prep_.Join("experts/layer-001.bin"), rec.offset);
  const PreparedReport r = Run(true);
  const Status v = r.Verdict();
  EXPECT_EQ(v.code(), Code::kIntegrity);
  const std::string text = RenderPreparedText(r);
  EXPECT_THAT(text, HasSubstr(prep_.Join("trunk.bin") + ": file is " + std::to_string(size - 4096) +
                              " bytes, k3.json records " + std::to_string(size) + " (truncated"));
  EXPECT_THAT(text, HasSubstr("layer 1 expert 0"));
}

TEST_F(VerifyPreparedTest, TruncatedTrunkAloneIsInvalid) {
  Build(ExpertsMode::kCopy);
  fs::resize_file(prep_.Join("trunk.bin"), 4096);
  const Status v = Run(true).Verdict();
  EXPECT_EQ(v.code(), Code::kInvalid);
  EXPECT_THAT(v.message(), HasSubstr("trunk.bin: file is 4096 bytes"));
}

TEST_F(VerifyPreparedTest, MovedShardInLinkModeIsNamedWithTheFix) {
  Build(ExpertsMode::kLink);
  fs::rename(model_.Join("model.safetensors"), model_.Join("elsewhere.bin"));
  const Status v = Run(true).Verdict();
  EXPECT_EQ(v.code(), Code::kInvalid);
  EXPECT_THAT(v.message(), HasSubstr(model_.Join("model.safetensors") + ": expert file is missing"));
  EXPECT_THAT(v.message(), HasSubstr("--model-dir"));
}

TEST_F(VerifyPreparedTest, ModelDirRelocatesLinkModeShards) {
  Build(ExpertsMode::kLink);
  test::TempDir moved;
  fs::rename(model_.Join("model.safetensors"), moved.Join("model.safetensors"));
  PreparedReport r = Run(true, Env::Default(), "", moved.path());
  EXPECT_TRUE(r.Verdict().ok()) << RenderPreparedText(r);
}

TEST_F(VerifyPreparedTest, EveryProblemIsReportedNotJustTheFirst) {
  Build(ExpertsMode::kCopy);
  const prepared::Region& a = RegionNamed(test::L(0, "mlp.gate_proj.weight"));
  const prepared::Region& b = RegionNamed(test::L(3, "self_attn.o_proj.weight"));
  test::FlipByte(prep_.Join("trunk.bin"), a.offset);
  test::FlipByte(prep_.Join("trunk.bin"), b.offset);
  const prepared::ExpertRecord rec = Open().experts.At(3, 3);
  test::FlipByte(prep_.Join("experts/layer-003.bin"), rec.offset + rec.length - 1);
  const PreparedReport r = Run(true);
  ASSERT_EQ(r.problems.size(), 3u) << RenderPreparedText(r);
  EXPECT_THAT(r.problems[0].message(), HasSubstr(a.name));
  EXPECT_THAT(r.problems[1].message(), HasSubstr(b.name));
  EXPECT_THAT(r.problems[2].message(), HasSubstr("layer 3 expert 3"));
}

TEST_F(VerifyPreparedTest, EioDuringDeepIsIoNamingFileAndOffset) {
  Build(ExpertsMode::kCopy);
  test::FaultEnv env;
  const uint64_t bad = RegionNamed(test::L(1, "self_attn.q_a_proj.weight")).offset + 10;
  env.SetRule(prep_.Join("trunk.bin"), test::FaultRule::EioAt(bad));
  const PreparedReport r = Run(true, &env);
  const Status v = r.Verdict();
  EXPECT_EQ(v.code(), Code::kIo) << RenderPreparedText(r);
  EXPECT_THAT(v.message(), HasSubstr(prep_.Join("trunk.bin")));
  EXPECT_THAT(v.message(), HasSubstr("not checked"));
  // The other files were still verified (resident, tokenizer, 12 experts, experts.idx).
  EXPECT_GE(r.items_hashed, 12u + 3u);
}

TEST_F(VerifyPreparedTest, JsonReportCarriesExitCodeAndProblems) {
  Build(ExpertsMode::kCopy);
  test::FlipByte(prep_.Join("resident.bin"), 0);
  const auto j = nlohmann::json::parse(RenderPreparedJson(Run(true)));
  EXPECT_EQ(j["exit_code"], 3);
  EXPECT_EQ(j["ok"], false);
  ASSERT_EQ(j["problems"].size(), 1u);
  EXPECT_EQ(j["problems"][0]["kind"], "integrity failure") << j.dump();
}

TEST_F(VerifyPreparedTest, CommandLineExitsWithTheVerdictCode) {
  Build(ExpertsMode::kCopy);
  const std::string dir = prep_.path();
  auto run = [&](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return Main(static_cast<int>(argv.size()), argv.data());
  };
  EXPECT_EQ(run({"k3verify", "--quiet", "prepared", dir, "--deep", "--json"}), 0);
  test::FlipByte(prep_.Join("trunk.bin"), RegionNamed(test::L(0, "input_layernorm.weight")).offset);
  EXPECT_EQ(run({"k3verify", "--quiet", "prepared", dir, "--deep"}), 3);
  EXPECT_EQ(run({"k3verify", "--quiet", "prepared", dir}), 0);
  EXPECT_EQ(run({"k3verify", "--quiet", "prepared"}), 2);
}

// --against: a real checkpoint packed by the test.
class VerifyAgainstTest : public ::testing::Test {
 protected:
  void Pack(ExpertsMode mode) {
    test::WriteTinyCheckpoint(model_.path());
    test::PackTiny(model_.path(), prep_.path(), mode);
  }
  PreparedReport Run() {
    PreparedOptions o;
    o.dir = prep_.path();
    o.deep = true;
    o.against = model_.path();
    o.jobs = 2;
    o.progress = ProgressMode::kNone;
    Result<PreparedReport> r = VerifyPrepared(Env::Default(), o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : PreparedReport{};
  }
  const st::CheckpointIndex::Location& Source(const std::string& name) {
    index_ = std::make_unique<st::CheckpointIndex>(
        std::move(st::CheckpointIndex::Open(Env::Default(), model_.path()).value()));
    const auto* loc = index_->Find(name);
    EXPECT_NE(loc, nullptr);
    return *loc;
  }

  test::TempDir model_;
  test::TempDir prep_;
  std::unique_ptr<st::CheckpointIndex> index_;
};

TEST_F(VerifyAgainstTest, CopyModeMatchesItsCheckpoint) {
  Pack(ExpertsMode::kCopy);
  const PreparedReport r = Run();
  EXPECT_TRUE(r.Verdict().ok()) << RenderPreparedText(r);
  // Every trunk/resident region and the tokenizer file, plus the 12 experts, were compared.
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), prep_.path());
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(r.items_compared, p->manifest.regions.size() - 1 + 12);
}

TEST_F(VerifyAgainstTest, LinkModeMatchesItsCheckpoint) {
  Pack(ExpertsMode::kLink);
  const PreparedReport r = Run();
  EXPECT_TRUE(r.Verdict().ok()) << RenderPreparedText(r);
  EXPECT_GT(r.items_compared, 12u);
}

TEST_F(VerifyAgainstTest, SourceChangedAfterPackingNamesFirstDifferingByte) {
  Pack(ExpertsMode::kCopy);
  // The packed copy stays self-consistent (--deep alone passes); only the comparison can tell.
  const std::string name = test::L(2, "self_attn.k_proj.weight");
  const auto& loc = Source(name);
  test::FlipByte(loc.shard->path, loc.file_offset() + 33);
  const PreparedReport r = Run();
  ASSERT_EQ(r.problems.size(), 1u) << RenderPreparedText(r);
  const Status& p = r.problems[0];
  EXPECT_EQ(p.code(), Code::kIntegrity);
  EXPECT_THAT(p.message(), HasSubstr("region \"" + name + "\""));
  EXPECT_THAT(p.message(), HasSubstr("first differing byte at offset 33 of the region"));
  EXPECT_THAT(p.message(), HasSubstr("source offset " + std::to_string(loc.file_offset() + 33)));
}

TEST_F(VerifyAgainstTest, ExpertSubTensorDifferenceNamesLayerExpertAndTensor) {
  Pack(ExpertsMode::kCopy);
  const std::string name = prepared::ExpertTensorName(2, 1, 3);  // w2.weight_scale
  const auto& loc = Source(name);
  test::FlipByte(loc.shard->path, loc.file_offset() + 2);
  const PreparedReport r = Run();
  ASSERT_EQ(r.problems.size(), 1u) << RenderPreparedText(r);
  EXPECT_EQ(r.problems[0].code(), Code::kIntegrity);
  EXPECT_THAT(r.problems[0].message(), HasSubstr("layer 2 expert 1"));
  EXPECT_THAT(r.problems[0].message(), HasSubstr("tensor \"" + name + "\""));
  // Offset inside the expert = the w2.weight_scale sub-offset (1024 + 64 + 1024) + 2.
  EXPECT_THAT(r.problems[0].message(), HasSubstr("first differing byte at offset 2114 "));
}

TEST_F(VerifyAgainstTest, AnotherCheckpointIsNotAccepted) {
  Pack(ExpertsMode::kCopy);
  test::TempDir other;
  test::WriteBytes(other.Join("tiktoken.model"), "x");
  const Status v = [&] {
    PreparedOptions o;
    o.dir = prep_.path();
    o.against = other.path();
    o.progress = ProgressMode::kNone;
    return VerifyPrepared(Env::Default(), o).value().Verdict();
  }();
  EXPECT_EQ(v.code(), Code::kInvalid);
  EXPECT_THAT(v.message(), HasSubstr("--against " + other.path()));
}

}  // namespace
}  // namespace k3::verify
