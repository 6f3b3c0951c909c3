// The CLI's constrained decoding on the tiny synth model (app/cli_constraint.h): --json-schema
// and --grammar prompt runs give text in the language, ending with an end token; --chat --tools
// with a forced call shows the call, reads its result and answers again; every bad file or flag
// combination is exit 2 naming the flag, the file and the rule, before any pass.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "tests/k3run/engine_fixture.h"
#include "tests/support/files.h"
#include "tests/support/temp_dir.h"

namespace k3::run::testing {
namespace {

using nlohmann::json;

bool Has(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

const char kSchema[] = R"({"type":"object","properties":{
  "answer":{"enum":["yes","no"]},"score":{"type":"integer"},"ok":{"type":"boolean"},
  "tags":{"type":"array","items":{"type":"string","enum":["x","y"]},"maxItems":2}},
  "required":["answer","score","ok"],"additionalProperties":false})";

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

TEST(CliConstraint, JsonSchemaPromptRunsGiveValidJson) {
  test::TempDir tmp;
  const std::string schema = tmp.WriteFile("s.json", kSchema);
  for (int seed = 0; seed < 5; ++seed) {
    const CliRun r = RunCliArgs({TinyPreparedDir(), "--prompt", "Answer:", "--json-schema", schema,
                                 "--gen", "200", "--temperature", "1", "--seed",
                                 std::to_string(seed), "--out", tmp.Join("r.json")});
    ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
    const json report = json::parse(test::ReadWholeFile(tmp.Join("r.json")));
    EXPECT_EQ(report["stop_reason"], "end-token") << r.stdout_text();
    const json a = json::parse(Trim(r.stdout_text()), nullptr, false);
    ASSERT_TRUE(a.is_object()) << r.stdout_text();
    EXPECT_TRUE(a["answer"] == "yes" || a["answer"] == "no") << r.stdout_text();
    EXPECT_TRUE(a["score"].is_number_integer()) << r.stdout_text();
    EXPECT_TRUE(a["ok"].is_boolean()) << r.stdout_text();
    if (a.contains("tags")) {
      EXPECT_LE(a["tags"].size(), 2u);
    }
  }
}

TEST(CliConstraint, GreedyJsonSchemaRunIsTheSameEachTime) {
  test::TempDir tmp;
  const std::string schema = tmp.WriteFile("s.json", kSchema);
  const std::vector<std::string> args = {TinyPreparedDir(), "--prompt", "Answer:", "--json-schema",
                                         schema, "--gen", "120", "--out", tmp.Join("r.json")};
  const CliRun a = RunCliArgs(args);
  const CliRun b = RunCliArgs(args);
  ASSERT_EQ(a.exit_code, 0) << a.stderr_text;
  EXPECT_EQ(a.stdout_text(), b.stdout_text());
  EXPECT_TRUE(json::parse(Trim(a.stdout_text()), nullptr, false).is_object()) << a.stdout_text();
  // The report times every constrained choice; an unconstrained run reports none.
  const json report = json::parse(test::ReadWholeFile(tmp.Join("r.json")));
  EXPECT_EQ(report["constraint"]["tokens"], report["generated_ids"].size());
  EXPECT_GE(report["constraint"]["choice_wait"]["max_ms"].get<double>(), 0.0);
  const CliRun plain = RunCliArgs({TinyPreparedDir(), "--prompt", "Answer:", "--gen", "4",
                                   "--out", tmp.Join("p.json")});
  ASSERT_EQ(plain.exit_code, 0) << plain.stderr_text;
  EXPECT_TRUE(json::parse(test::ReadWholeFile(tmp.Join("p.json")))["constraint"].is_null());
}

TEST(CliConstraint, GrammarPromptRunMatchesTheGrammar) {
  test::TempDir tmp;
  const std::string g = tmp.WriteFile("g.gbnf",
                                      "# a verdict and a number\n"
                                      "root ::= (\"yes\" | \"no\") \" \" [1-9] [0-9]{0,2}\n");
  for (int seed = 0; seed < 4; ++seed) {
    const CliRun r = RunCliArgs({TinyPreparedDir(), "--prompt", "Verdict:", "--grammar", g,
                                 "--gen", "16", "--temperature", "1", "--seed",
                                 std::to_string(seed)});
    ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
    EXPECT_TRUE(std::regex_match(Trim(r.stdout_text()), std::regex("(yes|no) [1-9][0-9]{0,2}")))
        << "'" << r.stdout_text() << "'";
  }
}

