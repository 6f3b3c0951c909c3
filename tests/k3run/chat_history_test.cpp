// The JSONL chat history (k3run/text/chat_history.h): one test per reading rule with a malformed
// line, each asserting the file and line are named; round trip; atomic save under faults.
#include "k3run/text/chat_history.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/support/fault_env.h"
#include "tests/support/files.h"
#include "tests/support/temp_dir.h"

namespace k3::run {
namespace {

bool Has(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

const std::string kGood =
    "{\"role\":\"system\",\"content\":\"Be brief.\"}\n"
    "{\"role\":\"user\",\"content\":\"Hi\"}\n"
    "{\"role\":\"assistant\",\"content\":\"Hello\",\"reasoning_content\":\"greet\"}\n";

// Parses kGood with line 2 replaced by `line`; expects kInvalid naming h.jsonl:2 and `what`.
void ExpectLine2Rejected(const std::string& line, const std::string& what) {
  const std::string text = "{\"role\":\"system\",\"content\":\"s\"}\n" + line +
                           "\n{\"role\":\"assistant\",\"content\":\"a\"}\n";
  const Status s = ParseHistory(text, "h.jsonl").status();
  EXPECT_EQ(s.code(), Code::kInvalid) << line;
  EXPECT_TRUE(Has(s.message(), "h.jsonl:2: ")) << s.message();
  EXPECT_TRUE(Has(s.message(), what)) << s.message();
}

TEST(ChatHistory, ParsesAWellFormedTranscript) {
  Result<std::vector<ChatMessage>> r = ParseHistory(kGood, "h.jsonl");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[0].role, "system");
  EXPECT_EQ((*r)[1].content, "Hi");
  EXPECT_EQ((*r)[2].reasoning, "greet");
}

TEST(ChatHistory, DuplicateKeyIsRejected) {
  ExpectLine2Rejected(R"({"role":"user","content":"a","content":"b"})",
                      "duplicate key \"content\"");
}

TEST(ChatHistory, UnknownKeyIsRejected) {
  ExpectLine2Rejected(R"({"role":"user","content":"a","author":"bob"})", "unknown key \"author\"");
}

TEST(ChatHistory, RawControlByteIsRejectedWithOffset) {
  // Line 1 is 31 bytes + LF; the tab is column 28 of line 2, so byte offset 32 + 27.
  ExpectLine2Rejected("{\"role\":\"user\",\"content\":\"a\tb\"}",
                      "raw control byte 0x09 at byte offset 59 (column 28)");
}

// nlohmann throws out_of_range (not parse_error) for a number beyond a double; it escaped the
// reader as an internal error (found by chat_history_fuzz).
TEST(ChatHistory, NumberBeyondADoubleIsInvalidNotAnEscapingException) {
  ExpectLine2Rejected(R"({"role":"user","content":"a","n":1e999})", "invalid JSON: ");
  ExpectLine2Rejected("4e04471183", "invalid JSON: ");
}

TEST(ChatHistory, BadEscapeIsRejected) {
  ExpectLine2Rejected(R"({"role":"user","content":"a\qb"})", "invalid JSON at byte offset");
}

TEST(ChatHistory, UnpairedSurrogateEscapeIsRejected) {
  ExpectLine2Rejected(R"({"role":"user","content":"a\ud800b"})", "surrogate");
}

TEST(ChatHistory, LoneLowSurrogateEscapeIsRejected) {
  ExpectLine2Rejected(R"({"role":"user","content":"\udc00"})", "surrogate");
}

TEST(ChatHistory, EscapedNulIsRejected) {
  ExpectLine2Rejected(R"({"role":"user","content":"a\u0000b"})", "NUL");
}

TEST(ChatHistory, InvalidUtf8IsRejected) {
  ExpectLine2Rejected("{\"role\":\"user\",\"content\":\"a\xff\"}", "invalid JSON");
}

TEST(ChatHistory, BlankLineIsRejected) { ExpectLine2Rejected("", "blank line"); }

TEST(ChatHistory, TrailingDataIsRejected) {
  ExpectLine2Rejected(R"({"role":"user","content":"a"} {})", "invalid JSON");
}

TEST(ChatHistory, NonObjectLineIsRejected) {
  ExpectLine2Rejected(R"(["user","a"])", "expected a JSON object");
}

TEST(ChatHistory, NonStringValueIsRejected) {
  ExpectLine2Rejected(R"({"role":"user","content":7})", "\"content\" must be a string");
}

TEST(ChatHistory, MissingContentIsRejected) {
  ExpectLine2Rejected(R"({"role":"user"})", "missing key \"content\"");
}

TEST(ChatHistory, UnknownRoleIsRejected) {
  ExpectLine2Rejected(R"({"role":"function","content":"a"})", "role \"function\"");
}

TEST(ChatHistory, ReasoningOnUserIsRejected) {
  ExpectLine2Rejected(R"({"role":"user","content":"a","reasoning_content":"r"})",
                      "reasoning_content on a user message");
}

TEST(ChatHistory, IdsOnUserIsRejected) {
  ExpectLine2Rejected(R"({"role":"user","content":"a","ids":[1,2]})", "ids on a user message");
}

// Line 2 is an assistant reply with the given "ids" value.
Status ParseAssistantIds(const std::string& ids) {
  return ParseHistory("{\"role\":\"user\",\"content\":\"q\"}\n"
                      "{\"role\":\"assistant\",\"content\":\"a\",\"ids\":" + ids + "}\n",
                      "h.jsonl")
      .status();
}

TEST(ChatHistory, IdsThatAreNotAnArrayAreRejected) {
  const Status s = ParseAssistantIds("\"1,2\"");
  EXPECT_EQ(s.code(), Code::kInvalid);
  EXPECT_TRUE(Has(s.message(), "h.jsonl:2: \"ids\" must be an array")) << s.message();
}

TEST(ChatHistory, IdsOutsideTheTokenRangeAreRejected) {
  for (const char* bad : {"[1,-1]", "[1,2.5]", "[2147483648]", "[\"7\"]"}) {
    const Status s = ParseAssistantIds(bad);
    EXPECT_EQ(s.code(), Code::kInvalid) << bad;
    EXPECT_TRUE(Has(s.message(), "is not a token id in [0, 2147483647]")) << s.message();
  }
}

TEST(ChatHistory, AssistantIdsRoundTrip) {
  const std::vector<ChatMessage> m = {{"user", "q", ""}, {"assistant", "a", "", {5, 0, 2147483647}}};
  const std::string text = SerializeHistory(m);
  EXPECT_TRUE(Has(text, R"("ids":[5,0,2147483647])")) << text;
  Result<std::vector<ChatMessage>> back = ParseHistory(text, "t");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ((*back)[1].ids, (std::vector<int32_t>{5, 0, 2147483647}));
  EXPECT_TRUE((*back)[0].ids.empty());
}

TEST(ChatHistory, UserImagesRoundTrip) {
  ChatMessage user{"user", "What is it?", ""};
  user.images = {ChatImage{0, 61, 47, 6, "a.png", std::string(32, 'a')},
                 ChatImage{3, 1, 1, 1, "b c.jpg", std::string(32, 'b')}};
  const std::vector<ChatMessage> in = {user, {"assistant", "x", ""}};
  Result<std::vector<ChatMessage>> out = ParseHistory(SerializeHistory(in), "h.jsonl");
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ((*out)[0].images.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    const ChatImage &a = in[0].images[k], &b = (*out)[0].images[k];
    EXPECT_EQ(a.at, b.at);
    EXPECT_EQ(a.width, b.width);
    EXPECT_EQ(a.height, b.height);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.path, b.path);
    EXPECT_EQ(a.file_hash, b.file_hash);
  }
  EXPECT_FALSE(Has(SerializeHistory(in), "\"at\":0")) << "at 0 is left out";
}

TEST(ChatHistory, ImagesOnANonUserLineAreRejected) {
  ExpectLine2Rejected("{\"role\":\"assistant\",\"content\":\"a\",\"images\":[]}",
                      "images on a assistant message");
}

TEST(ChatHistory, BadImageItemsAreRejected) {
  const std::string good = "\"path\":\"a.png\",\"width\":2,\"height\":3,\"tokens\":1";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{" + good + "}", "must be {\"path\""},  // no xxh3
      {"{" + good + ",\"xxh3\":\"ab\",\"size\":1}", "unknown key \"size\""},
      {"{\"path\":\"a.png\",\"width\":0,\"height\":3,\"tokens\":1,\"xxh3\":\"ab\"}",
       "\"width\" must be an integer in [1, 2147483647]"},
      {"{" + good + ",\"xxh3\":7}", "\"xxh3\" must be a non-empty string"},
      {"3", "must be {\"path\""},
  };
  for (const auto& [item, what] : bad) {
    ExpectLine2Rejected("{\"role\":\"user\",\"content\":\"u\",\"images\":[" + item + "]}",
                        "\"images\" item 0" + (what.starts_with("must") ? std::string() : ": ") +
                            (what.starts_with("must") ? " " : "") + what);
  }
  ExpectLine2Rejected("{\"role\":\"user\",\"content\":\"u\",\"images\":{}}",
                      "\"images\" must be an array");
}

