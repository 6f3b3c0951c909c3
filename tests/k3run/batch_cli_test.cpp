// k3run --batch (k3run/app/batch.h): every output line equals its own single --ids/--prompt
// run (ids, text, stop reason, and --dump-logits-all bytes), lines come out in input order,
// each input rule refuses a malformed line naming FILE:LINE, and the report adds up. The
// expectations come from single runs of the CLI, never from --batch itself.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "tests/k3run/engine_fixture.h"
#include "tests/support/files.h"
#include "tests/support/temp_dir.h"

namespace k3::run::testing {
namespace {

using nlohmann::json;

std::vector<json> OutputLines(const CliRun& r) {
  std::vector<json> lines;
  const std::string text = r.stdout_text();
  for (size_t pos = 0; pos < text.size();) {
    const size_t nl = text.find('\n', pos);
    EXPECT_NE(nl, std::string::npos) << "the last output line has no newline";
    if (nl == std::string::npos) break;
    lines.push_back(json::parse(text.substr(pos, nl - pos)));
    pos = nl + 1;
  }
  return lines;
}

json AsJsonText(const std::string& bytes) {
  return json::parse(json(bytes).dump(-1, ' ', false, json::error_handler_t::replace));
}

// A single run of one input: its report and its stdout.
struct Single {
  json report;
  std::string text;
};

Single RunSingle(const test::TempDir& tmp, std::vector<std::string> args, const std::string& tag) {
  const std::string report = tmp.Join("single-" + tag + ".json");
  args.insert(args.begin(), TinyPreparedDir());
  args.insert(args.end(), {"--out", report, "--no-floor"});
  const CliRun r = RunCliArgs(args);
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  return Single{json::parse(test::ReadWholeFile(report)), r.stdout_text()};
}

// Prompts and ids of different lengths and gens; the single-run flags that match each line.
struct Line {
  std::string jsonl;
  std::vector<std::string> single;  // --ids/--prompt and --gen of the equivalent single run
};

std::vector<Line> MixedLines() {
  return {
      {R"({"ids": [3, 7, 11, 5, 9, 300, 1000, 42]})", {"--ids", "3,7,11,5,9,300,1000,42", "--gen", "6"}},
      {R"({"prompt": "1 2 3"})", {"--prompt", "1 2 3", "--gen", "6"}},
      {R"({"ids": [17], "gen": 9})", {"--ids", "17", "--gen", "9"}},
      {R"({"prompt": "The quick brown fox jumps over the lazy dog, twice.", "gen": 3})",
       {"--prompt", "The quick brown fox jumps over the lazy dog, twice.", "--gen", "3"}},
      {R"({"ids": [100, 200], "gen": 1})", {"--ids", "100,200", "--gen", "1"}},
  };
}

TEST(BatchCli, EachLineEqualsItsOwnSingleRunWithByteIdenticalDumps) {
  test::TempDir tmp;
  const std::vector<Line> lines = MixedLines();
  std::string file;
  for (const Line& l : lines) file += l.jsonl + "\n";
  const std::string input = tmp.WriteFile("in.jsonl", file);
  const std::string dump = tmp.Join("batch.logits");
  std::vector<Single> singles;
  std::vector<std::string> single_dumps;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string tag = std::to_string(i);
    std::vector<std::string> args = lines[i].single;
    single_dumps.push_back(tmp.Join("single.logits." + tag));
    args.insert(args.end(), {"--dump-logits", single_dumps.back(), "--dump-logits-all"});
    singles.push_back(RunSingle(tmp, args, tag));
  }
  for (const char* seqs : {"1", "3", "5"}) {
    const CliRun r = RunCliArgs({TinyPreparedDir(), "--batch", input, "--gen", "6", "--max-seqs",
                                 seqs, "--dump-logits", dump, "--dump-logits-all", "--no-floor"});
    ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
    const std::vector<json> out = OutputLines(r);
    ASSERT_EQ(out.size(), lines.size()) << r.stdout_text();
    for (size_t i = 0; i < lines.size(); ++i) {
      const Single& s = singles[i];
      EXPECT_EQ(out[i]["index"], i);
      EXPECT_EQ(out[i]["generated_ids"], s.report["generated_ids"]) << "line " << i;
      EXPECT_EQ(out[i]["stop_reason"], s.report["stop_reason"]) << "line " << i;
      // The single run's bytes, with what is not UTF-8 as U+FFFD (a JSON string's rule).
      EXPECT_EQ(out[i]["text"], AsJsonText(s.text)) << "line " << i;
      const std::string want = test::ReadWholeFile(single_dumps[i]);
      EXPECT_FALSE(want.empty());
      EXPECT_EQ(test::ReadWholeFile(dump + "." + std::to_string(i)), want)
          << "line " << i << ", --max-seqs " << seqs;
    }
  }
}

// Line 0 generates 12 tokens, line 1 one: line 1 finishes first and still comes second.
TEST(BatchCli, OutputKeepsInputOrderWhenALaterLineFinishesFirst) {
  test::TempDir tmp;
  const std::string input = tmp.WriteFile(
      "in.jsonl", "{\"ids\": [5, 6, 7], \"gen\": 12}\n{\"ids\": [8], \"gen\": 1}\n\n"
                  "{\"ids\": [9, 10], \"gen\": 2}\n");
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--batch", input, "--max-seqs", "3",
                               "--ignore-eos", "--no-floor"});
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  const std::vector<json> out = OutputLines(r);
  ASSERT_EQ(out.size(), 3u);
  const size_t gens[] = {12, 1, 2};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(out[i]["index"], i);
    EXPECT_EQ(out[i]["generated_ids"].size(), gens[i]);
    EXPECT_EQ(out[i]["stop_reason"], "gen");
  }
  const Single s = RunSingle(tmp, {"--ids", "8", "--gen", "1", "--ignore-eos"}, "8");
  EXPECT_EQ(out[1]["generated_ids"], s.report["generated_ids"]);
}

