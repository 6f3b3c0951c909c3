// Speculative decoding through the k3run CLI (DESIGN.md §11.4): --spec N gives the ids and the
// logits bytes of plain greedy decoding, whether drafts are kept or refused, reports its passes,
// and is refused (exit 2) where it cannot be exact.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/k3run/engine_fixture.h"
#include "tests/support/files.h"
#include "tests/support/temp_dir.h"

namespace k3::run::testing {
namespace {

bool Has(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

nlohmann::json Report(const std::string& path) {
  return nlohmann::json::parse(test::ReadWholeFile(path));
}

std::string Join(const std::vector<int32_t>& ids, size_t skip_every = 0) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    // Every skip_every-th id altered: those drafts are refused.
    const int32_t id = skip_every > 0 && i % skip_every == skip_every - 1 ? (ids[i] + 1) % 1280
                                                                          : ids[i];
    s += (i ? "," : "") + std::to_string(id);
  }
  return s;
}

TEST(K3runSpec, SameIdsAndLogitsBytesAsPlainGreedyWithDraftsKeptAndRefused) {
  test::TempDir tmp;
  const std::vector<std::string> base = {TinyPreparedDir(), "--ids", kPromptText, "--gen", "20",
                                         "--ignore-eos", "--dump-logits-all"};
  auto run = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), {"--dump-logits", tmp.Join(name + ".bin"), "--out",
                             tmp.Join(name + ".json")});
    args.insert(args.end(), extra.begin(), extra.end());
    const CliRun r = RunCliArgs(args);
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.stderr_text;
    return r;
  };
  const CliRun plain = run("plain", {});
  const std::vector<int32_t> ids =
      Report(tmp.Join("plain.json"))["generated_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), 20u);
  run("lookup", {"--spec", "4"});
  run("oracle", {"--spec", "4", "--spec-oracle", Join(ids)});
  run("mixed", {"--spec", "6", "--spec-fixed", "--spec-oracle", Join(ids, 3)});
  const std::string want = test::ReadWholeFile(tmp.Join("plain.bin"));
  for (const std::string name : {"lookup", "oracle", "mixed"}) {
    EXPECT_EQ(test::ReadWholeFile(tmp.Join(name + ".bin")), want) << name;
    const nlohmann::json r = Report(tmp.Join(name + ".json"));
    EXPECT_EQ(r["generated_ids"].get<std::vector<int32_t>>(), ids) << name;
    const nlohmann::json& s = r["speculation"];
    EXPECT_EQ(s["decode_passes"].get<int64_t>() + s["accepted"].get<int64_t>(), 19) << name;
  }
  const nlohmann::json oracle = Report(tmp.Join("oracle.json"))["speculation"];
  EXPECT_EQ(oracle["spec"], 4);
  EXPECT_GT(oracle["tokens_per_pass"].get<double>(), 2.0) << oracle.dump();
  const nlohmann::json mixed = Report(tmp.Join("mixed.json"))["speculation"];
  EXPECT_GT(mixed["drafted"].get<int64_t>(), mixed["accepted"].get<int64_t>()) << mixed.dump();
  EXPECT_GT(mixed["accepted"].get<int64_t>(), 0) << mixed.dump();
  EXPECT_GT(Report(tmp.Join("mixed.json"))["memory_plan"]["record_bytes"].get<uint64_t>(), 0u);
}

TEST(K3runSpec, ChatWithSpecGivesTheSameReply) {
  const CliRun plain = RunCliArgs({TinyPreparedDir(), "--chat", "--gen", "12"}, Stdin({"hello"}));
  const CliRun spec =
      RunCliArgs({TinyPreparedDir(), "--chat", "--gen", "12", "--spec", "3"}, Stdin({"hello"}));
  ASSERT_EQ(plain.exit_code, 0) << plain.stderr_text;
  ASSERT_EQ(spec.exit_code, 0) << spec.stderr_text;
  EXPECT_EQ(spec.stdout_text(), plain.stdout_text());
}

TEST(K3runSpec, RefusedWhereItCannotBeExact) {
  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--spec", "3", "--temperature", "0.7"}, "--spec needs greedy decoding"},
      {{"--spec", "3", "--seed", "5"}, "--spec needs greedy decoding"},
      {{"--spec", "2", "--recompute"}, "--spec and --recompute are exclusive"},
      {{"--spec", "17"}, "--spec 17: must be in [0, 16]"},
      {{"--spec", "-1"}, "--spec -1: must be in [0, 16]"},
      {{"--spec-fixed"}, "--spec-fixed needs --spec N"},
      {{"--spec", "2", "--spec-oracle", "5,99999"}, "--spec-oracle: id 99999"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {TinyPreparedDir(), "--ids", "1,2,3", "--gen", "4"};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    const CliRun r = RunCliArgs(args);
    EXPECT_EQ(r.exit_code, 2) << c.flags[0] << ": " << r.stderr_text;
    EXPECT_TRUE(Has(r.stderr_text, c.message)) << r.stderr_text;
  }
}

}  // namespace
}  // namespace k3::run::testing
