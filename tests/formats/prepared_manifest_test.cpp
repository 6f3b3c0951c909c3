// formats/prepared_manifest: k3.json schema and the pure validation rules (no file I/O except
// building the fixture). On-disk behaviour (k3.sum, truncation) is in prepared_dir_test.cpp.
#include "formats/prepared_manifest.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/formats/prepared_fixture.h"
#include "tests/support/temp_dir.h"

namespace k3::prepared {
namespace {

constexpr char kSource[] = "/p/k3.json";

class PreparedManifest : public ::testing::Test {
 protected:
  void SetUp() override { m_ = test::BuildPrepared(dir_.path(), prepared::ExpertsMode::kCopy); }

  prepared::Region& R(const std::string& name) {
    for (prepared::Region& r : m_.regions) {
      if (r.name == name) return r;
    }
    ADD_FAILURE() << "no region " << name;
    return m_.regions.front();
  }
  prepared::FileEntry& F(const std::string& path) {
    for (prepared::FileEntry& f : m_.files) {
      if (f.path == path) return f;
    }
    ADD_FAILURE() << "no file " << path;
    return m_.files.front();
  }
  void ExpectInvalid(std::initializer_list<std::string> parts) {
    Status s = prepared::ValidateManifest(m_, kSource);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), Code::kInvalid);
    for (const std::string& p : parts) {
      EXPECT_NE(s.message().find(p), std::string::npos)
          << "missing \"" << p << "\" in: " << s.message();
    }
  }
  // Renders m_, applies `edit` to the JSON, and parses the result.
  Status ParseEdited(const std::function<void(nlohmann::ordered_json&)>& edit) {
    Result<std::string> text = prepared::RenderManifest(m_);
    EXPECT_TRUE(text.ok()) << text.status().ToString();
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(text.value());
    edit(j);
    Result<prepared::Manifest> back = prepared::ParseManifest(j.dump(1), kSource);
    return back.ok() ? Status::Ok() : back.status();
  }

  test::TempDir dir_;
  prepared::Manifest m_;
};

void ExpectStatus(const Status& s, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kInvalid);
  for (const std::string& p : parts) {
    EXPECT_NE(s.message().find(p), std::string::npos) << "missing \"" << p << "\" in: " << s.message();
  }
}

const std::string kQProj = "language_model.model.layers.0.self_attn.q_proj.weight";

TEST_F(PreparedManifest, FixtureIsValid) { EXPECT_TRUE(prepared::ValidateManifest(m_, kSource).ok()); }

TEST_F(PreparedManifest, RenderParseRoundTrip) {
  Result<std::string> text = prepared::RenderManifest(m_);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  Result<prepared::Manifest> back = prepared::ParseManifest(*text, kSource);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(CanonicalConfigJson(back->config), CanonicalConfigJson(m_.config));
  EXPECT_EQ(back->source.model_dir_abs, m_.source.model_dir_abs);
  EXPECT_EQ(back->source.model_dir_given, "tiny");
  ASSERT_EQ(back->regions.size(), m_.regions.size());
  for (size_t i = 0; i < m_.regions.size(); ++i) {
    EXPECT_EQ(back->regions[i].name, m_.regions[i].name);
    EXPECT_EQ(back->regions[i].offset, m_.regions[i].offset);
    EXPECT_EQ(back->regions[i].length, m_.regions[i].length);
    EXPECT_EQ(back->regions[i].dtype, m_.regions[i].dtype);
    EXPECT_EQ(back->regions[i].shape, m_.regions[i].shape);
    EXPECT_EQ(back->regions[i].xxh3_128, m_.regions[i].xxh3_128);
  }
  EXPECT_EQ(back->experts_mode, prepared::ExpertsMode::kCopy);
  ASSERT_EQ(back->expert_files.size(), 3u);
  EXPECT_EQ(back->expert_files[0].path, "experts/layer-001.bin");
  // Canonical: rendering the parsed manifest gives the same bytes.
  Result<std::string> again = prepared::RenderManifest(*back);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *text);
}