// Seeded sampling: input I samples with --seed S + I, so a single run with that seed repeats it.
TEST(BatchCli, SampledLinesRepeatWithTheirOwnSeed) {
  test::TempDir tmp;
  const std::string input =
      tmp.WriteFile("in.jsonl", "{\"ids\": [5, 6, 7]}\n{\"ids\": [5, 6, 7]}\n");
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--batch", input, "--gen", "10", "--ignore-eos",
                               "--temperature", "1.5", "--seed", "41", "--no-floor"});
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  const std::vector<json> out = OutputLines(r);
  ASSERT_EQ(out.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const Single s = RunSingle(tmp, {"--ids", "5,6,7", "--gen", "10", "--ignore-eos",
                                     "--temperature", "1.5", "--seed", std::to_string(41 + i)},
                               std::to_string(i));
    EXPECT_EQ(out[static_cast<size_t>(i)]["generated_ids"], s.report["generated_ids"]) << i;
  }
  EXPECT_NE(out[0]["generated_ids"], out[1]["generated_ids"]);
}

// The single run's stop rules on every line: end tokens, --stop strings across token
// boundaries (cut from the text) and --stop-id; each line stops where its own single run does.
TEST(BatchCli, StopRulesStopEachLineWhereItsSingleRunStops) {
  test::TempDir tmp;
  const std::vector<std::vector<std::string>> singles = {
      {"--prompt", "1 2 3"}, {"--ids", "3,7,11,5,9,300,1000,42"}, {"--ids", "17"},
      {"--prompt", "The quick brown fox"}};
  const std::string file =
      "{\"prompt\": \"1 2 3\"}\n{\"ids\": [3, 7, 11, 5, 9, 300, 1000, 42]}\n"
      "{\"ids\": [17]}\n{\"prompt\": \"The quick brown fox\"}\n";
  const std::string input = tmp.WriteFile("in.jsonl", file);
  // A stop string from the middle of line 1's text and a stop id from line 2's ids.
  std::vector<std::string> a1 = singles[1];
  a1.insert(a1.end(), {"--gen", "40", "--ignore-eos"});
  const std::string t1 = RunSingle(tmp, a1, "t1").text;
  ASSERT_GT(t1.size(), 8u);
  size_t k = t1.size() / 2;
  while (k + 2 < t1.size() && (t1[k] == '\0' || t1[k + 1] == '\0')) ++k;
  const std::string stop = t1.substr(k, 2);
  std::vector<std::string> a2 = singles[2];
  a2.insert(a2.end(), {"--gen", "40", "--ignore-eos"});
  const json ids2 = RunSingle(tmp, a2, "t2").report["generated_ids"];
  ASSERT_GT(ids2.size(), 6u);
  const std::string stop_id = std::to_string(ids2[5].get<int64_t>());
  const std::vector<std::string> flags = {"--gen", "40", "--stop", stop, "--stop-id", stop_id};

  std::vector<std::string> args = {TinyPreparedDir(), "--batch", input, "--max-seqs", "3",
                                   "--no-floor"};
  args.insert(args.end(), flags.begin(), flags.end());
  const CliRun r = RunCliArgs(args);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  const std::vector<json> out = OutputLines(r);
  ASSERT_EQ(out.size(), singles.size());
  std::set<std::string> reasons;
  for (size_t i = 0; i < singles.size(); ++i) {
    std::vector<std::string> single = singles[i];
    single.insert(single.end(), flags.begin(), flags.end());
    const Single s = RunSingle(tmp, single, "s" + std::to_string(i));
    EXPECT_EQ(out[i]["generated_ids"], s.report["generated_ids"]) << "line " << i;
    EXPECT_EQ(out[i]["stop_reason"], s.report["stop_reason"]) << "line " << i;
    EXPECT_EQ(out[i]["text"], AsJsonText(s.text)) << "line " << i;
    reasons.insert(out[i]["stop_reason"].get<std::string>());
  }
  // The rules were exercised: line 1 stops at the string, line 2 at the id (or earlier).
  EXPECT_EQ(out[1]["stop_reason"], "stop-string");
  EXPECT_TRUE(reasons.count("stop-id") + reasons.count("end-token") > 0);
}

