// k3run's command line: exit codes (DESIGN.md §6), validation messages, stdout, the JSON report
// and --dump-logits. Each validation rule has its own test with a malformed input.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/env.h"
#include "formats/experts_index.h"
#include "formats/tiktoken.h"
#include "k3run/kernels/matmul.h"
#include "tests/k3run/engine_fixture.h"
#include "tests/support/files.h"
#include "tests/support/temp_dir.h"

namespace k3::run::testing {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const std::string& path) { return test::ReadWholeFile(path); }

bool Has(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

// The decoded experts.idx of a prepared directory (the test fails when it does not decode).
prepared::ExpertsIndex DecodedIndex(const std::string& dir) {
  Result<std::string> bytes = ReadFileToString(Env::Default(), dir + "/experts.idx");
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  Result<prepared::ExpertsIndex> idx =
      prepared::DecodeExpertsIndex(bytes.ok() ? *bytes : std::string(), "experts.idx");
  EXPECT_TRUE(idx.ok()) << idx.status().ToString();
  return idx.ok() ? *idx : prepared::ExpertsIndex();
}

// A private copy of the prepared directory a test may damage.
std::string CopyPrepared(const test::TempDir& tmp) {
  const std::string dst = tmp.Join("prep");
  fs::copy(TinyPreparedDir(), dst, fs::copy_options::recursive);
  return dst;
}

TEST(K3runCli, SuccessExitsZeroAndWritesGeneratedBytes) {
  const CliRun r =
      RunCliArgs({TinyPreparedDir(), "--ids", kPromptText, "--gen", "5", "--verbose"});
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_FALSE(r.stdout_text().empty());
  EXPECT_TRUE(Has(r.stderr_text, "step 0 (prefill, 8 tokens)")) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "step 4 (decode, 1 token)")) << r.stderr_text;
}

TEST(K3runCli, StepLinesOnlyWithVerbose) {
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--ids", kPromptText, "--gen", "5"});
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_FALSE(Has(r.stderr_text, "step ")) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "plan: ")) << r.stderr_text;
}

TEST(K3runCli, IdOutsideVocabIsExit2NamingIdAndVocab) {
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--ids", "1,1280", "--gen", "1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.stderr_text, "--ids: id 1280 (item 2)")) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "[0, 1280)")) << r.stderr_text;
  EXPECT_TRUE(r.stdout_writes.empty());
}

TEST(K3runCli, MalformedIdListIsExit2NamingTheItem) {
  for (const std::string bad : {"1,,2", "1,x", "-1", "1 ,2", "", "99999999999"}) {
    const CliRun r = RunCliArgs({TinyPreparedDir(), "--ids", bad, "--gen", "1"});
    EXPECT_EQ(r.exit_code, 2) << bad;
    EXPECT_TRUE(Has(r.stderr_text, "--ids") || Has(r.stderr_text, "no prompt")) << r.stderr_text;
  }
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--ids", "4,5,x7", "--gen", "1"});
  EXPECT_TRUE(Has(r.stderr_text, "item 3 (\"x7\")")) << r.stderr_text;
}

TEST(K3runCli, MissingIdsIsExit2) {
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--gen", "1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.stderr_text, "--ids")) << r.stderr_text;
}

TEST(K3runCli, StopIdOutsideVocabIsExit2) {
  const CliRun r =
      RunCliArgs({TinyPreparedDir(), "--ids", "1,2", "--gen", "1", "--stop-id", "5000"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.stderr_text, "--stop-id: id 5000")) << r.stderr_text;
}

TEST(K3runCli, NegativeGenIsExit2) {
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--ids", "1,2", "--gen", "-1"});
  EXPECT_EQ(r.exit_code, 2);
}

TEST(K3runCli, GenBeyondPositionLimitIsExit2WithNumbers) {
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--ids", "1,2", "--gen", "1048575"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.stderr_text, "needs 1048577 positions")) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "1048576")) << r.stderr_text;
}

TEST(K3runCli, LayersBeyondModelIsExit2) {
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--ids", "1,2", "--gen", "1", "--layers", "14"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.stderr_text, "--layers 14: must be in [1, 13]")) << r.stderr_text;
}