// nlohmann throws out_of_range (not parse_error) for a number beyond a double; it escaped the
// reader as an internal error (found by prepared_manifest_fuzz).
TEST_F(PreparedManifest, NumberBeyondADoubleIsInvalidNotAnEscapingException) {
  Result<prepared::Manifest> r = prepared::ParseManifest(R"({"version": 1e999})", kSource);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalid);
  EXPECT_NE(r.status().message().find("malformed JSON"), std::string::npos)
      << r.status().message();
}

TEST_F(PreparedManifest, JsonCarriesTheDocumentedFields) {
  Result<std::string> text = prepared::RenderManifest(m_);
  ASSERT_TRUE(text.ok());
  nlohmann::json j = nlohmann::json::parse(*text);
  EXPECT_EQ(j["format"], "k3-prepared");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["config"]["hidden_size"], 64);
  EXPECT_EQ(j["experts_mode"], "copy");
  EXPECT_FALSE(j["source"]["shards"][0].contains("sha256"));  // none given: never invented
  const nlohmann::json& q = j["regions"][6];
  EXPECT_EQ(q["name"], kQProj);
  EXPECT_EQ(q["file"], "trunk.bin");
  EXPECT_EQ(q["offset"], 768);
  EXPECT_EQ(q["length"], 4096);
  EXPECT_EQ(q["dtype"], "BF16");
  EXPECT_EQ(q["shape"], nlohmann::json::array({32, 64}));
  EXPECT_EQ(q["xxh3_128"].get<std::string>().size(), 32u);
}

TEST_F(PreparedManifest, RegionOutsideItsFile) {
  R("language_model.model.output_attn_res_proj.weight").offset = 36864 - 64;
  ExpectInvalid({kSource, "output_attn_res_proj", "resident.bin", "lie outside", "36864 bytes"});
}

TEST_F(PreparedManifest, OverlappingRegions) {
  R("language_model.model.layers.0.self_attn.k_proj.weight").offset = 768 + 64;
  ExpectInvalid({kSource, "q_proj.weight", "k_proj.weight", "overlap", "trunk.bin",
                 "byte offset 832"});
}

TEST_F(PreparedManifest, DtypeMismatchVsConfig) {
  R(kQProj).dtype = DType::kF16;  // same size as BF16, so only the dtype rule can catch it
  ExpectInvalid({kSource, kQProj, "dtype F16", "BF16 or F32"});
}

TEST_F(PreparedManifest, ShapeMismatchVsConfig) {
  R(kQProj).shape = {64, 32};  // same byte count, transposed
  ExpectInvalid({kSource, kQProj, "[64, 32]", "[32, 64]"});
}

TEST_F(PreparedManifest, LengthNotNumelTimesDtypeSize) {
  R(kQProj).length = 4000;
  ExpectInvalid({kSource, kQProj, "length 4000", "numel"});
}

TEST_F(PreparedManifest, RegionNotAtItsCanonicalOffset) {
  // Slide layer 0's last tensor into the run's padding: no overlap, still inside the file.
  R("language_model.model.layers.0.mlp.down_proj.weight").offset += 64;
  ExpectInvalid({"mlp.down_proj.weight", "offset 38720", "places it at trunk.bin offset 38656"});
}

TEST_F(PreparedManifest, TrunkSizeNotTheLayouts) {
  F("trunk.bin").size += 4096;
  ExpectInvalid({"trunk.bin", "the layout needs"});
}

TEST_F(PreparedManifest, TrunkRunsDisagreeWithLayout) {
  m_.runs[2].length += 4096;
  ExpectInvalid({"trunk_runs[2]", "layer 2"});
}

TEST_F(PreparedManifest, RequiredFileNotListed) {
  m_.files.erase(m_.files.begin() + 1);
  ExpectInvalid({"resident.bin", "not listed"});
}

TEST_F(PreparedManifest, UnknownFileListed) {
  m_.files.push_back(prepared::FileEntry{"notes.txt", 1});
  ExpectInvalid({"notes.txt", "not a file of the prepared format"});
}

TEST_F(PreparedManifest, FilePathEscapingTheDirectory) {
  m_.files.push_back(prepared::FileEntry{"tokenizer/../../etc/passwd", 1});
  ExpectInvalid({"tokenizer/../../etc/passwd", "relative"});
}