TEST(BatchCli, MalformedLinesExitTwoNamingFileAndLine) {
  test::TempDir tmp;
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"not json", "not valid JSON"},
      {"[1, 2]", "must be a JSON object"},
      {R"({"prompt": "a", "ids": [1]})", "both \"prompt\" and \"ids\""},
      {R"({"gen": 3})", "neither \"prompt\" nor \"ids\""},
      {R"({"ids": []})", "\"ids\" is empty"},
      {R"({"ids": "1,2"})", "\"ids\" must be an array"},
      {R"({"ids": [1.5]})", "item 1 (1.5) is not an integer"},
      {R"({"ids": [true]})", "is not an integer"},
      {R"({"ids": [1, 1280]})", "item 2 (1280) is outside the vocabulary [0, 1280)"},
      {R"({"ids": [-1]})", "outside the vocabulary"},
      {R"({"prompt": 5})", "\"prompt\" must be a string"},
      {R"({"prompt": ""})", "the prompt is empty"},
      {R"({"ids": [1], "gen": -1})", "\"gen\" is -1: must be >= 0"},
      {R"({"ids": [1], "gen": "3"})", "\"gen\" must be an integer"},
      {R"({"ids": [1], "max_tokens": 3})", "unknown key \"max_tokens\""},
  };
  for (const auto& [line, rule] : bad) {
    const std::string input =
        tmp.WriteFile("bad.jsonl", "{\"ids\": [1, 2]}\n\n" + line + "\n{\"ids\": [3]}\n");
    const CliRun r = RunCliArgs({TinyPreparedDir(), "--batch", input, "--no-floor"});
    EXPECT_EQ(r.exit_code, 2) << line;
    EXPECT_NE(r.stderr_text.find(input + ":3: "), std::string::npos) << line << "\n" << r.stderr_text;
    EXPECT_NE(r.stderr_text.find(rule), std::string::npos) << line << "\n" << r.stderr_text;
    EXPECT_TRUE(r.stdout_text().empty()) << line;
  }
  const std::string empty = tmp.WriteFile("empty.jsonl", "\n  \n");
  const CliRun e = RunCliArgs({TinyPreparedDir(), "--batch", empty, "--no-floor"});
  EXPECT_EQ(e.exit_code, 2);
  EXPECT_NE(e.stderr_text.find("no requests"), std::string::npos) << e.stderr_text;
}

