// k3run's text modes end to end on the tiny synth model: --prompt, --prompt-file with the
// report's prompt_ids, greedy identity with --ids, sampling flags, and --chat driven through an
// injected stdin with /help, /reset, /exit and --history.
#include <gtest/gtest.h>

#include <deque>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "k3run/text/chat_history.h"
#include "k3run/text/tokenizer.h"
#include "k3run/text/utf8.h"
#include "tests/k3run/engine_fixture.h"
#include "tests/support/files.h"
#include "tests/support/temp_dir.h"

namespace k3::run::testing {
namespace {

bool Has(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

std::string Slurp(const std::string& path) { return test::ReadWholeFile(path); }

nlohmann::json Report(const std::string& path) { return nlohmann::json::parse(Slurp(path)); }

tok::Tokenizer SynthTokenizer() {
  Result<tok::Tokenizer> r =
      tok::Tokenizer::Load(Env::Default(), JoinPath(TinyCheckpointDir(), "tiktoken.model"),
                           JoinPath(TinyCheckpointDir(), "tokenizer_config.json"), 1280);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

std::string Join(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

TEST(K3runText, PromptFileGenZeroRecordsThePromptIds) {
  test::TempDir tmp;
  const std::string text = "Hello, world! [BOS] 123 日本語\r\n\tend";
  const std::string file = tmp.WriteFile("p.txt", text);
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--prompt-file", file, "--gen", "0", "--out",
                               tmp.Join("r.json")});
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  const std::vector<int32_t> want = SynthTokenizer().Encode(text, /*allow_special=*/true);
  EXPECT_EQ(Report(tmp.Join("r.json"))["prompt_ids"].get<std::vector<int32_t>>(), want);
  // Specials are recognised in a prompt file: [BOS] is one id, found by content.
  const std::optional<int32_t> bos = SynthTokenizer().SpecialId("[BOS]");
  ASSERT_TRUE(bos.has_value());
  EXPECT_NE(std::find(want.begin(), want.end(), *bos), want.end());
}

TEST(K3runText, GreedyPromptIsBitIdenticalToTheIdsPath) {
  test::TempDir tmp;
  const std::string text = "The quick brown fox";
  const std::vector<int32_t> ids = SynthTokenizer().Encode(text, true);
  const CliRun a = RunCliArgs({TinyPreparedDir(), "--prompt", text, "--gen", "6", "--out",
                               tmp.Join("a.json")});
  const CliRun b = RunCliArgs({TinyPreparedDir(), "--ids", Join(ids), "--gen", "6", "--out",
                               tmp.Join("b.json")});
  ASSERT_EQ(a.exit_code, 0) << a.stderr_text;
  ASSERT_EQ(b.exit_code, 0) << b.stderr_text;
  const nlohmann::json ra = Report(tmp.Join("a.json")), rb = Report(tmp.Join("b.json"));
  EXPECT_EQ(ra["prompt_ids"], rb["prompt_ids"]);
  EXPECT_EQ(ra["generated_ids"], rb["generated_ids"]);
  EXPECT_EQ(ra["generated_ids"].size(), 6u);
  EXPECT_EQ(a.stdout_text(), b.stdout_text());
}

TEST(K3runText, SeededSamplingRepeatsAndDiffersFromAnotherSeed) {
  test::TempDir tmp;
  auto run = [&](const std::string& seed, const std::string& name) {
    const CliRun r = RunCliArgs({TinyPreparedDir(), "--prompt", "abc", "--gen", "8",
                                 "--temperature", "1.5", "--top-k", "50", "--seed", seed,
                                 "--out", tmp.Join(name)});
    EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
    EXPECT_TRUE(Has(r.stderr_text, "PCG32 seed " + seed)) << r.stderr_text;
    return Report(tmp.Join(name))["generated_ids"];
  };
  const nlohmann::json a = run("11", "a.json"), b = run("11", "b.json"), c = run("12", "c.json");
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(K3runText, EmptyPromptIsExit2) {
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--prompt", "", "--gen", "1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.stderr_text, "--prompt: the prompt is empty")) << r.stderr_text;
}

TEST(K3runText, TwoPromptSourcesAreExit2) {
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--ids", "1,2", "--prompt", "x"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.stderr_text, "exactly one")) << r.stderr_text;
}

TEST(K3runText, MissingPromptFileIsNamed) {
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--prompt-file", "/nonexistent/p.txt"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.stderr_text, "--prompt-file: ")) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "/nonexistent/p.txt")) << r.stderr_text;
}

TEST(K3runText, TemperatureZeroIsGreedyAndWarnsAboutTheSeed) {
  test::TempDir tmp;
  const CliRun greedy = RunCliArgs({TinyPreparedDir(), "--prompt", "a", "--gen", "6"});
  const CliRun zero = RunCliArgs(
      {TinyPreparedDir(), "--prompt", "a", "--gen", "6", "--temperature", "0", "--seed", "3"});
  ASSERT_EQ(zero.exit_code, 0) << zero.stderr_text;
  EXPECT_EQ(zero.stdout_text(), greedy.stdout_text());
  EXPECT_TRUE(Has(zero.stderr_text, "warning: --seed has no effect")) << zero.stderr_text;
  const CliRun topk = RunCliArgs({TinyPreparedDir(), "--prompt", "a", "--gen", "2", "--top-k",
                                  "5"});
  EXPECT_TRUE(Has(topk.stderr_text, "sampling at temperature 1")) << topk.stderr_text;
}

TEST(K3runText, SameSeedSameTokensWithEverySamplingOption) {
  const std::vector<std::string> args = {
      TinyPreparedDir(), "--prompt", "Hello", "--gen", "12", "--ignore-eos", "-q",
      "--temperature", "0.9", "--top-k", "50", "--top-p", "0.95", "--min-p", "0.02",
      "--repeat-penalty", "1.1", "--presence-penalty", "0.1", "--frequency-penalty", "0.1",
      "--seed", "77"};
  const CliRun a = RunCliArgs(args), b = RunCliArgs(args);
  ASSERT_EQ(a.exit_code, 0) << a.stderr_text;
  EXPECT_EQ(a.stdout_text(), b.stdout_text());
  EXPECT_FALSE(a.stdout_text().empty());
}

TEST(K3runText, InvalidSamplingValuesAreExit2) {
  const std::vector<std::vector<std::string>> bad = {
      {"--temperature", "-1"},     {"--top-p", "0"},           {"--top-p", "1.5"},
      {"--top-k", "-3"},           {"--seed", "-1"},           {"--temperature", "x"},
      {"--min-p", "1.5"},          {"--min-p", "-0.1"},        {"--repeat-penalty", "0"},
      {"--repeat-last-n", "-1"},   {"--presence-penalty", "nan"}, {"--frequency-penalty", "inf"}};
  for (const auto& flag : bad) {
    std::vector<std::string> args = {TinyPreparedDir(), "--prompt", "a"};
    args.insert(args.end(), flag.begin(), flag.end());
    const CliRun r = RunCliArgs(args);
    EXPECT_EQ(r.exit_code, 2) << flag[0] << " " << flag[1];
    EXPECT_TRUE(Has(r.stderr_text, flag[0])) << r.stderr_text;
  }
}

TEST(K3runText, ChatOnlyFlagsWithoutChatAreExit2) {
  for (const std::vector<std::string>& flag : std::vector<std::vector<std::string>>{
           {"--system", "s"}, {"--history", "h"}, {"--no-think"}, {"--thinking-effort", "low"}}) {
    std::vector<std::string> args = {TinyPreparedDir(), "--prompt", "a"};
    args.insert(args.end(), flag.begin(), flag.end());
    const CliRun r = RunCliArgs(args);
    EXPECT_EQ(r.exit_code, 2) << flag[0];
    EXPECT_TRUE(Has(r.stderr_text, flag[0] + " needs --chat")) << r.stderr_text;
  }
}

TEST(K3runText, ThinkingEffortMediumIsExit2) {
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--chat", "--thinking-effort", "medium"},
                              Stdin({}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.stderr_text, "medium")) << r.stderr_text;
}

TEST(K3runText, NoThinkWithEffortIsExit2) {
  const CliRun r = RunCliArgs(
      {TinyPreparedDir(), "--chat", "--no-think", "--thinking-effort", "low"}, Stdin({}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.stderr_text, "contradict")) << r.stderr_text;
}

TEST(K3runText, ChatWithOutIsExit2) {
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--chat", "--out", "r.json"}, Stdin({}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.stderr_text, "--out cannot be used with --chat")) << r.stderr_text;
}

TEST(K3runChat, ReplRunsTurnsResetsAndSavesHistory) {
  test::TempDir tmp;
  const std::string hist = tmp.Join("h.jsonl");
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--chat", "--system", "Be brief.", "--history",
                               hist, "--gen", "4", "--no-think"},
                              Stdin({"/help", "", "hello <|end_of_msg|>", "/exit", "never read"}));
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "/reset")) << "help text";
  Result<std::vector<ChatMessage>> h = LoadHistory(Env::Default(), hist);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ(h->size(), 3u);
  EXPECT_EQ((*h)[0].role, "system");
  EXPECT_EQ((*h)[0].content, "Be brief.");
  EXPECT_EQ((*h)[1].content, "hello <|end_of_msg|>");
  EXPECT_EQ((*h)[2].role, "assistant");
  EXPECT_FALSE(r.stdout_writes.empty());

  // Resume with the same file, then /reset: only the system message is left.
  const CliRun r2 = RunCliArgs({TinyPreparedDir(), "--chat", "--history", hist, "--gen", "2",
                                "--no-think"},
                               Stdin({"again", "/reset"}));
  ASSERT_EQ(r2.exit_code, 0) << r2.stderr_text;
  EXPECT_TRUE(Has(r2.stderr_text, "conversation reset")) << r2.stderr_text;
  Result<std::vector<ChatMessage>> h2 = LoadHistory(Env::Default(), hist);
  ASSERT_TRUE(h2.ok()) << h2.status().ToString();
  ASSERT_EQ(h2->size(), 1u);
  EXPECT_EQ((*h2)[0].content, "Be brief.");
}