TEST(K3runCli, ZeroThreadsIsExit2) {
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--ids", "1", "--threads", "0"});
  EXPECT_EQ(r.exit_code, 2);
}

// NaN passed every comparison of CLI11's checks: --budget-gb nan ran as if unlimited.
TEST(K3runCli, NonFiniteNumbersAreRefusedForEveryNumericFlag) {
  for (const char* flag : {"--budget-gb", "--trunk-gb", "--cache-gb", "--temperature", "--top-p",
                           "--probe-seconds"}) {
    for (const char* bad : {"nan", "inf", "-inf"}) {
      const CliRun r = RunCliArgs({TinyPreparedDir(), "--ids", "1", "--gen", "1", flag, bad});
      EXPECT_EQ(r.exit_code, 2) << flag << " " << bad << ": " << r.stderr_text;
      EXPECT_TRUE(Has(r.stderr_text, std::string(flag) + ": " + bad + " is not a finite number"))
          << r.stderr_text;
      EXPECT_TRUE(r.stdout_writes.empty());
    }
  }
}

// One million threads ended in "internal error (please report): Resource temporarily
// unavailable" from pthread_create.
TEST(K3runCli, ThreadsAboveTheMaximumAreRefusedWithTheBound) {
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--ids", "1", "--threads", "1000000"});
  EXPECT_EQ(r.exit_code, 2) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text,
                  "--threads: 1000000 is out of range: allowed 1 to " +
                      std::to_string(kernels::kMaxThreads)))
      << r.stderr_text;
}

// Range messages print the bounds as written, not "0.000000 to 1797693134862315708145...".
TEST(K3runCli, RangeMessagesAreReadable) {
  struct Case {
    std::vector<std::string> flag;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {{"--threads", "0"}, "--threads: 0 is out of range: allowed 1 to 1024"},
           {{"--gen", "-1"}, "--gen: -1 is out of range: allowed 0 or more"},
           {{"--layers", "0"}, "--layers: 0 is out of range: allowed 1 or more"},
           {{"--budget-gb", "0"}, "--budget-gb: 0 is out of range: allowed more than 0, up to 1000000"},
           {{"--top-p", "1.5"}, "--top-p: 1.5 is out of range: allowed more than 0, up to 1"},
           {{"--probe-seconds", "0"}, "--probe-seconds: 0 is out of range: allowed more than 0, up to 60"}}) {
    std::vector<std::string> args = {TinyPreparedDir(), "--ids", "1"};
    args.insert(args.end(), c.flag.begin(), c.flag.end());
    const CliRun r = RunCliArgs(args);
    EXPECT_EQ(r.exit_code, 2) << r.stderr_text;
    EXPECT_TRUE(Has(r.stderr_text, c.says)) << r.stderr_text;
    EXPECT_FALSE(Has(r.stderr_text, "0.000000")) << r.stderr_text;
    EXPECT_FALSE(Has(r.stderr_text, "1797")) << r.stderr_text;
  }
}

TEST(K3runCli, UnknownFlagIsExit2) {
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--ids", "1", "--prompt", "hello"});
  EXPECT_EQ(r.exit_code, 2);
}

TEST(K3runCli, DumpLogitsAllWithoutPathIsExit2) {
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--ids", "1", "--dump-logits-all"});
  EXPECT_EQ(r.exit_code, 2);
}

TEST(K3runCli, MissingPreparedDirIsExit2) {
  const CliRun r = RunCliArgs({"/nonexistent/k3/prepared", "--ids", "1"});
  EXPECT_EQ(r.exit_code, 2) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "does not exist")) << r.stderr_text;
}

TEST(K3runCli, AlteredManifestIsUntrustedExit2) {
  test::TempDir tmp;
  const std::string dir = CopyPrepared(tmp);
  std::string text = Slurp(dir + "/k3.json");
  text[text.size() / 2] = text[text.size() / 2] == ' ' ? '\t' : ' ';
  ASSERT_TRUE(test::WriteWholeFile(dir + "/k3.json", text));
  const CliRun r = RunCliArgs({dir, "--ids", "1", "--gen", "1"});
  EXPECT_EQ(r.exit_code, 2) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "untrusted manifest")) << r.stderr_text;
}