TEST(BatchCli, BatchIsExclusiveWithPromptModesAndState) {
  test::TempDir tmp;
  const std::string input = tmp.WriteFile("in.jsonl", "{\"ids\": [1]}\n");
  const std::vector<std::vector<std::string>> others = {
      {"--ids", "1"}, {"--prompt", "x"}, {"--chat"}, {"--recompute"},
      {"--save-state", tmp.Join("s")}, {"--load-state", tmp.Join("s")},
      {"--spec-oracle", "1,2", "--spec", "2"}};  // --spec itself batches (BatchCliSpec)
  for (const std::vector<std::string>& other : others) {
    std::vector<std::string> args = {TinyPreparedDir(), "--batch", input};
    args.insert(args.end(), other.begin(), other.end());
    const CliRun r = RunCliArgs(args);
    EXPECT_EQ(r.exit_code, 2) << other[0];
    EXPECT_NE(r.stderr_text.find("--batch and " + other[0]), std::string::npos)
        << r.stderr_text;
  }
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--ids", "1", "--max-seqs", "2"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.stderr_text.find("--max-seqs needs --batch"), std::string::npos) << r.stderr_text;
}

// An expert that fails its hash: every line is still written, then RUN INVALID (exit 4).
TEST(BatchCli, CorruptExpertWithVerifyReadsIsRunInvalidExit4) {
  test::TempDir tmp;
  const std::string dir = CopyTinyWithCorruptExperts(tmp.Join("prep"), 1);
  const std::string input = tmp.WriteFile("in.jsonl", "{\"ids\": [3, 7, 11]}\n{\"ids\": [5]}\n");
  const CliRun r = RunCliArgs({dir, "--batch", input, "--gen", "3", "--verify-reads", "--no-floor"});
  EXPECT_EQ(r.exit_code, 4) << r.stderr_text;
  EXPECT_NE(r.stderr_text.find("RUN INVALID"), std::string::npos) << r.stderr_text;
  const std::vector<json> out = OutputLines(r);
  ASSERT_EQ(out.size(), 2u) << r.stdout_text();
  EXPECT_EQ(out[0]["index"], 0);
  EXPECT_EQ(out[1]["index"], 1);
}

