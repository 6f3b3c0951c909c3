// k3run's stop rules and output through the CLI (k3run/engine/stop_rules.h): the model's end
// token stops every mode by default, --ignore-eos runs exactly --gen tokens, --stop strings
// across token boundaries are not printed, and chat's thinking display (chat_display.h).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>

#include "k3run/app/chat_display.h"
#include "k3run/engine/session.h"
#include "k3run/engine/stop_rules.h"
#include "tests/k3run/engine_fixture.h"
#include "tests/support/files.h"
#include "tests/support/temp_dir.h"

namespace k3::run::testing {
namespace {

// On the tiny model (seed 0) greedy from this prompt reaches [EOS] within 40 tokens.
const char kEosPrompt[] = "1 2 3";
constexpr int32_t kMaxGen = 40;

nlohmann::json RunToReport(std::vector<std::string> args, CliRun* run = nullptr) {
  test::TempDir tmp;
  const std::string report = tmp.Join("r.json");
  args.insert(args.begin(), TinyPreparedDir());
  args.insert(args.end(), {"--out", report, "--no-floor"});
  const CliRun r = RunCliArgs(args);
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  if (run) *run = r;
  return nlohmann::json::parse(test::ReadWholeFile(report));
}

std::unique_ptr<run::Engine> TinyEngine() {
  Result<std::unique_ptr<run::Engine>> e = run::Engine::Open(Env::Default(), TinyPreparedDir());
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

TEST(K3runStop, EndTokenStopsByDefaultAndIgnoreEosRunsExactlyGen) {
  std::unique_ptr<run::Engine> e = TinyEngine();
  ASSERT_TRUE(e);
  const int64_t eos = EndTokenIds(e->tokenizer()).at(0);
  const std::string gen = std::to_string(kMaxGen);
  const nlohmann::json all =
      RunToReport({"--prompt", kEosPrompt, "--gen", gen, "--ignore-eos", "-q"});
  const auto all_ids = all["generated_ids"].get<std::vector<int64_t>>();
  ASSERT_EQ(all_ids.size(), size_t(kMaxGen));
  EXPECT_EQ(all["stop_reason"], "gen");
  const auto first_eos = std::find(all_ids.begin(), all_ids.end(), eos);
  ASSERT_NE(first_eos, all_ids.end()) << "the fixture no longer reaches [EOS] from this prompt";

  const nlohmann::json stopped = RunToReport({"--prompt", kEosPrompt, "--gen", gen, "-q"});
  const std::vector<int64_t> want(all_ids.begin(), first_eos + 1);
  EXPECT_EQ(stopped["generated_ids"].get<std::vector<int64_t>>(), want);
  EXPECT_EQ(stopped["stop_reason"], "end-token");
}

TEST(K3runStop, EndTokenIsNotPrintedUnlessShowSpecial) {
  CliRun plain, special;
  RunToReport({"--prompt", kEosPrompt, "--gen", std::to_string(kMaxGen), "-q"}, &plain);
  RunToReport({"--prompt", kEosPrompt, "--gen", std::to_string(kMaxGen), "-q", "--show-special"},
              &special);
  EXPECT_EQ(plain.stdout_text().find("[EOS]"), std::string::npos) << plain.stdout_text();
  const std::string s = special.stdout_text();
  ASSERT_GE(s.size(), 5u);
  EXPECT_EQ(s.substr(s.size() - 5), "[EOS]");
}

// The shown text of each generated id (special tokens hidden), in order.
std::vector<std::string> TokenTexts(const tok::Tokenizer& t, const std::vector<int32_t>& ids) {
  std::vector<std::string> out;
  for (int32_t id : ids) out.emplace_back(tok::IsAddedToken(t, id) ? "" : t.TokenBytes(id));
  return out;
}

TEST(K3runStop, StopStringAcrossTokenBoundariesEndsTheRunAndIsNotPrinted) {
  std::unique_ptr<run::Engine> e = TinyEngine();
  ASSERT_TRUE(e);
  const nlohmann::json all = RunToReport({"--prompt", "Hello", "--gen", "24", "--ignore-eos",
                                          "-q"});
  const std::vector<std::string> pieces =
      TokenTexts(*e->tokenizer(), all["generated_ids"].get<std::vector<int32_t>>());
  // A stop string made of the last byte of one token and the first byte of the next.
  size_t k = 4;
  while (k + 1 < pieces.size() && (pieces[k].empty() || pieces[k + 1].empty())) ++k;
  ASSERT_LT(k + 1, pieces.size());
  const std::string stop = pieces[k].substr(pieces[k].size() - 1) + pieces[k + 1].substr(0, 1);
  std::string text;
  for (const std::string& p : pieces) text += p;
  const size_t at = text.find(stop);
  ASSERT_NE(at, std::string::npos);

  CliRun r;
  const nlohmann::json stopped =
      RunToReport({"--prompt", "Hello", "--gen", "24", "--ignore-eos", "-q", "--stop", stop,
                   "--stop", "never printed by this model \x01"},
                  &r);
  EXPECT_EQ(r.stdout_text(), text.substr(0, at));
  EXPECT_EQ(stopped["stop_reason"], "stop-string");
  EXPECT_LE(stopped["generated_ids"].size(), k + 2);
}

TEST(K3runStop, StopFlagsAreRefusedWithChat) {
  for (const std::vector<std::string>& flag :
       std::vector<std::vector<std::string>>{{"--stop", "x"}, {"--ignore-eos"},
                                             {"--show-special"}}) {
    std::vector<std::string> args = {TinyPreparedDir(), "--chat"};
    args.insert(args.end(), flag.begin(), flag.end());
    const CliRun r = RunCliArgs(args);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.stderr_text.find(flag[0] + " cannot be used with --chat"), std::string::npos)
        << r.stderr_text;
  }
}

// --- Chat's thinking display ----------------------------------------------------------------

std::string Display(const run::Engine& e, ChatDisplayOptions o) {
  const tok::Tokenizer& t = *e.tokenizer();
  Result<ChatTemplate> tmpl = ChatTemplate::Create(&t, "tiny");
  EXPECT_TRUE(tmpl.ok());
  const ChatIds& c = tmpl->ids();
  auto text = [&](const std::string& s) { return t.Encode(s, false); };
  std::vector<int32_t> ids = text("why");
  for (const std::vector<int32_t>& part :
       {std::vector<int32_t>{c.close}, text("think"), {c.sep, c.open}, text("response"),
        {c.sep}, text("yes"), {c.close}, text("response"), {c.sep, c.end_of_msg}}) {
    ids.insert(ids.end(), part.begin(), part.end());
  }
  std::string out;
  ChatDisplay d(t, *tmpl, o, [&](std::string_view b) {
    out += b;
    return Status::Ok();
  });
  for (int32_t id : ids) EXPECT_TRUE(d.Token(id).ok());
  EXPECT_TRUE(d.Finish().ok());
  return out;
}

TEST(ChatDisplay, ThinkingIsMarkedDimmedOrHidden) {
  std::unique_ptr<run::Engine> e = TinyEngine();
  ASSERT_TRUE(e);
  EXPECT_EQ(Display(*e, {true, false, false}), "<think>\nwhy\n</think>\nyes\n");
  EXPECT_EQ(Display(*e, {true, false, true}), "\x1b[2mwhy\x1b[0m\nyes\n");
  EXPECT_EQ(Display(*e, {true, true, false}), "yes\n");
}

CliIo OneLine(const std::string& line) {
  auto left = std::make_shared<bool>(true);
  CliIo io;
  io.read_line = [left, line]() -> std::optional<std::string> {
    if (!*left) return std::nullopt;
    *left = false;
    return line;
  };
  return io;
}

TEST(K3runChatOutput, ThinkingMarkedOrHiddenAndTheTurnRateOnStderr) {
  const CliRun shown = RunCliArgs({TinyPreparedDir(), "--chat", "--gen", "6"}, OneLine("hi"));
  ASSERT_EQ(shown.exit_code, 0) << shown.stderr_text;
  EXPECT_EQ(shown.stdout_text().rfind("<think>\n", 0), 0u) << shown.stdout_text();
  EXPECT_NE(shown.stderr_text.find("[prompt "), std::string::npos) << shown.stderr_text;
  EXPECT_NE(shown.stderr_text.find(" tokens, decode "), std::string::npos) << shown.stderr_text;
  const CliRun hidden =
      RunCliArgs({TinyPreparedDir(), "--chat", "--gen", "6", "--hide-thinking"}, OneLine("hi"));
  ASSERT_EQ(hidden.exit_code, 0) << hidden.stderr_text;
  EXPECT_EQ(hidden.stdout_text().find("<think>"), std::string::npos) << hidden.stdout_text();
}

// --- --help, the default summary ------------------------------------------------------------

TEST(K3runHelp, ShowsDefaultsAndTheSamplingOrder) {
  std::vector<std::string> owned = {"k3run", "--help"};
  std::vector<char*> argv;
  for (std::string& a : owned) argv.push_back(a.data());
  ::testing::internal::CaptureStdout();
  const int code = K3runMain(2, argv.data());
  const std::string help = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(code, 0);
  for (const char* want : {"penalties (repeat, frequency, presence", "-> top-k -> top-p -> min-p "
                           "-> temperature -> draw", "--gen INT:0 or more=16", "--repeat-last-n",
                           "=64", "default max", "--ignore-eos", "--stop"}) {
    EXPECT_NE(help.find(want), std::string::npos) << want << "\n" << help;
  }
}

TEST(K3runSummary, OneLineWithPromptAndDecodeRatesApart) {
  CliRun r;
  RunToReport({"--prompt", "Hello", "--gen", "4", "--ignore-eos"}, &r);
  EXPECT_NE(r.stderr_text.find("prompt 4 tokens in "), std::string::npos) << r.stderr_text;
  EXPECT_NE(r.stderr_text.find("; generated 4 tokens, decode "), std::string::npos)
      << r.stderr_text;
  EXPECT_NE(r.stderr_text.find("/token; peak RSS "), std::string::npos) << r.stderr_text;
  EXPECT_EQ(r.stderr_text.find("step "), std::string::npos) << r.stderr_text;
}

}  // namespace
}  // namespace k3::run::testing