TEST(K3runCli, BadIsaEnvironmentIsExit2) {
  ::setenv("K3_ISA", "sse9", 1);
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--ids", "1", "--gen", "1"});
  ::unsetenv("K3_ISA");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.stderr_text, "K3_ISA")) << r.stderr_text;
}

TEST(K3runCli, MemoryPlanRefusalIsExit2WithNumbers) {
  CliIo io;
  io.mem_available = []() -> Result<uint64_t> { return uint64_t{4096}; };
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--ids", "1,2,3", "--gen", "4"}, io);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.stderr_text, "memory plan refused: weights held "))
      << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, " for 6 positions (committed as the context grows: "))
      << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, " KB per position) + KDA states ")) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "MemAvailable 0.000 GB")) << r.stderr_text;
  EXPECT_TRUE(r.stdout_writes.empty());
}

TEST(K3runCli, CorruptExpertWithVerifyReadsIsRunInvalidExit4) {
  test::TempDir tmp;
  // One byte of every expert of layer 1 damaged: whichever experts routing picks fail XXH3-64.
  const std::string dir = CopyTinyWithCorruptExperts(tmp.Join("prep"), 1);
  const std::string report = tmp.Join("report.json");
  const CliRun r = RunCliArgs({dir, "--ids", kPromptText, "--gen", "3", "--verify-reads",
                               "--out", report});
  EXPECT_EQ(r.exit_code, 4) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "RUN INVALID")) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "layer 1 expert")) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "XXH3-64")) << r.stderr_text;
  const nlohmann::json j = nlohmann::json::parse(Slurp(report));
  EXPECT_EQ(j["valid"], false);
  EXPECT_GT(j["experts_skipped"].get<int64_t>(), 0);
  EXPECT_EQ(j["generated_ids"].size(), 3u);  // generation still ran to the end
  // Without --verify-reads the damage is not detected (that is what the flag is for).
  EXPECT_EQ(RunCliArgs({dir, "--ids", kPromptText, "--gen", "1"}).exit_code, 0);
}

// Two records of one layer swapped: every offset still lies inside its file, so the index
// decodes and validates, and without its hash the run would route tokens to the wrong experts.
// k3run treats every hash failure at open as untrusted input, exit 2 (DESIGN.md §5).
TEST(K3runCli, ExpertsIndexPermutedWithinALayerIsUntrustedExit2) {
  test::TempDir tmp;
  const std::string dir = CopyPrepared(tmp);
  prepared::ExpertsIndex idx = DecodedIndex(dir);
  ASSERT_GT(idx.n_experts, 1u);
  const std::string original = prepared::EncodeExpertsIndex(idx);
  std::swap(idx.records[idx.RecordIndex(1, 0)], idx.records[idx.RecordIndex(1, 1)]);
  const std::string permuted = prepared::EncodeExpertsIndex(idx);
  ASSERT_EQ(permuted.size(), original.size());
  ASSERT_NE(permuted, original);
  ASSERT_TRUE(test::WriteWholeFile(dir + "/experts.idx", permuted));

  const CliRun r = RunCliArgs({dir, "--ids", kPromptText, "--gen", "2"});
  EXPECT_EQ(r.exit_code, 2) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, dir + "/experts.idx: experts.idx altered: its XXH3-128 is "))
      << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "re-run k3prep pack")) << r.stderr_text;
  EXPECT_TRUE(r.stdout_writes.empty());
}

