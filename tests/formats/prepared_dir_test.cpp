// formats/prepared_manifest (directory level): k3.sum before k3.json, file sizes on disk,
// experts.idx against k3.json, link-mode shard resolution, interrupted writes.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/hash.h"
#include "tests/support/fault_env.h"
#include "formats/prepared_manifest.h"
#include "tests/formats/prepared_fixture.h"
#include "tests/support/temp_dir.h"

namespace k3::prepared {
namespace {

using test::ReadBytes;
using test::WriteBytes;

void ExpectError(const Status& s, Code code, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), code) << s.ToString();
  for (const std::string& p : parts) {
    EXPECT_NE(s.message().find(p), std::string::npos) << "missing \"" << p << "\" in: " << s.message();
  }
}

Status OpenStatus(const std::string& dir, const prepared::OpenOptions& options = {}) {
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), dir, options);
  return p.ok() ? Status::Ok() : p.status();
}

// Rewrites k3.json as `text` with a matching k3.sum, as a careless editor with xxhsum would.
void ResumJson(const std::string& dir, const std::string& text) {
  WriteBytes(dir + "/k3.json", text);
  WriteBytes(dir + "/k3.sum",
             "xxh3-128 " + Xxh3_128(text.data(), text.size()).Hex() + " k3.json\n");
}

class PreparedDirTest : public ::testing::Test {
 protected:
  void SetUp() override { m_ = test::BuildPrepared(dir_.path(), prepared::ExpertsMode::kCopy); }
  std::string P(const std::string& name) const { return dir_.Join(name); }
  // Writes experts.idx as `bytes` and records their hash in k3.json (and k3.sum), so the
  // decoder behind the hash check sees them, as after a hostile or buggy pack.
  void WriteIndexRehashed(const std::string& bytes) {
    WriteBytes(P("experts.idx"), bytes);
    for (prepared::Region& r : m_.regions) {
      if (r.name == "experts.idx") r.xxh3_128 = Xxh3_128(bytes.data(), bytes.size());
    }
    ASSERT_TRUE(prepared::WriteManifestAndSum(Env::Default(), dir_.path(), m_).ok());
  }
  test::TempDir dir_;
  prepared::Manifest m_;
};

TEST_F(PreparedDirTest, OpensAFreshCopyModeDirectory) {
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), dir_.path());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->manifest.experts_mode, prepared::ExpertsMode::kCopy);
  EXPECT_EQ(p->experts.records.size(), 12u);
  ASSERT_EQ(p->expert_paths.size(), 3u);
  EXPECT_EQ(p->expert_paths[1], dir_.Join("experts/layer-002.bin"));
  EXPECT_EQ(p->manifest.config.hidden, 64);
}

TEST_F(PreparedDirTest, SumFileIsTheDocumentedLine) {
  const std::string json = ReadBytes(P("k3.json"));
  EXPECT_EQ(ReadBytes(P("k3.sum")),
            "xxh3-128 " + Xxh3_128(json.data(), json.size()).Hex() + " k3.json\n");
  EXPECT_EQ(prepared::RenderSumLine("abc").size(), 9u + 32u + 9u);
}

TEST_F(PreparedDirTest, K3SumMismatchIsAnIntegrityFailure) {
  std::string json = ReadBytes(P("k3.json"));
  json[json.find("\"tiny\"") + 1] = 'T';  // still valid JSON: only the sum can tell
  WriteBytes(P("k3.json"), json);
  ExpectError(OpenStatus(dir_.path()), Code::kIntegrity, {"k3.json", "k3.json altered"});
}

TEST_F(PreparedDirTest, K3SumMissingIsInvalid) {
  std::filesystem::remove(P("k3.sum"));
  ExpectError(OpenStatus(dir_.path()), Code::kInvalid, {"k3.sum", "missing"});
}

TEST_F(PreparedDirTest, MalformedK3SumLine) {
  const std::string hex = Xxh3_128(nullptr, 0).Hex();
  std::string upper = hex;
  for (char& c : upper) c = static_cast<char>(toupper(c));
  for (const std::string& bad :
       {"xxh3-128 " + upper + " k3.json\n", "xxh3-128 " + hex + " k3.json",
        "xxh3-128  " + hex + " k3.json\n", "xxh128 " + hex + " k3.json\n",
        "xxh3-128 " + hex + " k3.json\nxxh3-128 " + hex + " k3.json\n",
        "xxh3-128 " + hex + " other.json\n", std::string("")}) {
    WriteBytes(P("k3.sum"), bad);
    ExpectError(OpenStatus(dir_.path()), Code::kInvalid, {"k3.sum", "malformed"});
  }
}

