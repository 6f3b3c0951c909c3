// Long contexts through the k3run CLI (DESIGN.md §11.3): --chunk never changes a bit and shows
// prefill progress, --save-state / --load-state continue a run exactly and refuse damaged or
// foreign files with the documented exit codes, and chat keeps its sequence across turns (and
// across processes with --history), feeding only each new message.
#include <gtest/gtest.h>

#include <deque>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "k3run/text/chat_history.h"
#include "k3run/text/chat_template.h"
#include "k3run/text/tokenizer.h"
#include "tests/k3run/engine_fixture.h"
#include "tests/support/files.h"
#include "tests/support/temp_dir.h"

namespace k3::run::testing {
namespace {

bool Has(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

std::vector<int32_t> GeneratedIds(const std::string& report) {
  return nlohmann::json::parse(test::ReadWholeFile(report))["generated_ids"]
      .get<std::vector<int32_t>>();
}

const std::string kLongIds = "3,7,11,5,9,300,1000,42,17,23,99,512,640,77,1,2,8,13,21,34,55,89";

TEST(K3runLongContext, ChunkGivesTheSameLogitsAndShowsPrefillProgress) {
  test::TempDir tmp;
  const CliRun whole = RunCliArgs({TinyPreparedDir(), "--ids", kLongIds, "--gen", "3",
                                   "--dump-logits", tmp.Join("a.bin"), "--dump-logits-all"});
  const CliRun chunked =
      RunCliArgs({TinyPreparedDir(), "--ids", kLongIds, "--gen", "3", "--chunk", "4",
                  "--progress", "plain", "--dump-logits", tmp.Join("b.bin"), "--dump-logits-all"});
  ASSERT_EQ(whole.exit_code, 0) << whole.stderr_text;
  ASSERT_EQ(chunked.exit_code, 0) << chunked.stderr_text;
  EXPECT_EQ(test::ReadWholeFile(tmp.Join("a.bin")), test::ReadWholeFile(tmp.Join("b.bin")));
  EXPECT_TRUE(Has(chunked.stderr_text, "for passes of up to 4 rows")) << chunked.stderr_text;
  EXPECT_TRUE(Has(chunked.stderr_text, "prefill 22/22 tokens (100%)")) << chunked.stderr_text;
  EXPECT_TRUE(Has(whole.stderr_text, "for passes of up to 22 rows")) << whole.stderr_text;
}

TEST(K3runLongContext, CtxBelowWhatTheRunNeedsIsExit2) {
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--ids", "1,2,3", "--gen", "5", "--ctx", "6"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.stderr_text, "--ctx 6: the prompt (3 ids) + --gen 5 need 7 positions"))
      << r.stderr_text;
}

TEST(K3runState, SaveThenLoadContinuesExactly) {
  test::TempDir tmp;
  const std::string state = tmp.Join("s.k3state");
  const CliRun all = RunCliArgs(
      {TinyPreparedDir(), "--ids", kLongIds, "--gen", "8", "--out", tmp.Join("all.json")});
  const CliRun first = RunCliArgs({TinyPreparedDir(), "--ids", kLongIds, "--gen", "4",
                                   "--save-state", state, "--out", tmp.Join("first.json")});
  ASSERT_EQ(all.exit_code, 0) << all.stderr_text;
  ASSERT_EQ(first.exit_code, 0) << first.stderr_text;
  const std::vector<int32_t> want = GeneratedIds(tmp.Join("all.json"));
  const std::vector<int32_t> got1 = GeneratedIds(tmp.Join("first.json"));
  ASSERT_EQ(got1, std::vector<int32_t>(want.begin(), want.begin() + 4));
  const CliRun rest = RunCliArgs({TinyPreparedDir(), "--load-state", state, "--ids",
                                  std::to_string(got1.back()), "--gen", "4", "--out",
                                  tmp.Join("rest.json")});
  ASSERT_EQ(rest.exit_code, 0) << rest.stderr_text;
  EXPECT_EQ(GeneratedIds(tmp.Join("rest.json")), std::vector<int32_t>(want.begin() + 4, want.end()));
}

// A state saved by `--ids 1,2,3 --gen 2` (and its bytes) for the malformed-file cases.
std::string SavedState(test::TempDir* tmp, const std::vector<std::string>& extra = {}) {
  const std::string state = tmp->Join("s.k3state");
  std::vector<std::string> args = {TinyPreparedDir(), "--ids", "1,2,3", "--gen", "2",
                                   "--save-state", state};
  args.insert(args.end(), extra.begin(), extra.end());
  const CliRun r = RunCliArgs(args);
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  return state;
}

CliRun LoadInto(const std::string& prepared, const std::string& state,
                const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {prepared, "--load-state", state, "--ids", "5", "--gen", "1"};
  args.insert(args.end(), extra.begin(), extra.end());
  return RunCliArgs(args);
}

TEST(K3runState, TruncatedStateIsExit3) {
  test::TempDir tmp;
  const std::string state = SavedState(&tmp);
  std::filesystem::resize_file(state, std::filesystem::file_size(state) - 4);
  const CliRun r = LoadInto(TinyPreparedDir(), state);
  EXPECT_EQ(r.exit_code, 3) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "truncated")) << r.stderr_text;
}

TEST(K3runState, AlteredBodyIsExit3) {
  test::TempDir tmp;
  const std::string state = SavedState(&tmp);
  std::string bytes = test::ReadWholeFile(state);
  bytes[bytes.size() - 3] ^= 0x40;
  tmp.WriteFile("s.k3state", bytes);
  const CliRun r = LoadInto(TinyPreparedDir(), state);
  EXPECT_EQ(r.exit_code, 3) << r.stderr_text;
}

TEST(K3runState, ForeignModelIsExit2) {
  test::TempDir tmp;
  const CliRun r = LoadInto(SmallPreparedDir(), SavedState(&tmp));
  EXPECT_EQ(r.exit_code, 2) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "another prepared directory")) << r.stderr_text;
}