// The report's totals add up to its sequences and to the output lines; stdin works as FILE.
TEST(BatchCli, ReportFieldsArePresentAndConsistent) {
  test::TempDir tmp;
  std::string file;
  for (int i = 0; i < 5; ++i) {
    file += "{\"ids\": [" + std::to_string(10 + i) + ", 20, 30], \"gen\": " +
            std::to_string(2 + 2 * i) + "}\n";
  }
  CliIo io;
  io.read_stdin = [file]() -> Result<std::string> { return file; };
  const std::string report = tmp.Join("r.json");
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--batch", "-", "--max-seqs", "2", "--out",
                               report, "--ignore-eos", "--no-floor"},
                              io);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_NE(r.stderr_text.find("batch: 5 sequences"), std::string::npos) << r.stderr_text;
  const std::vector<json> out = OutputLines(r);
  ASSERT_EQ(out.size(), 5u);
  const json j = json::parse(test::ReadWholeFile(report));
  for (const char* key : {"passes", "rows_per_pass", "generated_tokens", "tokens_per_pass",
                          "bytes_read", "bytes_per_generated_token", "sequences", "total",
                          "seconds", "tokens_per_second", "max_seqs"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  ASSERT_EQ(j["sequences"].size(), 5u);
  int64_t generated = 0, out_generated = 0, max_seq_passes = 0;
  for (size_t i = 0; i < 5; ++i) {
    const json& s = j["sequences"][i];
    EXPECT_EQ(s["index"], i);
    EXPECT_EQ(s["prompt_tokens"], 3);
    EXPECT_EQ(s["generated"], 2 + 2 * i);
    EXPECT_EQ(s["stop_reason"], "gen");
    generated += s["generated"].get<int64_t>();
    out_generated += static_cast<int64_t>(out[i]["generated_ids"].size());
    max_seq_passes = std::max(max_seq_passes, s["passes"].get<int64_t>());
  }
  EXPECT_EQ(generated, 2 + 4 + 6 + 8 + 10);
  EXPECT_EQ(j["total"]["generated"], generated);
  EXPECT_EQ(j["generated_tokens"], generated);
  EXPECT_EQ(out_generated, generated);
  EXPECT_EQ(j["max_seqs"], 2);
  const int64_t passes = j["passes"].get<int64_t>();
  EXPECT_GE(passes, max_seq_passes);
  EXPECT_LT(passes, j["total"]["sequence_passes"].get<int64_t>());  // passes were shared
  EXPECT_LE(j["rows_per_pass"]["max"].get<int64_t>(), j["pass_rows"].get<int64_t>());
  EXPECT_DOUBLE_EQ(j["tokens_per_pass"].get<double>(),
                   static_cast<double>(generated) / static_cast<double>(passes));
  EXPECT_GT(j["bytes_per_generated_token"].get<double>(), 0);
  // A decode pass's split: the four parts, none negative, adding up to at most the pass's time
  // (the pass is timed around Model::Pass, the parts inside it).
  const json& d = j["decode"];
  ASSERT_GT(d["passes"].get<int64_t>(), 0);
  double parts = 0;
  for (const char* part : {"experts", "trunk", "attention", "waits"}) {
    ASSERT_TRUE(d["split_seconds_per_pass"].contains(part)) << part;
    const double v = d["split_seconds_per_pass"][part].get<double>();
    EXPECT_GE(v, 0) << part;
    parts += v;
  }
  EXPECT_GT(d["split_seconds_per_pass"]["experts"].get<double>(), 0);
  EXPECT_GT(d["split_seconds_per_pass"]["attention"].get<double>(), 0);
  EXPECT_LE(parts, d["seconds_per_pass"].get<double>() * (1 + 1e-9));
  EXPECT_NE(r.stderr_text.find("per decode pass: experts "), std::string::npos) << r.stderr_text;
  EXPECT_TRUE(d["roofline_floor"].is_null()) << "--no-floor runs no probe";
}

// Without --no-floor the report has the decode passes' roofline floor: the larger of the weight
// bytes a pass multiplies at the probed memory bandwidth and its FLOPs at the probed matmul
// peak, and the pass time over it; the distinct experts per pass lie between one row's top-k
// per MoE layer and every row's.
TEST(BatchCli, DecodeRooflineFloorIsTheLargerTermAndThePassTimeOverIt) {
  test::TempDir tmp;
  const std::string input = tmp.Join("in.jsonl"), report = tmp.Join("r.json");
  std::string lines;
  for (int i = 0; i < 3; ++i) lines += "{\"ids\": [" + std::to_string(5 + i) + ", 9], \"gen\": 4}\n";
  ASSERT_TRUE(test::WriteWholeFile(input, lines));
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--batch", input, "--max-seqs", "3", "--out",
                               report, "--ignore-eos", "--probe-seconds", "0.02"});
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  const json j = json::parse(test::ReadWholeFile(report));
  const json& d = j["decode"];
  ASSERT_GT(d["passes"].get<int64_t>(), 0);
  const json& f = d["roofline_floor"];
  ASSERT_TRUE(f.is_object()) << d.dump(2);
  const double memory_s = f["memory_s"].get<double>(), compute_s = f["compute_s"].get<double>();
  EXPECT_GT(memory_s, 0);
  EXPECT_GT(compute_s, 0);
  EXPECT_DOUBLE_EQ(f["floor_s"].get<double>(), std::max(memory_s, compute_s));
  EXPECT_EQ(f["bound"], memory_s >= compute_s ? "memory" : "compute");
  EXPECT_DOUBLE_EQ(f["memory_s"].get<double>(),
                   f["weight_bytes"].get<double>() / f["memory_bytes_per_s"].get<double>());
  EXPECT_DOUBLE_EQ(f["time_over_floor"].get<double>(),
                   d["seconds_per_pass"].get<double>() / f["floor_s"].get<double>());
  const ModelConfig c = testing::OpenEngine(TinyPreparedDir())->prepared.manifest.config;
  int moe_layers = 0;
  for (int l = 0; l < c.n_layers; ++l) moe_layers += c.is_dense(l) ? 0 : 1;
  const double rows = d["rows_per_pass"].get<double>();
  const double experts = f["distinct_experts"].get<double>();
  EXPECT_GE(experts, static_cast<double>(c.topk * moe_layers) - 1e-9);
  EXPECT_LE(experts, rows * static_cast<double>(c.topk * moe_layers) + 1e-9);
  EXPECT_NE(r.stderr_text.find("roofline floor"), std::string::npos) << r.stderr_text;
}