TEST(CliConstraint, ChatWithToolsShowsTheCallAndAnswersWithItsResult) {
  test::TempDir tmp;
  const std::string tools = tmp.WriteFile(
      "tools.json",
      R"([{"type":"function","function":{"name":"get_weather","description":"Weather.",)"
      R"("parameters":{"type":"object","properties":{"city":{"enum":["Paris","Oslo"]}},)"
      R"("required":["city"]}}}])");
  const CliRun r =
      RunCliArgs({TinyPreparedDir(), "--chat", "--no-think", "--tools", tools, "--tool-choice",
                  "get_weather", "--gen", "1500", "--ctx", "4096"},
                 Stdin({"What is the weather in Paris?", "21 degrees", "/exit"}));
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  const std::string out = r.stdout_text();
  const std::regex call(R"re(\[tool call 1\] get_weather \{"city":"(Paris|Oslo)"\})re");
  EXPECT_TRUE(std::regex_search(out, call)) << out;
  EXPECT_TRUE(Has(r.stderr_text, "result of get_weather (call_")) << r.stderr_text;
  // No markup reaches stdout.
  EXPECT_FALSE(Has(out, "argument")) << out;
  EXPECT_FALSE(Has(out, "index=")) << out;
}

TEST(CliConstraint, BadFilesAndFlagsAreExit2NamingThem) {
  test::TempDir tmp;
  const std::string schema = tmp.WriteFile("s.json", kSchema);
  const std::string not_json = tmp.WriteFile("bad.json", "{\"type\": ");
  const std::string pattern =
      tmp.WriteFile("p.json", R"({"type":"object","properties":{"a":{"type":"string","pattern":"x"}}})");
  const std::string bad_gbnf = tmp.WriteFile("bad.gbnf", "root ::= \"a\" undefined-rule\n");
  const std::string tools = tmp.WriteFile("t.json", R"([{"type":"function","function":{"name":"f"}}])");
  struct Case {
    std::vector<std::string> flags;
    std::vector<std::string> words;  // all in stderr
  };
  const std::vector<Case> cases = {
      {{"--json-schema", tmp.Join("missing.json")}, {"--json-schema", "missing.json"}},
      {{"--json-schema", not_json}, {"--json-schema", "bad.json", "not JSON"}},
      {{"--json-schema", pattern}, {"p.json", "pattern", "/properties/a"}},
      {{"--grammar", bad_gbnf}, {"bad.gbnf", "undefined-rule"}},
      {{"--grammar", bad_gbnf, "--json-schema", schema}, {"exclusive"}},
      {{"--json-schema", schema, "--spec", "2"}, {"--spec"}},
      {{"--tools", tools}, {"--tools", "--chat"}},
      {{"--chat", "--tool-choice", "required"}, {"--tool-choice needs --tools"}},
      {{"--chat", "--tools", tools, "--tool-choice", "g"}, {"t.json", "\"g\""}},
      {{"--serve", "--json-schema", schema}, {"--serve", "--json-schema"}},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {TinyPreparedDir()};
    const bool chat_or_serve = std::find(c.flags.begin(), c.flags.end(), "--chat") != c.flags.end() ||
                               std::find(c.flags.begin(), c.flags.end(), "--serve") != c.flags.end();
    if (!chat_or_serve) args.insert(args.end(), {"--prompt", "x"});
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    const CliRun r = RunCliArgs(args, Stdin({}));
    EXPECT_EQ(r.exit_code, 2) << c.flags[0] << ": " << r.stderr_text;
    for (const std::string& w : c.words) {
      EXPECT_TRUE(Has(r.stderr_text, w)) << "'" << w << "' not in: " << r.stderr_text;
    }
  }
}

}  // namespace
}  // namespace k3::run::testing