TEST_F(PreparedManifest, WholeFileRegionMustCoverItsFile) {
  R("experts.idx").length -= 128;
  R("experts.idx").shape = {R("experts.idx").length};
  ExpectInvalid({"experts.idx", "exactly one region"});
}

TEST_F(PreparedManifest, RegionThatIsNotALayoutTensor) {
  m_.regions.push_back(prepared::Region{"junk", "trunk.bin", 44800, 64, DType::kU8, {64}, {}});
  ExpectInvalid({"\"junk\"", "not a tensor of the prepared layout"});
}

TEST_F(PreparedManifest, MissingTensorRegion) {
  m_.regions.erase(m_.regions.begin() + 6);
  ExpectInvalid({kQProj, "missing"});
}

TEST_F(PreparedManifest, DuplicateRegionName) {
  m_.regions.push_back(m_.regions[0]);
  ExpectInvalid({"listed twice"});
}

TEST_F(PreparedManifest, BadShardSha256) {
  m_.source.shards[0].sha256 = "xyz";
  ExpectInvalid({"source.shards[0]", "sha256", "64 lowercase hex"});
}

TEST_F(PreparedManifest, ModelDirMustBeAbsolute) {
  m_.source.model_dir_abs = "models/tiny";
  ExpectInvalid({"model_dir_abs", "absolute"});
}

TEST_F(PreparedManifest, CopyModeExpertFileOutsideExpertsDir) {
  m_.expert_files[0].path = "layer-001.bin";
  ExpectInvalid({"expert_files[0]", "under experts/ or absolute"});
}

TEST_F(PreparedManifest, LinkModeExpertFileMustBeAShard) {
  m_.experts_mode = prepared::ExpertsMode::kLink;
  ExpectInvalid({"expert_files[0]", "experts/layer-001.bin", "not one of source.shards"});
  m_.expert_files = {prepared::FileEntry{"other.safetensors", 5}};
  ExpectInvalid({"expert_files[0]", "not one of source.shards"});
  m_.expert_files = {prepared::FileEntry{"model.safetensors", 5}};
  ExpectInvalid({"expert_files[0]", "differs from source.shards size 123456"});
}

TEST_F(PreparedManifest, ExpertsMustBeMxfp4) {
  m_.config.experts_mxfp4 = false;
  ExpectInvalid({"experts_mxfp4", "MXFP4"});
}

// --- JSON schema rules ------------------------------------------------------------------------

TEST_F(PreparedManifest, BadFormatName) {
  ExpectStatus(ParseEdited([](auto& j) { j["format"] = "k3-download"; }),
               {kSource, ".format", "k3-prepared"});
}

TEST_F(PreparedManifest, BadVersion) {
  ExpectStatus(ParseEdited([](auto& j) { j["version"] = 2; }), {".version", "2 is not supported"});
}

TEST_F(PreparedManifest, UnknownKey) {
  ExpectStatus(ParseEdited([](auto& j) { j["regions"][3]["crc"] = 1; }),
               {"regions[3].crc", "unknown field"});
}

TEST_F(PreparedManifest, MissingKey) {
  ExpectStatus(ParseEdited([](auto& j) { j["regions"][2].erase("xxh3_128"); }),
               {"regions[2].xxh3_128", "missing"});
  ExpectStatus(ParseEdited([](auto& j) { j.erase("trunk_runs"); }), {".trunk_runs", "missing"});
}

TEST_F(PreparedManifest, BadRegionHash) {
  ExpectStatus(ParseEdited([](auto& j) { j["regions"][0]["xxh3_128"] = std::string(32, 'G'); }),
               {"regions[0].xxh3_128", "32 lowercase hex"});
}

TEST_F(PreparedManifest, UnknownDtype) {
  ExpectStatus(ParseEdited([](auto& j) { j["regions"][0]["dtype"] = "F4"; }),
               {"regions[0].dtype", "unknown dtype \"F4\""});
}

TEST_F(PreparedManifest, NegativeOffset) {
  ExpectStatus(ParseEdited([](auto& j) { j["regions"][0]["offset"] = -64; }),
               {"regions[0].offset", "unsigned integer"});
}

TEST_F(PreparedManifest, BadExpertsMode) {
  ExpectStatus(ParseEdited([](auto& j) { j["experts_mode"] = "symlink"; }),
               {".experts_mode", "\"link\" or \"copy\""});
}