TEST_F(PreparedDirTest, ValidJsonThatFailsValidationIsInvalidNotIntegrity) {
  std::string json = ReadBytes(P("k3.json"));
  json.replace(json.find("\"k3-prepared\""), 13, "\"k3-unknown\"");
  ResumJson(dir_.path(), json);
  ExpectError(OpenStatus(dir_.path()), Code::kInvalid, {"k3.json", ".format"});
}

// A billion layers in k3.json (with a matching k3.sum) used to make every reader loop over the
// layers for hours; the config's bound refuses it before anything is sized from it.
TEST_F(PreparedDirTest, BillionLayersInK3JsonRefusedNamingTheField) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(ReadBytes(P("k3.json")));
  j["config"]["num_hidden_layers"] = 1000000000;
  ResumJson(dir_.path(), j.dump(1) + "\n");
  ExpectError(OpenStatus(dir_.path()), Code::kInvalid,
              {"k3.json", "num_hidden_layers = 1000000000 exceeds the bound 4096"});
}

TEST_F(PreparedDirTest, TruncatedTrunkIsNamed) {
  std::filesystem::resize_file(P("trunk.bin"), m_.files[0].size - 4096);
  ExpectError(OpenStatus(dir_.path()), Code::kInvalid, {P("trunk.bin"), "truncated"});
}

TEST_F(PreparedDirTest, MissingResidentIsNamed) {
  std::filesystem::remove(P("resident.bin"));
  Status s = OpenStatus(dir_.path());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("resident.bin"), std::string::npos) << s.ToString();
}

// experts.idx is hashed before it is decoded: any change is "altered", whatever it breaks.
TEST_F(PreparedDirTest, ExpertsIdxAlteredIsAnIntegrityFailureBeforeDecoding) {
  std::string idx = ReadBytes(P("experts.idx"));
  idx[0] = 'X';
  WriteBytes(P("experts.idx"), idx);
  ExpectError(OpenStatus(dir_.path()), Code::kIntegrity,
              {P("experts.idx"), "experts.idx altered", "k3.json records"});
}

TEST_F(PreparedDirTest, ExpertsIdxBadMagicIsNamed) {
  std::string idx = ReadBytes(P("experts.idx"));
  idx[0] = 'X';
  ASSERT_NO_FATAL_FAILURE(WriteIndexRehashed(idx));
  ExpectError(OpenStatus(dir_.path()), Code::kInvalid, {P("experts.idx"), "magic"});
}

TEST_F(PreparedDirTest, ExpertsIdxPathTableMustMatchManifest) {
  std::string idx = ReadBytes(P("experts.idx"));
  const size_t at = idx.find("layer-002");
  idx[at + 8] = '9';  // experts/layer-009.bin
  ASSERT_NO_FATAL_FAILURE(WriteIndexRehashed(idx));
  ExpectError(OpenStatus(dir_.path()), Code::kInvalid,
              {"experts/layer-009.bin", "differs from k3.json expert_files[1]"});
}

TEST_F(PreparedDirTest, TruncatedExpertFileIsNamed) {
  std::filesystem::resize_file(P("experts/layer-003.bin"), 100);
  ExpectError(OpenStatus(dir_.path()), Code::kInvalid,
              {P("experts/layer-003.bin"), "100 bytes", "16384"});
  prepared::OpenOptions skip;
  skip.check_expert_files = false;  // k3verify can still report the structure
  EXPECT_TRUE(OpenStatus(dir_.path(), skip).ok());
}

TEST(PreparedDirLink, ResolvesShardsUnderModelDirAndHonoursOverride) {
  test::TempDir prepared, model, moved;
  test::BuildPrepared(prepared.path(), prepared::ExpertsMode::kLink, model.path());
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), prepared.path());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->expert_paths[0], model.Join("model.safetensors"));
  EXPECT_EQ(p->manifest.source.shards[0].sha256, std::string(64, 'e'));

  std::filesystem::rename(model.Join("model.safetensors"), moved.Join("model.safetensors"));
  ExpectError(OpenStatus(prepared.path()), Code::kInvalid,
              {model.Join("model.safetensors"), "missing", "--model-dir"});
  prepared::OpenOptions relocated;
  relocated.model_dir = moved.path();
  Result<prepared::PreparedDir> again = prepared::OpenPrepared(Env::Default(), prepared.path(), relocated);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->expert_paths[0], moved.Join("model.safetensors"));
}

TEST(PreparedDirWrite, InterruptedSumWriteLeavesNothingThatOpens) {
  test::TempDir dir;
  prepared::Manifest m = test::BuildPrepared(dir.path(), prepared::ExpertsMode::kCopy);
  test::FaultEnv env;
  env.SetRule(dir.Join("k3.sum"), test::FaultRule::RenameFails());
  Status s = prepared::WriteManifestAndSum(&env, dir.path(), m);
  EXPECT_FALSE(s.ok());
  // The old sum was removed first and the new one never landed: "unfinished", not "tampered".
  EXPECT_FALSE(std::filesystem::exists(dir.Join("k3.sum")));
  ExpectError(OpenStatus(dir.path()), Code::kInvalid, {"k3.sum", "missing"});
  for (const std::string& name : dir.List()) EXPECT_EQ(name.find(".k3tmp"), std::string::npos) << name;
}