TEST(K3runState, NotAStateFileIsExit2) {
  test::TempDir tmp;
  const CliRun r = LoadInto(TinyPreparedDir(), tmp.WriteFile("x", "{\"role\":\"user\"}\n"));
  EXPECT_EQ(r.exit_code, 2) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "not a k3 sequence state file")) << r.stderr_text;
}

TEST(K3runState, OtherLayersIsExit2) {
  test::TempDir tmp;
  const CliRun r = LoadInto(TinyPreparedDir(), SavedState(&tmp, {"--layers", "4"}));
  EXPECT_EQ(r.exit_code, 2) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "saved with --layers 4, this run has 13")) << r.stderr_text;
}

TEST(K3runState, MissingStateIsExit2AndChatOrRecomputeRefuseIt) {
  test::TempDir tmp;
  const CliRun missing = LoadInto(TinyPreparedDir(), tmp.Join("none"));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_TRUE(Has(missing.stderr_text, "--load-state")) << missing.stderr_text;
  const std::string state = SavedState(&tmp);
  const CliRun recompute = LoadInto(TinyPreparedDir(), state, {"--recompute"});
  EXPECT_EQ(recompute.exit_code, 2);
  const CliRun chat = RunCliArgs({TinyPreparedDir(), "--chat", "--load-state", state}, Stdin({}));
  EXPECT_EQ(chat.exit_code, 2);
  EXPECT_TRUE(Has(chat.stderr_text, "beside --history")) << chat.stderr_text;
}