// ---- --spec (BatchCliSpec): each line's ids and dump bytes are those of --batch without it ----

// The output lines and the dumps of one --batch run (--dump-logits-all into `dump`).
struct BatchRun {
  std::vector<json> lines;
  std::vector<std::string> dumps;
  json report;
  std::string stderr_text;
};

BatchRun RunBatch(const test::TempDir& tmp, const std::string& dir, const std::string& input,
                  std::vector<std::string> flags, const std::string& tag, size_t n) {
  const std::string dump = tmp.Join(tag + ".logits"), report = tmp.Join(tag + ".json");
  std::vector<std::string> args = {dir, "--batch", input, "--no-floor", "--dump-logits", dump,
                                   "--dump-logits-all", "--out", report};
  args.insert(args.end(), flags.begin(), flags.end());
  const CliRun r = RunCliArgs(args);
  EXPECT_EQ(r.exit_code, 0) << tag << ": " << r.stderr_text;
  BatchRun b;
  b.lines = OutputLines(r);
  EXPECT_EQ(b.lines.size(), n) << tag;
  for (size_t i = 0; i < n; ++i) b.dumps.push_back(test::ReadWholeFile(dump + "." + std::to_string(i)));
  if (r.exit_code == 0) b.report = json::parse(test::ReadWholeFile(report));
  b.stderr_text = r.stderr_text;
  return b;
}

void ExpectSameLines(const BatchRun& got, const BatchRun& want, const std::string& what) {
  ASSERT_EQ(got.lines.size(), want.lines.size()) << what;
  for (size_t i = 0; i < want.lines.size(); ++i) {
    for (const char* key : {"generated_ids", "text", "stop_reason"}) {
      EXPECT_EQ(got.lines[i][key], want.lines[i][key]) << what << ", line " << i << ": " << key;
    }
    EXPECT_FALSE(want.dumps[i].empty()) << what << ", line " << i;
    EXPECT_EQ(got.dumps[i], want.dumps[i]) << what << ", line " << i << ": dump bytes";
  }
}