TEST(K3runChat, GreedyChatTurnEqualsGreedyIdsOnTheRenderedPrompt) {
  // A greedy chat turn is the --ids path on the rendered prompt with the two end ids as stops.
  test::TempDir tmp;
  const tok::Tokenizer t = SynthTokenizer();
  Result<ChatTemplate> tmpl = ChatTemplate::Create(&t, "synth");
  ASSERT_TRUE(tmpl.ok());
  const std::vector<int32_t> prompt = tmpl->Render({{"user", "hi", ""}}, {true, "max"}, true);
  const CliRun chat = RunCliArgs(
      {TinyPreparedDir(), "--chat", "--gen", "5", "--history", tmp.Join("h.jsonl")},
      Stdin({"hi"}));
  const CliRun ids = RunCliArgs({TinyPreparedDir(), "--ids", Join(prompt), "--gen", "5",
                                 "--stop-id", std::to_string(tmpl->ids().end_of_msg),
                                 "--stop-id", std::to_string(tmpl->ids().eos), "--out",
                                 tmp.Join("r.json")});
  ASSERT_EQ(chat.exit_code, 0) << chat.stderr_text;
  ASSERT_EQ(ids.exit_code, 0) << ids.stderr_text;
  EXPECT_TRUE(Has(chat.stderr_text, "[" + std::to_string(prompt.size()) + " new ids, " +
                                        std::to_string(prompt.size()) + " of "))
      << chat.stderr_text;
  // The random tiny model does not follow the template, so the turn is stored as plain text:
  // the decoded non-control ids.
  std::vector<int32_t> text;
  for (int32_t id : Report(tmp.Join("r.json"))["generated_ids"].get<std::vector<int32_t>>()) {
    if (!tmpl->IsControl(id)) text.push_back(id);
  }
  Result<std::vector<ChatMessage>> h = LoadHistory(Env::Default(), tmp.Join("h.jsonl"));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ(h->size(), 2u);
  EXPECT_EQ((*h)[1].content, SanitizeUtf8(t.Decode(text)));
}