TEST(ChatHistory, OverlongLineIsRejected) {
  const std::string line =
      "{\"role\":\"user\",\"content\":\"" + std::string(kMaxHistoryLineBytes, 'a') + "\"}";
  ExpectLine2Rejected(line, "exceeds the 16 MiB limit");
}

TEST(ChatHistory, AssistantFirstBreaksRoleOrder) {
  const Status s = ParseHistory("{\"role\":\"assistant\",\"content\":\"a\"}\n", "h.jsonl").status();
  EXPECT_TRUE(Has(s.message(), "h.jsonl:1: role \"assistant\" where \"user\"")) << s.message();
}

TEST(ChatHistory, TwoUsersInARowBreakRoleOrder) {
  const Status s = ParseHistory(
      "{\"role\":\"user\",\"content\":\"a\"}\n{\"role\":\"user\",\"content\":\"b\"}\n", "h")
                       .status();
  EXPECT_TRUE(Has(s.message(), "h:2: role \"user\" where \"assistant\"")) << s.message();
}

TEST(ChatHistory, SystemAfterTheStartBreaksRoleOrder) {
  const Status s = ParseHistory(
      "{\"role\":\"user\",\"content\":\"a\"}\n{\"role\":\"system\",\"content\":\"b\"}\n", "h")
                       .status();
  EXPECT_TRUE(Has(s.message(), "h:2: role \"system\" where \"assistant\"")) << s.message();
}