// `lines` with each line's "spec_oracle": its plain ids, every `wrong`-th id altered (0: none;
// those drafts are refused); lines listed in `lookup` keep the prompt lookup.
std::string WithOracles(const std::vector<std::string>& lines, const BatchRun& plain,
                        size_t wrong, const std::set<size_t>& lookup) {
  std::string file;
  for (size_t i = 0; i < lines.size(); ++i) {
    json j = json::parse(lines[i]);
    if (lookup.count(i) == 0) {
      std::vector<int32_t> ids = plain.lines[i]["generated_ids"].get<std::vector<int32_t>>();
      for (size_t k = 0; wrong > 0 && k < ids.size(); ++k) {
        if (k % wrong == wrong - 1) ids[k] = (ids[k] + 1) % 1280;
      }
      j["spec_oracle"] = ids;
    }
    file += j.dump() + "\n";
  }
  return file;
}

// Greedy lines with and without --spec 4 (adaptive with the lookup; fixed with known
// continuations, all right or every third id wrong), 1 and 3 sequences at once; line 1 stops at a stop id inside its drafts while the
// others speculate. Then seeded sampling: the same ids with --spec, and no line drafts.
TEST(BatchCliSpec, SameLinesAndDumpBytesAsWithoutSpecGreedyAndSeeded) {
  test::TempDir tmp;
  const std::vector<std::string> lines = {
      R"({"ids": [3, 7, 11, 5, 9, 300, 1000, 42]})", R"({"prompt": "1 2 3"})",
      R"({"ids": [17], "gen": 9})", R"({"prompt": "one two three one two three"})"};
  std::string file;
  for (const std::string& l : lines) file += l + "\n";
  const std::string input = tmp.WriteFile("in.jsonl", file);
  // Line 1's stop id: its 6th token in a run without stop ids (not earlier in its run).
  const BatchRun free = RunBatch(tmp, TinyPreparedDir(), input, {"--gen", "14", "--ignore-eos"},
                                 "free", lines.size());
  ASSERT_EQ(free.lines.size(), lines.size());
  const std::vector<int32_t> ids1 = free.lines[1]["generated_ids"].get<std::vector<int32_t>>();
  size_t at = 5;
  while (at < ids1.size() && std::count(ids1.begin(), ids1.begin() + static_cast<int64_t>(at),
                                        ids1[at]) > 0) {
    ++at;
  }
  ASSERT_LT(at, ids1.size());
  const std::vector<std::string> flags = {"--gen", "14", "--ignore-eos", "--stop-id",
                                          std::to_string(ids1[at])};
  const BatchRun plain = RunBatch(tmp, TinyPreparedDir(), input, flags, "plain", lines.size());
  ASSERT_EQ(plain.lines[1]["stop_reason"], "stop-id");
  const std::string oracle = tmp.WriteFile("oracle.jsonl", WithOracles(lines, plain, 0, {3}));
  const std::string mixed = tmp.WriteFile("mixed.jsonl", WithOracles(lines, plain, 3, {3}));
  for (const char* seqs : {"1", "3"}) {
    for (const auto& [name, in, extra] :
         std::vector<std::tuple<std::string, std::string, std::vector<std::string>>>{
             {"lookup", input, {"--spec", "4"}},
             {"oracle", oracle, {"--spec", "4", "--spec-fixed"}},
             {"mixed", mixed, {"--spec", "4", "--spec-fixed"}}}) {
      std::vector<std::string> f = flags;
      f.insert(f.end(), extra.begin(), extra.end());
      f.insert(f.end(), {"--max-seqs", seqs});
      const std::string what = name + ", --max-seqs " + seqs;
      const BatchRun spec = RunBatch(tmp, TinyPreparedDir(), in, f, name + seqs, lines.size());
      ExpectSameLines(spec, plain, what);
      ASSERT_TRUE(spec.report.contains("speculation")) << what;
      const json& sp = spec.report["speculation"];
      EXPECT_EQ(sp["spec"], 4) << what;
      int64_t drafted = 0, accepted = 0;
      for (const json& q : spec.report["sequences"]) {
        drafted += q["speculation"]["drafted"].get<int64_t>();
        accepted += q["speculation"]["accepted"].get<int64_t>();
      }
      EXPECT_EQ(sp["drafted"], drafted) << what;
      EXPECT_EQ(sp["accepted"], accepted) << what;
      EXPECT_NE(spec.stderr_text.find("; spec 4: " + std::to_string(accepted) + " of " +
                                      std::to_string(drafted) + " drafted kept"),
                std::string::npos)
          << spec.stderr_text;
      if (name == "oracle") {
        EXPECT_GT(accepted, 0) << what;
        // Kept drafts are tokens without a pass of their own (every prompt takes one pass).
        EXPECT_LT(spec.report["passes"].get<int64_t>(),
                  spec.report["generated_tokens"].get<int64_t>())
            << what;
      }
      if (name == "mixed") {
        EXPECT_GT(accepted, 0) << what;
        EXPECT_GT(drafted, accepted) << what << ": no draft was refused";
      }
    }
  }
  // Seeded sampling (line I with seed 41 + I): the same ids; sampled lines decode without drafts.
  const std::vector<std::string> sampled = {"--gen", "10", "--ignore-eos", "--temperature", "1.5",
                                            "--seed", "41"};
  const BatchRun want = RunBatch(tmp, TinyPreparedDir(), input, sampled, "sampled", lines.size());
  std::vector<std::string> f = sampled;
  f.insert(f.end(), {"--spec", "4", "--max-seqs", "2"});
  const BatchRun got = RunBatch(tmp, TinyPreparedDir(), input, f, "sampled-spec", lines.size());
  ExpectSameLines(got, want, "seeded");
  EXPECT_EQ(got.report["speculation"]["drafted"], 0);
  EXPECT_NE(got.stderr_text.find("--spec: sampled requests decode without drafts"),
            std::string::npos)
      << got.stderr_text;
}