TEST(K3runChat, SystemDisagreeingWithHistoryIsExit2) {
  test::TempDir tmp;
  const std::string hist = tmp.WriteFile("h.jsonl", "{\"role\":\"system\",\"content\":\"A\"}\n");
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--chat", "--system", "B", "--history", hist},
                              Stdin({}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.stderr_text, "--system disagrees")) << r.stderr_text;
}

TEST(K3runChat, CorruptHistoryIsExit2NamingTheLine) {
  test::TempDir tmp;
  const std::string hist =
      tmp.WriteFile("h.jsonl", "{\"role\":\"user\",\"content\":\"a\",\"content\":\"b\"}\n");
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--chat", "--history", hist}, Stdin({"x"}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.stderr_text, hist + ":1: duplicate key")) << r.stderr_text;
  EXPECT_EQ(Slurp(hist), "{\"role\":\"user\",\"content\":\"a\",\"content\":\"b\"}\n");
}

TEST(K3runChat, MessageBeyondTheContextIsDroppedNotRun) {
  test::TempDir tmp;
  const std::string hist = tmp.Join("h.jsonl");
  // The rendered turn alone (thinking preamble, message, generation prompt) exceeds 40 positions.
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--chat", "--ctx", "40", "--gen", "4",
                               "--history", hist},
                              Stdin({"hello there, this message is long enough to overflow"}));
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "does not fit: 0 of the context's 40 positions are used; the "
                                 "message was dropped: /reset"))
      << r.stderr_text;
  EXPECT_TRUE(r.stdout_writes.empty());
  EXPECT_FALSE(std::filesystem::exists(hist));
}

TEST(K3runChat, GenAtTheContextIsExit2) {
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--chat", "--ctx", "100", "--gen", "100"},
                              Stdin({}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.stderr_text, "--gen 100 with --ctx 100: --gen must be below the context"))
      << r.stderr_text;
}

// Without --ctx a chat reserves the largest default context the plan allows, and says so.
TEST(K3runChat, DefaultContextIsPrinted) {
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--chat", "--gen", "2"}, Stdin({}));
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "context: 32768 positions (--ctx)")) << r.stderr_text;
}

}  // namespace
}  // namespace k3::run::testing
