#include "k3verify/verify_shards.h"

#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "formats/download_manifest.h"
#include "formats/safetensors.h"
#include "tests/k3verify/mini_pack.h"
#include "tests/support/fault_env.h"
#include "tests/support/temp_dir.h"

namespace k3::verify {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// SHA-256 by the coreutils tool, so expectations do not come from the code under test.
std::string Sha256sum(const std::string& path) {
  std::string cmd = "sha256sum '" + path + "'";
  FILE* p = popen(cmd.c_str(), "r");
  char buf[65] = {};
  const size_t n = p ? std::fread(buf, 1, 64, p) : 0;
  if (p) pclose(p);
  return std::string(buf, n);
}

void WriteShard(const std::string& path, const std::vector<std::string>& names) {
  st::Writer w(Env::Default(), path);
  for (const auto& n : names) w.Add(n, DType::kF32, {4});
  ASSERT_TRUE(w.Begin().ok());
  for (size_t i = 0; i < names.size(); ++i) {
    float v[4] = {1.0f * static_cast<float>(i), 2, 3, 4};
    ASSERT_TRUE(w.Append(v, sizeof(v)).ok());
  }
  ASSERT_TRUE(w.Finish().ok());
}

class VerifyShardsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteShard(dir_.Join("model-00001-of-000002.safetensors"), {"a.weight", "b.weight"});
    WriteShard(dir_.Join("model-00002-of-000002.safetensors"), {"c.weight"});
    std::filesystem::copy_file(std::string(K3_SOURCE_DIR) + "/tests/data/config/released_config.json",
                               dir_.Join("config.json"));
    // These shards hold stand-in tensors, not the released config's: the index says which
    // tensors the checkpoint has (without one, the config's tensors are required; see the
    // WithoutIndex tests).
    std::ofstream(dir_.Join("model.safetensors.index.json"))
        << R"({"weight_map": {"a.weight": "model-00001-of-000002.safetensors",
                              "b.weight": "model-00001-of-000002.safetensors",
                              "c.weight": "model-00002-of-000002.safetensors"}})";
  }

  std::string Shard(int i) const {
    return dir_.Join("model-0000" + std::to_string(i) + "-of-000002.safetensors");
  }

  // A manifest listing every file with sizes and hashes taken from sha256sum.
  void WriteManifest(const std::string& path) {
    dl::DownloadManifest m;
    m.repo = "moonshotai/Kimi-K3";
    m.commit = std::string(40, 'a');
    m.endpoint = "https://hub.example";
    for (const char* name : {"config.json", "model-00001-of-000002.safetensors",
                             "model-00002-of-000002.safetensors"}) {
      dl::DownloadFile f;
      f.path = name;
      f.size = std::filesystem::file_size(dir_.Join(name));
      f.sha256 = Sha256sum(dir_.Join(name));
      f.verified_at = "2026-11-29T08:00:00Z";
      m.files.push_back(f);
    }
    ASSERT_TRUE(dl::WriteDownloadManifest(Env::Default(), path, m).ok());
  }

  ShardsReport Run(Env* env = Env::Default(), std::string manifest = "") {
    ShardsOptions o;
    o.model_dir = dir_.path();
    o.manifest = std::move(manifest);
    o.progress = ProgressMode::kNone;
    auto r = VerifyShards(env, o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : ShardsReport{};
  }

  test::TempDir dir_;
};

TEST_F(VerifyShardsTest, GoodCheckpointWithoutManifestPrintsHashes) {
  ShardsReport r = Run();
  EXPECT_TRUE(r.Verdict().ok()) << r.Verdict().ToString();
  ASSERT_EQ(r.shards.size(), 2u);
  EXPECT_EQ(r.shards[0].sha256, Sha256sum(Shard(1)));
  EXPECT_EQ(r.shards[1].sha256, Sha256sum(Shard(2)));
  EXPECT_EQ(r.total_tensors, 3u);
  EXPECT_THAT(RenderShardsText(r), HasSubstr("no download manifest"));
}

TEST_F(VerifyShardsTest, GoodCheckpointMatchesManifestFoundInDirectory) {
  WriteManifest(dir_.Join("k3-download.json"));
  ShardsReport r = Run();
  EXPECT_TRUE(r.Verdict().ok()) << r.Verdict().ToString();
  EXPECT_EQ(r.manifest_path, dir_.Join("k3-download.json"));
  EXPECT_EQ(r.shards[0].expected_sha256, r.shards[0].sha256);
}