TEST(BatchCliSpec, SameLinesAsWithoutSpecOnSmall) {
  test::TempDir tmp;
  const std::vector<std::string> lines = {R"({"ids": [3, 7, 11, 5, 9, 300, 1000, 42]})",
                                          R"({"ids": [17, 23], "gen": 5})"};
  const std::string input = tmp.WriteFile("in.jsonl", lines[0] + "\n" + lines[1] + "\n");
  const std::vector<std::string> flags = {"--gen", "8", "--ignore-eos"};
  const BatchRun plain = RunBatch(tmp, SmallPreparedDir(), input, flags, "plain", lines.size());
  ASSERT_EQ(plain.lines.size(), lines.size());
  const std::string mixed = tmp.WriteFile("mixed.jsonl", WithOracles(lines, plain, 3, {}));
  std::vector<std::string> f = flags;
  f.insert(f.end(), {"--spec", "4", "--spec-fixed"});
  const BatchRun spec = RunBatch(tmp, SmallPreparedDir(), mixed, f, "spec", lines.size());
  ExpectSameLines(spec, plain, "small");
  EXPECT_GT(spec.report["speculation"]["accepted"].get<int64_t>(), 0);
}

// "spec_oracle" is a --spec diagnostic; --spec-oracle is a prompt run's.
TEST(BatchCliSpec, OracleLinesNeedSpec) {
  test::TempDir tmp;
  const std::string input = tmp.WriteFile("in.jsonl", "{\"ids\": [1]}\n{\"ids\": [2], "
                                                      "\"spec_oracle\": [5, 6]}\n");
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--batch", input, "--no-floor"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.stderr_text.find("in.jsonl:2: \"spec_oracle\" needs --spec N"), std::string::npos)
      << r.stderr_text;
  const std::string bad = tmp.WriteFile("bad.jsonl", "{\"ids\": [2], \"spec_oracle\": [99999]}\n");
  const CliRun b = RunCliArgs({TinyPreparedDir(), "--batch", bad, "--spec", "2", "--no-floor"});
  EXPECT_EQ(b.exit_code, 2);
  EXPECT_NE(b.stderr_text.find("bad.jsonl:1: \"spec_oracle\" item 1 (99999) is outside"),
            std::string::npos)
      << b.stderr_text;
}

}  // namespace
}  // namespace k3::run::testing