TEST(PreparedDirWrite, InterruptedJsonWriteLeavesNoSum) {
  test::TempDir dir;
  prepared::Manifest m = test::BuildPrepared(dir.path(), prepared::ExpertsMode::kCopy);
  test::FaultEnv env;
  env.SetRule(dir.Join("k3.json"), test::FaultRule::EnospcAfter(100));
  EXPECT_FALSE(prepared::WriteManifestAndSum(&env, dir.path(), m).ok());
  EXPECT_FALSE(std::filesystem::exists(dir.Join("k3.sum")));
  EXPECT_EQ(OpenStatus(dir.path()).code(), Code::kInvalid);
}

// ---- shares: experts.idx's absent records against k3.json's share --------------------------

// Marks absent every record `absent(layer, expert)` picks, sets (or clears) the share and reseals
// experts.idx, k3.json and k3.sum, as a hostile or buggy split would.
class PreparedShareTest : public PreparedDirTest {
 protected:
  void Reshare(std::optional<prepared::ExpertShare> share,
               const std::function<bool(uint32_t, uint32_t)>& absent) {
    Result<prepared::ExpertsIndex> idx =
        prepared::DecodeExpertsIndex(ReadBytes(P("experts.idx")), "experts.idx");
    ASSERT_TRUE(idx.ok()) << idx.status().ToString();
    for (uint32_t layer = idx->first_moe_layer; layer < idx->n_layers; ++layer) {
      for (uint32_t e = 0; e < idx->n_experts; ++e) {
        if (absent(layer, e)) idx->records[idx->RecordIndex(layer, e)] = prepared::MakeAbsentRecord();
      }
    }
    m_.share = std::move(share);
    ASSERT_NO_FATAL_FAILURE(WriteIndexRehashed(prepared::EncodeExpertsIndex(*idx)));
  }
};

// 4 experts over 2 ranks: rank 1 holds 2-3.
bool NotRank1(uint32_t, uint32_t e) { return e < 2; }

TEST_F(PreparedShareTest, ShareWithTheOtherRanksExpertsAbsentOpens) {
  ASSERT_NO_FATAL_FAILURE(Reshare(prepared::ExpertShare{2, 1, "contiguous"}, NotRank1));
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), dir_.path());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_TRUE(p->manifest.share.has_value());
  EXPECT_EQ(p->manifest.share->rank, 1u);
  EXPECT_TRUE(p->experts.At(2, 0).absent());
  EXPECT_FALSE(p->experts.At(2, 3).absent());
}

TEST_F(PreparedShareTest, AbsentRecordsNotMatchingTheMapRefused) {
  // Rank 1's share, but expert 2 of layer 3 is absent too.
  ASSERT_NO_FATAL_FAILURE(Reshare(prepared::ExpertShare{2, 1, "contiguous"},
                                  [](uint32_t layer, uint32_t e) { return e < 2 || (layer == 3 && e == 2); }));
  ExpectError(OpenStatus(dir_.path()), Code::kInvalid,
              {P("experts.idx"), "record 10 (layer 3, expert 2)", "absent, but k3.json's share",
               "rank 1 of 2 holds experts 2..3"});
}

TEST_F(PreparedShareTest, PresentRecordOfAnotherRankRefused) {
  // Labelled rank 0's share, but it holds rank 1's experts.
  ASSERT_NO_FATAL_FAILURE(Reshare(prepared::ExpertShare{2, 0, "contiguous"}, NotRank1));
  ExpectError(OpenStatus(dir_.path()), Code::kInvalid,
              {"record 0 (layer 1, expert 0)", "absent, but k3.json's share says this directory "
               "holds it"});
}

TEST_F(PreparedShareTest, AbsentRecordWithoutAShareRefused) {
  ASSERT_NO_FATAL_FAILURE(Reshare(std::nullopt, NotRank1));
  ExpectError(OpenStatus(dir_.path()), Code::kInvalid,
              {P("experts.idx"), "record 0 (layer 1, expert 0)",
               "absent, but k3.json has no share"});
}

TEST_F(PreparedShareTest, ShareWithoutAbsentRecordsRefused) {
  ASSERT_NO_FATAL_FAILURE(
      Reshare(prepared::ExpertShare{2, 1, "contiguous"}, [](uint32_t, uint32_t) { return false; }));
  ExpectError(OpenStatus(dir_.path()), Code::kInvalid,
              {"record 0 (layer 1, expert 0)", "present, but k3.json's share does not hold it",
               "rank 0's"});
}

}  // namespace
}  // namespace k3::prepared