// Turn 2 of a chat feeds only the reply's last token, the new message and the generation
// prompt; its reply is the one a fresh process gets by re-reading the whole conversation.
TEST(K3runChat, TurnTwoFeedsOnlyItsOwnTokensAndResumesFromTheState) {
  test::TempDir tmp;
  const std::string hist = tmp.Join("h.jsonl");
  const CliRun two = RunCliArgs({TinyPreparedDir(), "--chat", "--gen", "6", "--history", hist},
                                Stdin({"hi", "tell me more"}));
  ASSERT_EQ(two.exit_code, 0) << two.stderr_text;
  Result<std::vector<ChatMessage>> h = LoadHistory(Env::Default(), hist);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ(h->size(), 4u);
  Result<tok::Tokenizer> t = tok::Tokenizer::Load(
      Env::Default(), JoinPath(TinyCheckpointDir(), "tiktoken.model"),
      JoinPath(TinyCheckpointDir(), "tokenizer_config.json"), 1280);
  ASSERT_TRUE(t.ok());
  Result<ChatTemplate> tmpl = ChatTemplate::Create(&*t, "synth");
  ASSERT_TRUE(tmpl.ok());
  const TemplateOptions o{true, "max"};
  const std::vector<ChatMessage> turn1(h->begin(), h->begin() + 1);
  const std::vector<ChatMessage> turn2(h->begin(), h->begin() + 3);
  const size_t r1 = tmpl->Render(turn1, o, true).size();
  const size_t r2 = tmpl->Render(turn2, o, true).size();
  const size_t reply = (*h)[1].ids.size();
  ASSERT_GT(reply, 0u);
  const size_t fed2 = r2 - (r1 + reply - 1);
  EXPECT_TRUE(Has(two.stderr_text, "[" + std::to_string(fed2) + " new ids, " +
                                       std::to_string(r2) + " of 32768 positions]"))
      << two.stderr_text;

  // The same conversation re-read from a history without its state gives turn 2's reply.
  std::vector<ChatMessage> first_turn(h->begin(), h->begin() + 3);
  const std::string hist_b = tmp.Join("b.jsonl");
  ASSERT_TRUE(SaveHistory(Env::Default(), hist_b, first_turn).ok());
  const CliRun reread =
      RunCliArgs({TinyPreparedDir(), "--chat", "--gen", "6", "--history", hist_b}, Stdin({}));
  ASSERT_EQ(reread.exit_code, 0) << reread.stderr_text;
  Result<std::vector<ChatMessage>> hb = LoadHistory(Env::Default(), hist_b);
  ASSERT_TRUE(hb.ok());
  ASSERT_EQ(hb->size(), 4u);
  EXPECT_EQ((*hb)[3].ids, (*h)[3].ids);

  // A third turn in a new process loads the state and feeds only its own tokens.
  ASSERT_TRUE(std::filesystem::exists(hist + ".state"));
  const CliRun three =
      RunCliArgs({TinyPreparedDir(), "--chat", "--gen", "2", "--history", hist}, Stdin({"ok"}));
  ASSERT_EQ(three.exit_code, 0) << three.stderr_text;
  EXPECT_TRUE(Has(three.stderr_text, "[resumed ")) << three.stderr_text;
  EXPECT_FALSE(Has(three.stderr_text, "re-reading")) << three.stderr_text;
}

TEST(K3runChat, StateThatIsNotTheStartOfTheHistoryIsExit2) {
  test::TempDir tmp;
  const std::string hist = tmp.Join("h.jsonl");
  ASSERT_EQ(RunCliArgs({TinyPreparedDir(), "--chat", "--gen", "2", "--history", hist},
                       Stdin({"hi"}))
                .exit_code,
            0);
  Result<std::vector<ChatMessage>> h = LoadHistory(Env::Default(), hist);
  ASSERT_TRUE(h.ok());
  (*h)[0].content = "bye";  // the transcript no longer renders what the state holds
  ASSERT_TRUE(SaveHistory(Env::Default(), hist, *h).ok());
  const CliRun r =
      RunCliArgs({TinyPreparedDir(), "--chat", "--gen", "2", "--history", hist}, Stdin({"x"}));
  EXPECT_EQ(r.exit_code, 2) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "are not the start of what")) << r.stderr_text;
}

}  // namespace
}  // namespace k3::run::testing