TEST(ChatHistory, EndingWithAUserTurnIsAllowed) {
  EXPECT_TRUE(ParseHistory("{\"role\":\"user\",\"content\":\"a\"}\n", "h").ok());
}

const char kToolTranscript[] =
    "{\"role\":\"user\",\"content\":\"w?\"}\n"
    "{\"role\":\"assistant\",\"content\":\"\",\"ids\":[1,2],\"tool_calls\":[{\"id\":\"call_1\","
    "\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}]}\n"
    "{\"role\":\"tool\",\"content\":\"21C\",\"tool_call_id\":\"call_1\",\"name\":\"get_weather\"}\n"
    "{\"role\":\"assistant\",\"content\":\"warm\"}\n";

TEST(ChatHistory, ToolCallsAndResultsRoundTrip) {
  Result<std::vector<ChatMessage>> h = ParseHistory(kToolTranscript, "h");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ(h->size(), 4u);
  ASSERT_EQ((*h)[1].tool_calls.size(), 1u);
  EXPECT_EQ((*h)[1].tool_calls[0].id, "call_1");
  EXPECT_EQ((*h)[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ((*h)[1].tool_calls[0].arguments, "{\"city\":\"Paris\"}");
  EXPECT_EQ((*h)[2].role, "tool");
  EXPECT_EQ((*h)[2].tool_call_id, "call_1");
  EXPECT_EQ((*h)[2].name, "get_weather");
  EXPECT_EQ(SerializeHistory(*h), kToolTranscript);
  // A transcript may end with the results (the REPL answers them on resume), or with calls
  // that were never answered (the user goes on).
  EXPECT_TRUE(ParseHistory(std::string(kToolTranscript).substr(0, std::string(kToolTranscript).rfind("{\"role\":\"assistant")), "h").ok());
}

TEST(ChatHistory, ToolRulesAreEnforced) {
  ExpectLine2Rejected("{\"role\":\"user\",\"content\":\"a\",\"tool_calls\":[]}",
                      "tool_calls on a user message");
  ExpectLine2Rejected("{\"role\":\"user\",\"content\":\"a\",\"tool_call_id\":\"x\"}",
                      "tool_call_id on a user message");
  ExpectLine2Rejected("{\"role\":\"tool\",\"content\":\"a\"}", "needs the \"tool_call_id\"");
  const Status bad_call = ParseHistory(
      "{\"role\":\"user\",\"content\":\"a\"}\n{\"role\":\"assistant\",\"content\":"
      "\"\",\"tool_calls\":[{\"id\":\"c\",\"name\":\"f\"}]}\n", "h").status();
  EXPECT_TRUE(Has(bad_call.message(), "h:2: \"tool_calls\" item 0 must be {\"id\", \"name\", "
                                      "\"arguments\"}")) << bad_call.message();
  // A tool result where no call was made.
  const Status s = ParseHistory(
      "{\"role\":\"user\",\"content\":\"a\"}\n{\"role\":\"assistant\",\"content\":\"b\"}\n"
      "{\"role\":\"tool\",\"content\":\"r\",\"tool_call_id\":\"c\"}\n", "h").status();
  EXPECT_TRUE(Has(s.message(), "h:3: role \"tool\" where \"user\" must come")) << s.message();
}

TEST(ChatHistory, SerializeRoundTripsEveryByte) {
  std::string tricky = "quote\" back\\ nl\n cr\r tab\t bell\x07 del\x7f é 日本 😀";
  const std::vector<ChatMessage> m = {{"system", "s", ""},
                                      {"user", tricky, ""},
                                      {"assistant", "a\nb", "think \"hard\""}};
  const std::string text = SerializeHistory(m);
  EXPECT_TRUE(Has(text, R"(quote\" back\\ nl\n cr\r tab\t bell\u0007 del)")) << text;
  Result<std::vector<ChatMessage>> back = ParseHistory(text, "t");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->size(), 3u);
  EXPECT_EQ((*back)[1].content, tricky);
  EXPECT_EQ((*back)[2].reasoning, "think \"hard\"");
}

TEST(ChatHistory, MissingFileIsAnEmptyHistory) {
  test::TempDir tmp;
  Result<std::vector<ChatMessage>> r = LoadHistory(Env::Default(), tmp.Join("none.jsonl"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->empty());
}

TEST(ChatHistory, FailedSaveLeavesTheOldTranscript) {
  test::TempDir tmp;
  const std::string path = tmp.Join("h.jsonl");
  ASSERT_TRUE(SaveHistory(Env::Default(), path, {{"user", "old", ""}}).ok());
  const std::string before = SerializeHistory({{"user", "old", ""}});
  for (const test::FaultRule& rule :
       {test::FaultRule::RenameFails(), test::FaultRule::SyncFails(),
        test::FaultRule::EnospcAfter(3)}) {
    test::FaultEnv env;
    env.SetRule(tmp.path(), rule);
    const Status s = SaveHistory(&env, path, {{"user", "new", ""}, {"assistant", "x", ""}});
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(test::ReadWholeFile(path), before);
    EXPECT_FALSE(std::filesystem::exists(TempPathFor(path)));
  }
}

TEST(ChatHistory, SaveRefusesABadRoleOrder) {
  test::TempDir tmp;
  const Status s = SaveHistory(Env::Default(), tmp.Join("h"), {{"assistant", "a", ""}});
  EXPECT_EQ(s.code(), Code::kInvalid);
}

}  // namespace
}  // namespace k3::run