TEST_F(VerifyShardsTest, FlippedByteIsAnIntegrityFailureNamingTheShard) {
  WriteManifest(dir_.Join("k3-download.json"));
  {
    std::fstream f(Shard(2), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  const Status v = Run().Verdict();
  EXPECT_EQ(v.code(), Code::kIntegrity);
  EXPECT_THAT(v.message(), HasSubstr("model-00002-of-000002.safetensors"));
  EXPECT_THAT(v.message(), HasSubstr("SHA-256"));
}

TEST_F(VerifyShardsTest, EveryStructurallyBadShardIsNamed) {
  std::filesystem::resize_file(Shard(1), std::filesystem::file_size(Shard(1)) - 1);
  std::filesystem::resize_file(Shard(2), 5);
  ShardsReport r = Run();
  EXPECT_EQ(r.Verdict().code(), Code::kInvalid);
  ASSERT_EQ(r.shards.size(), 2u);
  EXPECT_FALSE(r.shards[0].problems.empty());
  EXPECT_FALSE(r.shards[1].problems.empty());
  EXPECT_THAT(r.shards[0].problems[0].message(), HasSubstr("model-00001-of-000002.safetensors"));
  EXPECT_THAT(r.shards[1].problems[0].message(), HasSubstr("model-00002-of-000002.safetensors"));
}

// A FIFO named like a shard blocked the audit forever in open(2); it is a problem naming it.
TEST_F(VerifyShardsTest, FifoNamedLikeAShardIsRefusedNotWaitedOn) {
  std::filesystem::remove(Shard(2));
  ASSERT_EQ(::mkfifo(Shard(2).c_str(), 0644), 0);
  const Status v = Run().Verdict();
  EXPECT_EQ(v.code(), Code::kInvalid);
  EXPECT_THAT(v.message(), HasSubstr(Shard(2) + ": is a FIFO (named pipe), expected a regular file"));
}

TEST_F(VerifyShardsTest, SizeMismatchWithManifestIsIntegrityFailure) {
  WriteManifest(dir_.Join("k3-download.json"));
  // Same structure, one more tensor: a valid shard whose size differs from the manifest.
  std::filesystem::remove(Shard(2));
  WriteShard(Shard(2), {"c.weight", "d.weight"});
  const Status v = Run().Verdict();
  EXPECT_EQ(v.code(), Code::kIntegrity);
  EXPECT_THAT(v.message(), HasSubstr("the manifest says"));
}

TEST_F(VerifyShardsTest, FileListedInManifestButMissingIsNamed) {
  WriteManifest(dir_.Join("k3-download.json"));
  std::filesystem::remove(dir_.Join("config.json"));
  ShardsReport r = Run();
  EXPECT_EQ(r.Verdict().code(), Code::kIntegrity);
  bool named = false;
  for (const Status& p : r.problems) named = named || p.message().find("config.json: listed") == 0;
  EXPECT_TRUE(named) << RenderShardsText(r);
}

TEST_F(VerifyShardsTest, ShardNotInManifestIsNamed) {
  const std::string manifest = dir_.Join("elsewhere.json");
  WriteManifest(manifest);
  WriteShard(dir_.Join("model-extra.safetensors"), {"e.weight"});
  ShardsReport r = Run(Env::Default(), manifest);
  const Status v = r.Verdict();
  EXPECT_EQ(v.code(), Code::kIntegrity);
  EXPECT_THAT(v.message(), HasSubstr("model-extra.safetensors: not listed"));
}

TEST_F(VerifyShardsTest, MissingConfigIsInvalid) {
  std::filesystem::remove(dir_.Join("config.json"));
  const Status v = Run().Verdict();
  EXPECT_EQ(v.code(), Code::kInvalid);
  EXPECT_THAT(v.message(), HasSubstr("config.json: missing"));
}

// Without model.safetensors.index.json the tensors are checked against config.json: a complete
// checkpoint (the tiny one, two shards) passes ...
TEST(VerifyShardsWithoutIndex, CompleteCheckpointVerifies) {
  test::TempDir dir;
  test::WriteTinyCheckpoint(dir.path());
  ShardsOptions o;
  o.model_dir = dir.path();
  o.progress = ProgressMode::kNone;
  Result<ShardsReport> r = VerifyShards(Env::Default(), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->Verdict().ok()) << r->Verdict().ToString();
}

// ... and one missing a shard (an interrupted synth: some shards never got their final name)
// fails naming each incomplete layer, how much is missing and the first missing tensor.
TEST(VerifyShardsWithoutIndex, MissingShardFailsNamingLayersAndTensors) {
  test::TempDir dir;
  test::WriteTinyCheckpoint(dir.path());
  std::filesystem::remove(dir.Join(test::kShard1));  // layers 0 and 1
  ShardsOptions o;
  o.model_dir = dir.path();
  o.progress = ProgressMode::kNone;
  Result<ShardsReport> r = VerifyShards(Env::Default(), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const Status v = r->Verdict();
  EXPECT_EQ(v.code(), Code::kInvalid);
  EXPECT_EQ(v.exit_code(), 2);
  const std::string text = RenderShardsText(*r);
  EXPECT_THAT(text, HasSubstr("69 tensor(s) that config.json implies are in no shard, in 2 "
                              "layer(s)/unit(s)"));
  // Layer 0: 6 norms/residuals + 14 KDA + 3 dense FFN; layer 1: 6 + 8 MLA + 8 MoE + 4 x 6 experts.
  EXPECT_THAT(text, HasSubstr("layer 0: 23 of 23 tensors missing; first: "
                              "language_model.model.layers.0.input_layernorm.weight"));
  EXPECT_THAT(text, HasSubstr("layer 1: 46 of 46 tensors missing; first: "
                              "language_model.model.layers.1.input_layernorm.weight"));
  EXPECT_THAT(text, Not(HasSubstr("layer 2:")));
  EXPECT_THAT(text, Not(HasSubstr("verdict: OK")));
}

// One expert tensor gone: the summary counts it within its layer.
TEST(VerifyShardsWithoutIndex, OneMissingExpertTensorIsNamed) {
  test::TempDir dir;
  test::WriteTinyCheckpoint(dir.path());
  // Rewrite shard 2 without one expert tensor of layer 3.
  const std::string gone = "language_model.model.layers.3.block_sparse_moe.experts.2.w2.weight_scale";
  Result<st::CheckpointIndex> index = st::CheckpointIndex::Open(Env::Default(), dir.path());
  ASSERT_TRUE(index.ok());
  std::vector<std::pair<st::TensorInfo, std::string>> keep;
  for (const auto& loc : index->All()) {
    if (loc.shard->name != test::kShard2 || loc.tensor->name == gone) continue;
    keep.emplace_back(*loc.tensor, test::SourceBytes(*index, loc.tensor->name));
  }
  st::Writer w(Env::Default(), dir.Join(test::kShard2));
  for (const auto& [t, bytes] : keep) w.Add(t.name, t.dtype, t.shape);
  ASSERT_TRUE(w.Begin().ok());
  for (const auto& [t, bytes] : keep) ASSERT_TRUE(w.Append(bytes.data(), bytes.size()).ok());
  ASSERT_TRUE(w.Finish().ok());
  ShardsOptions o;
  o.model_dir = dir.path();
  o.progress = ProgressMode::kNone;
  Result<ShardsReport> r = VerifyShards(Env::Default(), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->Verdict().code(), Code::kInvalid);
  EXPECT_THAT(RenderShardsText(*r), HasSubstr("layer 3: 1 of 46 tensors missing; first: " + gone));
}

TEST_F(VerifyShardsTest, TensorInTwoShardsIsInvalid) {
  WriteShard(dir_.Join("model-00003-of-000002.safetensors"), {"a.weight"});
  const Status v = Run().Verdict();
  EXPECT_EQ(v.code(), Code::kInvalid);
  EXPECT_THAT(v.message(), HasSubstr("a.weight"));
}

TEST_F(VerifyShardsTest, ReadErrorWhileHashingIsIoNamingTheShard) {
  test::FaultEnv env;
  // The header parses (read at offset 0); the hash read of the data fails.
  env.SetRule(Shard(1), test::FaultRule::EioAt(100));
  ShardsReport r = Run(&env);
  const Status v = r.Verdict();
  EXPECT_EQ(v.code(), Code::kIo) << v.ToString();
  EXPECT_THAT(v.message(), HasSubstr("model-00001-of-000002.safetensors"));
}

TEST_F(VerifyShardsTest, NotADirectoryIsRefused) {
  ShardsOptions o;
  o.model_dir = Shard(1);
  auto r = VerifyShards(Env::Default(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalid);
}

TEST_F(VerifyShardsTest, JsonReportCarriesVerdictAndHashes) {
  ShardsReport r = Run();
  auto j = nlohmann::json::parse(RenderShardsJson(r));
  EXPECT_EQ(j["exit_code"], 0);
  EXPECT_EQ(j["shards"][0]["sha256"], Sha256sum(Shard(1)));
  EXPECT_TRUE(j["manifest"].is_null());
}

}  // namespace
}  // namespace k3::verify