TEST_F(PreparedManifest, ConfigNotCanonical) {
  // ParseModelConfig accepts a number for this boolean; the canonical form has true.
  ExpectStatus(ParseEdited([](auto& j) { j["config"]["mla_use_output_gate"] = 1; }),
               {"config.mla_use_output_gate", "canonical"});
  ExpectStatus(ParseEdited([](auto& j) { j["config"]["comment"] = "hi"; }),
               {"config.comment", "canonical"});
}

TEST_F(PreparedManifest, ConfigEditedToAnotherModel) {
  ExpectStatus(ParseEdited([](auto& j) { j["config"]["hidden_size"] = 128; }),
               {kSource, "regions do not match the config", "[128]"});
}

// The canonical form writes integers as integers; json's == would hold 64.0 equal to 64.
TEST_F(PreparedManifest, ConfigIntegerWrittenAsFloatRefused) {
  ExpectStatus(ParseEdited([](auto& j) { j["config"]["hidden_size"] = 64.0; }),
               {kSource, "config.hidden_size", "canonical"});
}

TEST_F(PreparedManifest, ConfigCountAboveItsBoundRefused) {
  ExpectStatus(ParseEdited([](auto& j) { j["config"]["num_experts"] = 70000; }),
               {kSource, "num_experts = 70000 exceeds the bound 65536"});
}

// Every byte size and offset in k3.json is at most 2^50, named by its JSON path.
TEST_F(PreparedManifest, ByteFieldsAboveTheBoundRefused) {
  const uint64_t over = (uint64_t{1} << 50) + 1;
  const std::string bound = "exceeds the bound 1125899906842624";
  ExpectStatus(ParseEdited([&](auto& j) { j["files"][0]["size"] = over; }),
               {"files[0].size", bound});
  ExpectStatus(ParseEdited([&](auto& j) { j["expert_files"][1]["size"] = over; }),
               {"expert_files[1].size", bound});
  ExpectStatus(ParseEdited([&](auto& j) { j["source"]["shards"][0]["size"] = over; }),
               {"source.shards[0].size", bound});
  ExpectStatus(ParseEdited([&](auto& j) { j["trunk_runs"][2]["offset"] = over; }),
               {"trunk_runs[2].offset", bound});
  ExpectStatus(ParseEdited([&](auto& j) { j["trunk_runs"][2]["length"] = over; }),
               {"trunk_runs[2].length", bound});
  ExpectStatus(ParseEdited([&](auto& j) { j["regions"][1]["offset"] = over; }),
               {"regions[1].offset", bound});
  ExpectStatus(ParseEdited([&](auto& j) { j["regions"][1]["length"] = over; }),
               {"regions[1].length", bound});
  ExpectStatus(ParseEdited([&](auto& j) { j["regions"][1]["shape"][0] = over; }),
               {"regions[1].shape", "dimension 1125899906842625", bound});
  ExpectStatus(ParseEdited([](auto& j) { j["trunk_runs"][2]["layer"] = 4096; }),
               {"trunk_runs[2].layer", "4096 exceeds the bound 4095"});
}

// The reader loads experts.idx whole, so its listed size must be the one the config implies.
TEST_F(PreparedManifest, ExpertsIdxSizeMustFollowFromTheConfig) {
  F("experts.idx").size += 128;
  R("experts.idx").length += 128;
  R("experts.idx").shape = {R("experts.idx").length};
  ExpectInvalid({kSource, "experts.idx is listed as", "12 records"});
}

TEST_F(PreparedManifest, DuplicateJsonKey) {
  Result<std::string> text = prepared::RenderManifest(m_);
  ASSERT_TRUE(text.ok());
  std::string t = *text;
  t.replace(t.find("\"experts_mode\""), 14, "\"experts_mode\": \"link\", \"experts_mode\"");
  Result<prepared::Manifest> back = prepared::ParseManifest(t, kSource);
  ExpectStatus(back.status(), {kSource, "duplicate key \"experts_mode\""});
}