TEST(K3runCli, JsonReportCarriesTheRequiredFields) {
  test::TempDir tmp;
  const std::string report = tmp.Join("sub/report.json");
  fs::create_directories(tmp.Join("sub"));
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--ids", kPromptText, "--gen", "6", "--out",
                               report, "--threads", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  const nlohmann::json j = nlohmann::json::parse(Slurp(report));
  EXPECT_EQ(j["prompt_ids"].get<std::vector<int32_t>>(), kPrompt);
  const auto gen = j["generated_ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(gen.size(), 6u);
  ASSERT_TRUE(j["generated_text"].is_string());
  EXPECT_EQ(j["steps"].size(), 6u);
  EXPECT_EQ(j["steps"][0]["tokens_in"], 8);
  EXPECT_EQ(j["steps"][1]["tokens_in"], 1);
  double step_seconds = 0;
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(j["steps"][i]["token"], gen[i]);
    ASSERT_TRUE(j["steps"][i]["seconds"].is_number()) << j["steps"][i].dump();
    step_seconds += j["steps"][i]["seconds"].get<double>();
  }
  // The run's time is its steps' times added up (same order, so the same double).
  EXPECT_EQ(j["totals"]["seconds"].get<double>(), step_seconds);
  // The first step reads the whole trunk; later steps read nothing new from it (RamWeights).
  EXPECT_GT(j["steps"][0]["bytes_read"]["trunk"].get<uint64_t>(), 0u);
  EXPECT_GT(j["steps"][0]["bytes_read"]["lm_head"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["steps"][0]["bytes_read"]["embedding"], 8u * 128u * 2u);  // 8 bf16 rows of 128
  EXPECT_EQ(j["steps"][1]["bytes_read"]["embedding"], 128u * 2u);
  EXPECT_EQ(j["steps"][1]["bytes_read"]["trunk"], 0u);
  EXPECT_GT(j["totals"]["bytes_read"]["experts"].get<uint64_t>(), 0u);
  EXPECT_GT(j["peak_rss_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["is_full_model"], true);
  EXPECT_EQ(j["threads"], 2);
  EXPECT_EQ(j["mode"], "incremental");
  EXPECT_EQ(j["valid"], true);
  EXPECT_EQ(j["stop_reason"], "gen");
  EXPECT_EQ(j["memory_plan"]["positions"], 8 + 5);
  // The prefill against its compute floor (the run probes the kernels' peak at start-up).
  ASSERT_TRUE(j["prefill"].is_object()) << j["prefill"].dump();
  EXPECT_EQ(j["prefill"]["tokens"], 8);
  EXPECT_GT(j["prefill"]["flops"].get<double>(), 0);
  EXPECT_GT(j["prefill"]["time_over_compute_floor"].get<double>(), 0);
  kernels::SetThreads(1);
}

// The tokenizer's own bytes for the ids of a report, read independently of the engine's
// decoder; added tokens (ids above the ranks) decode to their content, as tiktoken's decode
// does, or to nothing when `special` is false.
std::string IndependentDecode(const nlohmann::json& report, bool special) {
  std::string want;
  const std::string vocab_text = Slurp(TinyPreparedDir() + "/tokenizer/tiktoken.model");
  Result<tiktoken::Vocab> v = tiktoken::ParseTiktokenModel(vocab_text, "tiktoken.model");
  EXPECT_TRUE(v.ok());
  if (!v.ok()) return want;
  const nlohmann::json added = nlohmann::json::parse(
      Slurp(TinyPreparedDir() + "/tokenizer/tokenizer_config.json"))["added_tokens_decoder"];
  for (int32_t id : report["generated_ids"].get<std::vector<int32_t>>()) {
    if (size_t(id) < v->tokens.size()) {
      want += v->tokens[size_t(id)];
    } else {
      EXPECT_TRUE(added.contains(std::to_string(id))) << id;
      if (special) want += added[std::to_string(id)]["content"].get<std::string>();
    }
  }
  return want;
}

TEST(K3runCli, StdoutBytesAreTheDecodedTokensInOrder) {
  for (bool special : {false, true}) {
    test::TempDir tmp;
    const std::string report = tmp.Join("r.json");
    std::vector<std::string> args = {TinyPreparedDir(), "--ids", kPromptText, "--gen", "8",
                                     "--out", report};
    if (special) args.push_back("--show-special");
    const CliRun r = RunCliArgs(args);
    ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
    const nlohmann::json j = nlohmann::json::parse(Slurp(report));
    EXPECT_EQ(r.stdout_text(), IndependentDecode(j, special)) << "--show-special " << special;
  }
}

TEST(K3runCli, GenZeroRunsPrefillOnlyAndDumpsPromptLogits) {
  test::TempDir tmp;
  const std::string dump = tmp.Join("logits.f32"), report = tmp.Join("r.json");
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--ids", kPromptText, "--gen", "0",
                               "--dump-logits", dump, "--out", report});
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_TRUE(r.stdout_writes.empty());
  const std::string bytes = Slurp(dump);
  ASSERT_EQ(bytes.size(), 1280u * 4u);
  const nlohmann::json j = nlohmann::json::parse(Slurp(report));
  EXPECT_TRUE(j["generated_ids"].empty());
  ASSERT_EQ(j["steps"].size(), 1u);
  EXPECT_TRUE(j["steps"][0]["token"].is_null());
  // The dump equals the engine's prefill logits computed through the library.
  auto e = OpenEngine(TinyPreparedDir());
  std::vector<float> logits;
  GenerateLogits(e.get(), kPrompt, 0, false, &logits);
  ASSERT_EQ(logits.size(), 1280u);
  EXPECT_EQ(std::memcmp(bytes.data(), logits.data(), bytes.size()), 0);
  EXPECT_FALSE(fs::exists(dump + ".k3tmp"));
}

TEST(K3runCli, DumpLogitsAllWritesEveryStepAndRecomputeMatches) {
  test::TempDir tmp;
  const std::string a = tmp.Join("inc.f32"), b = tmp.Join("rec.f32");
  ASSERT_EQ(RunCliArgs({TinyPreparedDir(), "--ids", kPromptText, "--gen", "5", "--dump-logits",
                        a, "--dump-logits-all"})
                .exit_code,
            0);
  ASSERT_EQ(RunCliArgs({TinyPreparedDir(), "--ids", kPromptText, "--gen", "5", "--dump-logits",
                        b, "--dump-logits-all", "--recompute"})
                .exit_code,
            0);
  const std::string inc = Slurp(a), rec = Slurp(b);
  EXPECT_EQ(inc.size(), 5u * 1280u * 4u);
  EXPECT_TRUE(inc == rec) << "incremental and --recompute dumps differ";
}

TEST(K3runCli, StopIdEndsGenerationAfterThatToken) {
  test::TempDir tmp;
  const std::string full = tmp.Join("full.json"), stopped = tmp.Join("stop.json");
  ASSERT_EQ(RunCliArgs({TinyPreparedDir(), "--ids", kPromptText, "--gen", "8", "--out", full})
                .exit_code,
            0);
  const auto ids = nlohmann::json::parse(Slurp(full))["generated_ids"].get<std::vector<int>>();
  ASSERT_EQ(ids.size(), 8u);
  const int stop = ids[3];
  const size_t first = size_t(std::find(ids.begin(), ids.end(), stop) - ids.begin());
  ASSERT_EQ(RunCliArgs({TinyPreparedDir(), "--ids", kPromptText, "--gen", "8", "--stop-id",
                        std::to_string(stop), "--out", stopped})
                .exit_code,
            0);
  const nlohmann::json j = nlohmann::json::parse(Slurp(stopped));
  EXPECT_EQ(j["generated_ids"].get<std::vector<int>>(),
            std::vector<int>(ids.begin(), ids.begin() + long(first) + 1));
  EXPECT_EQ(j["stop_reason"], "stop-id");
}

TEST(K3runCli, LayersRunIsLabelledNotTheModel) {
  test::TempDir tmp;
  const std::string report = tmp.Join("r.json");
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--ids", "1,2", "--gen", "1", "--layers", "3",
                               "--out", report});
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "NOT the model")) << r.stderr_text;
  const nlohmann::json j = nlohmann::json::parse(Slurp(report));
  EXPECT_EQ(j["is_full_model"], false);
  EXPECT_EQ(j["layers_run"], 3);
}

TEST(K3runCli, QuietPrintsNoStepLines) {
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--ids", "1,2", "--gen", "2", "--quiet"});
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_FALSE(Has(r.stderr_text, "step 0")) << r.stderr_text;
}

}  // namespace
}  // namespace k3::run::testing