TEST_F(PreparedManifest, WriterRefusesAnInvalidManifest) {
  test::TempDir out;
  R(kQProj).shape = {64, 32};
  EXPECT_EQ(prepared::WriteManifestAndSum(Env::Default(), out.path(), m_).code(), Code::kInvalid);
  EXPECT_TRUE(out.List().empty());
}

// ---- "share": one rank's share of the experts (formats/expert_share.h) ------------------------

TEST_F(PreparedManifest, FullDirectoryRendersNoShareKey) {
  Result<std::string> text = prepared::RenderManifest(m_);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->find("\"share\""), std::string::npos);
  Result<prepared::Manifest> back = prepared::ParseManifest(*text, kSource);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_FALSE(back->share.has_value());
}

TEST_F(PreparedManifest, ShareRenderParseRoundTrip) {
  m_.share = prepared::ExpertShare{2, 1, "contiguous"};
  Result<std::string> text = prepared::RenderManifest(m_);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_NE(text->find("\"experts_mode\": \"copy\",\n \"share\": {\n  \"ranks\": 2,\n  \"rank\": 1,\n"
                       "  \"map\": \"contiguous\"\n },\n \"files\""),
            std::string::npos)
      << *text;
  Result<prepared::Manifest> back = prepared::ParseManifest(*text, kSource);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_TRUE(back->share.has_value());
  EXPECT_EQ(back->share->ranks, 2u);
  EXPECT_EQ(back->share->rank, 1u);
  EXPECT_EQ(back->share->map, "contiguous");
  Result<std::string> again = prepared::RenderManifest(*back);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *text);
}

TEST_F(PreparedManifest, ShareUnknownKeyRefused) {
  m_.share = prepared::ExpertShare{2, 0, "contiguous"};
  ExpectStatus(ParseEdited([](auto& j) { j["share"]["weights"] = "x"; }),
               {".share.weights", "unknown field"});
}

TEST_F(PreparedManifest, ShareMissingKeyRefused) {
  m_.share = prepared::ExpertShare{2, 0, "contiguous"};
  ExpectStatus(ParseEdited([](auto& j) { j["share"].erase("map"); }), {".share.map", "missing"});
}

TEST_F(PreparedManifest, ShareWrongTypesRefused) {
  m_.share = prepared::ExpertShare{2, 0, "contiguous"};
  ExpectStatus(ParseEdited([](auto& j) { j["share"] = 2; }), {".share", "expected an object"});
  ExpectStatus(ParseEdited([](auto& j) { j["share"]["ranks"] = "2"; }),
               {".share.ranks", "unsigned integer"});
  ExpectStatus(ParseEdited([](auto& j) { j["share"]["rank"] = -1; }),
               {".share.rank", "unsigned integer"});
}

TEST_F(PreparedManifest, ShareRanksZeroRefused) {
  m_.share = prepared::ExpertShare{2, 0, "contiguous"};
  ExpectStatus(ParseEdited([](auto& j) { j["share"]["ranks"] = 0; }),
               {kSource, "share.ranks", "0 ranks is out of range"});
}

TEST_F(PreparedManifest, ShareRanksAboveTheExpertsRefused) {
  m_.share = prepared::ExpertShare{2, 0, "contiguous"};  // the fixture has 4 experts
  ExpectStatus(ParseEdited([](auto& j) { j["share"]["ranks"] = 5; }),
               {"share.ranks", "5 ranks", "1 to 4"});
  ExpectStatus(ParseEdited([](auto& j) { j["share"]["ranks"] = 1ull << 40; }),
               {".share.ranks", "exceeds the bound 4096"});
}

TEST_F(PreparedManifest, ShareRankNotBelowRanksRefused) {
  m_.share = prepared::ExpertShare{2, 0, "contiguous"};
  ExpectStatus(ParseEdited([](auto& j) { j["share"]["rank"] = 2; }),
               {"share.rank", "2 is not below share.ranks 2"});
}

TEST_F(PreparedManifest, ShareMapOtherThanContiguousRefused) {
  m_.share = prepared::ExpertShare{2, 0, "contiguous"};
  ExpectStatus(ParseEdited([](auto& j) { j["share"]["map"] = "x"; }),
               {"share.map", "\"x\" is not \"contiguous\""});
}

}  // namespace
}  // namespace k3::prepared
