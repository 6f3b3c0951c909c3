// The server's pieces without a server: request parsing and validation (one test per rule),
// the streamed text (stop strings and split UTF-8 held back, chat channels), response bodies.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "k3run/serve/client_socket.h"
#include "k3run/serve/openai_request.h"
#include "k3run/serve/openai_response.h"
#include "k3run/serve/server_routes.h"
#include "k3run/serve/stream_text.h"
#include "k3run/engine/session.h"
#include "tests/k3run/engine_fixture.h"

namespace k3::run {
namespace {

using nlohmann::json;

ApiError ParseError(const std::string& body, Endpoint e = Endpoint::kChat) {
  ApiRequest r;
  ApiError err;
  EXPECT_FALSE(ParseApiRequest(body, e, &r, &err)) << body;
  return err;
}

ApiRequest ParseOk(const std::string& body, Endpoint e = Endpoint::kChat) {
  ApiRequest r;
  ApiError err;
  EXPECT_TRUE(ParseApiRequest(body, e, &r, &err)) << body << ": " << err.message;
  return r;
}

const char kHello[] = R"({"model":"m","messages":[{"role":"user","content":"hi"}])";

std::string Chat(const std::string& extra) {
  return std::string(kHello) + (extra.empty() ? "" : "," + extra) + "}";
}

TEST(OpenAiRequest, ChatDefaults) {
  const ApiRequest r = ParseOk(Chat(""));
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].role, "user");
  EXPECT_EQ(r.messages[0].content, "hi");
  EXPECT_EQ(r.sampling.temperature, 1.0);  // OpenAI's default: sampling
  EXPECT_FALSE(r.max_tokens);
  EXPECT_FALSE(r.stream);
  EXPECT_TRUE(r.tmpl.thinking);
  EXPECT_EQ(r.tmpl.effort, "max");
}

TEST(OpenAiRequest, UnknownFieldsAndNullsIgnored) {
  const ApiRequest r = ParseOk(Chat(R"("user":"x","foo":{"bar":1},"top_p":null,"tools":[])"));
  EXPECT_FALSE(r.sampling.top_p);
}

TEST(OpenAiRequest, SamplingFields) {
  const ApiRequest r = ParseOk(Chat(
      R"("temperature":0,"top_p":0.5,"top_k":7,"min_p":0.1,"presence_penalty":0.5,)"
      R"("frequency_penalty":-0.5,"seed":-1,"max_tokens":12,"stop":["a","","bc"],"stream":true,)"
      R"("stream_options":{"include_usage":true})"));
  EXPECT_EQ(r.sampling.temperature, 0.0);
  EXPECT_FALSE(r.sampling.sampling());
  EXPECT_EQ(r.sampling.top_p, 0.5);
  EXPECT_EQ(r.sampling.top_k, 7);
  EXPECT_EQ(r.sampling.min_p, 0.1);
  EXPECT_EQ(r.sampling.presence_penalty, 0.5);
  EXPECT_EQ(r.sampling.frequency_penalty, -0.5);
  EXPECT_EQ(r.seed, UINT64_MAX);
  EXPECT_EQ(r.max_tokens, 12);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(OpenAiRequest, MalformedJson) {
  const ApiError e = ParseError("{\"messages\": [");
  EXPECT_EQ(e.http, 400);
  EXPECT_EQ(e.type, "invalid_request_error");
  EXPECT_EQ(e.code, "invalid_json");
}

TEST(OpenAiRequest, BodyNotAnObject) { EXPECT_EQ(ParseError("[1,2]").http, 400); }

TEST(OpenAiRequest, WrongTypeNamesTheField) {
  EXPECT_EQ(ParseError(Chat(R"("temperature":"hot")")).param, "temperature");
  EXPECT_EQ(ParseError(Chat(R"("max_tokens":1.5)")).param, "max_tokens");
  EXPECT_EQ(ParseError(Chat(R"("stream":"yes")")).param, "stream");
  EXPECT_EQ(ParseError(Chat(R"("stop":[1])")).param, "stop");
  EXPECT_EQ(ParseError(Chat(R"("seed":"1")")).param, "seed");
  EXPECT_EQ(ParseError(R"({"messages":"hi"})").param, "messages");
  EXPECT_EQ(ParseError(R"({"messages":[{"role":"user","content":3}]})").param,
            "messages[0].content");
  EXPECT_EQ(ParseError(R"({"model":3,"messages":[{"role":"user","content":"x"}]})").param, "model");
}

TEST(OpenAiRequest, NegativeMaxTokens) {
  const ApiError e = ParseError(Chat(R"("max_tokens":-5)"));
  EXPECT_EQ(e.http, 400);
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_EQ(ParseError(Chat(R"("max_completion_tokens":0)")).param, "max_completion_tokens");
}

TEST(OpenAiRequest, SamplerRangesNameTheField) {
  const ApiError e = ParseError(Chat(R"("temperature":-1)"));
  EXPECT_EQ(e.param, "temperature");
  EXPECT_NE(e.message.find("'temperature'"), std::string::npos) << e.message;
  EXPECT_EQ(ParseError(Chat(R"("top_p":1.5)")).param, "top_p");
  EXPECT_EQ(ParseError(Chat(R"("top_k":-1)")).param, "top_k");
  EXPECT_EQ(ParseError(Chat(R"("min_p":2)")).param, "min_p");
}

TEST(OpenAiRequest, UnsupportedFeaturesRefused) {
  EXPECT_EQ(ParseError(Chat(R"("logprobs":true)")).param, "logprobs");
  EXPECT_EQ(ParseError(Chat(R"("n":2)")).param, "n");
  EXPECT_EQ(ParseError(Chat(R"("functions":[{"name":"f"}])")).param, "functions");
  ParseOk(Chat(R"("logprobs":false,"n":1,"response_format":{"type":"text"})"));
  // Completions take no chat-only fields.
  EXPECT_EQ(ParseError(R"({"prompt":"x","tools":[]})", Endpoint::kCompletion).param, "tools");
  EXPECT_EQ(ParseError(R"({"prompt":"x","response_format":{"type":"json_object"}})",
                       Endpoint::kCompletion).param, "response_format");
}

const char kTool[] =
    R"({"type":"function","function":{"name":"get_weather","description":"d",)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string"}}}}})";

TEST(OpenAiRequest, ToolsAndToolChoice) {
  ApiRequest r = ParseOk(Chat(std::string(R"("tools":[)") + kTool + "]"));
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0].name, "get_weather");
  EXPECT_EQ(r.tool_choice, "auto");  // OpenAI's default with tools
  EXPECT_TRUE(r.parallel_tool_calls);
  EXPECT_NE(r.tmpl.tools_json.find("get_weather"), std::string::npos);
  EXPECT_EQ(r.tmpl.tool_choice, "auto");
  r = ParseOk(Chat(std::string(R"("tools":[)") + kTool +
                   R"(],"tool_choice":{"type":"function","function":{"name":"get_weather"}},)"
                   R"("parallel_tool_calls":false)"));
  EXPECT_EQ(r.tool_choice, "function");
  EXPECT_EQ(r.tool_choice_name, "get_weather");
  EXPECT_FALSE(r.parallel_tool_calls);
  r = ParseOk(Chat(std::string(R"("tools":[)") + kTool + R"(],"tool_choice":"required")"));
  EXPECT_EQ(r.tool_choice, "required");
  EXPECT_EQ(ParseOk(Chat("")).tool_choice, "none");  // no tools: none
  // A tool without parameters gets the empty object schema.
  r = ParseOk(Chat(R"("tools":[{"type":"function","function":{"name":"f"}}])"));
  EXPECT_EQ(r.tools[0].parameters, R"({"type":"object","properties":{}})");
}

TEST(OpenAiRequest, BadToolFieldsNameTheField) {
  const std::string t = std::string(R"("tools":[)") + kTool + "]";
  EXPECT_EQ(ParseError(Chat(R"("tools":{"a":1})")).param, "tools");
  EXPECT_EQ(ParseError(Chat(R"("tools":[1])")).param, "tools[0]");
  EXPECT_EQ(ParseError(Chat(R"("tools":[{"type":"retrieval"}])")).param, "tools[0].type");
  EXPECT_EQ(ParseError(Chat(R"("tools":[{"type":"function","function":{"name":"a b"}}])")).param,
            "tools[0].function.name");
  EXPECT_EQ(ParseError(Chat(R"("tools":[{"type":"function","function":{"name":"f"}},)"
                            R"({"type":"function","function":{"name":"f"}}])")).param,
            "tools[1].function.name");
  EXPECT_EQ(ParseError(Chat(R"("tools":[{"type":"function","function":{"name":"f",)"
                            R"("parameters":[1]}}])")).param,
            "tools[0].function.parameters");
  EXPECT_EQ(ParseError(Chat(t + R"(,"tool_choice":"sometimes")")).param, "tool_choice");
  const ApiError unknown =
      ParseError(Chat(t + R"(,"tool_choice":{"type":"function","function":{"name":"nope"}})"));
  EXPECT_EQ(unknown.param, "tool_choice");
  EXPECT_NE(unknown.message.find("\"nope\""), std::string::npos) << unknown.message;
  EXPECT_EQ(ParseError(Chat(R"("tool_choice":"required")")).param, "tool_choice");
  EXPECT_EQ(ParseError(Chat(t + R"(,"parallel_tool_calls":1)")).param, "parallel_tool_calls");
  EXPECT_EQ(ParseError(Chat(R"("response_format":{"type":"xml"})")).param,
            "response_format.type");
  EXPECT_EQ(ParseError(Chat(R"("response_format":{"type":"json_schema"})")).param,
            "response_format.json_schema");
  EXPECT_EQ(ParseError(Chat(R"("response_format":{"type":"json_schema","json_schema":{}})")).param,
            "response_format.json_schema.schema");
  EXPECT_EQ(ParseError(Chat(t + R"(,"tool_choice":"required","response_format":)"
                                R"({"type":"json_object"})")).param,
            "response_format");
}

TEST(OpenAiRequest, ToolMessages) {
  const ApiRequest r = ParseOk(
      R"({"messages":[{"role":"user","content":"w?"},)"
      R"({"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",)"
      R"("function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},)"
      R"({"role":"tool","tool_call_id":"call_1","content":"21C"}]})");
  ASSERT_EQ(r.messages.size(), 3u);
  ASSERT_EQ(r.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[1].tool_calls[0].id, "call_1");
  EXPECT_EQ(r.messages[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.messages[1].tool_calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(r.messages[2].role, "tool");
  EXPECT_EQ(r.messages[2].tool_call_id, "call_1");
  // A tool message must answer a call of the assistant message before it.
  EXPECT_EQ(ParseError(R"({"messages":[{"role":"user","content":"w?"},)"
                       R"({"role":"tool","tool_call_id":"call_1","content":"x"}]})").param,
            "messages[1].tool_call_id");
  EXPECT_EQ(ParseError(R"({"messages":[{"role":"user","content":"w?"},)"
                       R"({"role":"assistant","tool_calls":[{"id":"a","type":"function",)"
                       R"("function":{"name":"f","arguments":"{}"}}]},)"
                       R"({"role":"tool","tool_call_id":"b","content":"x"}]})").param,
            "messages[2].tool_call_id");
  EXPECT_EQ(ParseError(R"({"messages":[{"role":"user","content":"w?"},)"
                       R"({"role":"tool","content":"x"}]})").param,
            "messages[1].tool_call_id");
  EXPECT_EQ(ParseError(R"({"messages":[{"role":"user","content":"w?","tool_calls":[]}]})").param,
            "messages[0].tool_calls");
}

TEST(OpenAiRequest, Roles) {
  const ApiRequest r = ParseOk(
      R"({"messages":[{"role":"developer","content":"be brief"},{"role":"user","content":[)"
      R"({"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant",)"
      R"("content":"c","reasoning_content":"r"},{"role":"user","content":"d"}]})");
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(r.messages[2].reasoning, "r");
  EXPECT_EQ(ParseError(R"({"messages":[{"role":"function","content":"x"}]})").param,
            "messages[0].role");
  EXPECT_EQ(ParseError(R"({"messages":[]})").param, "messages");
  EXPECT_EQ(ParseError(R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})")
                .param,
            "messages[0].content");
}

TEST(OpenAiRequest, ReasoningEffort) {
  EXPECT_FALSE(ParseOk(Chat(R"("reasoning_effort":"none")")).tmpl.thinking);
  EXPECT_FALSE(ParseOk(Chat(R"("reasoning_effort":"minimal")")).tmpl.thinking);
  EXPECT_EQ(ParseOk(Chat(R"("reasoning_effort":"low")")).tmpl.effort, "low");
  EXPECT_EQ(ParseOk(Chat(R"("reasoning_effort":"medium")")).tmpl.effort, "high");
  EXPECT_EQ(ParseOk(Chat(R"("reasoning_effort":"max")")).tmpl.effort, "max");
  EXPECT_EQ(ParseError(Chat(R"("reasoning_effort":"extreme")")).param, "reasoning_effort");
}

TEST(OpenAiRequest, CompletionPrompts) {
  EXPECT_EQ(ParseOk(R"({"prompt":"abc"})", Endpoint::kCompletion).prompt, "abc");
  EXPECT_EQ(ParseOk(R"({"prompt":["abc"]})", Endpoint::kCompletion).prompt, "abc");
  EXPECT_EQ(ParseOk(R"({"prompt":[1,2,3]})", Endpoint::kCompletion).prompt_ids,
            (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(ParseOk(R"({"prompt":[[4,5]]})", Endpoint::kCompletion).prompt_ids,
            (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(ParseError(R"({"prompt":[1,-2]})", Endpoint::kCompletion).param, "prompt");
  EXPECT_EQ(ParseError(R"({"prompt":["a","b"]})", Endpoint::kCompletion).param, "prompt");
  EXPECT_EQ(ParseError(R"({"prompt":""})", Endpoint::kCompletion).param, "prompt");
  EXPECT_EQ(ParseError(R"({})", Endpoint::kCompletion).param, "prompt");
  EXPECT_EQ(ParseError(R"({"prompt":"a","echo":true})", Endpoint::kCompletion).param, "echo");
  EXPECT_EQ(ParseError(R"({"prompt":"a","logprobs":2})", Endpoint::kCompletion).param,
            "logprobs");
}

TEST(OpenAiRequest, ErrorBodyShape) {
  const json j = json::parse(ErrorBody(BadRequest("bad", "temperature")));
  EXPECT_EQ(j["error"]["message"], "bad");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "temperature");
  EXPECT_TRUE(j["error"]["code"].is_null());
}

// A loopback connection: the server side is found by its addresses and ports among this
// process's descriptors, open while the client is, closed once the client closes.
TEST(ClientSocket, FindsTheConnectionAndSeesTheClientLeave) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(listener, 1), 0);
  socklen_t n = sizeof a;
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &n), 0);
  const int server_port = ntohs(a.sin_port);
  const int client = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const int accepted = ::accept(listener, nullptr, nullptr);
  ASSERT_GE(accepted, 0);
  sockaddr_in c = {};
  n = sizeof c;
  ASSERT_EQ(::getsockname(client, reinterpret_cast<sockaddr*>(&c), &n), 0);
  const int client_port = ntohs(c.sin_port);

  EXPECT_FALSE(ClientSocket::Find("127.0.0.1", server_port, "127.0.0.1", client_port + 1).found());
  EXPECT_FALSE(ClientSocket::Find("127.0.0.2", server_port, "127.0.0.1", client_port).found());
  const ClientSocket s = ClientSocket::Find("127.0.0.1", server_port, "127.0.0.1", client_port);
  ASSERT_TRUE(s.found());
  EXPECT_FALSE(s.Closed());
  ASSERT_EQ(::write(client, "x", 1), 1);  // unread data is not a close
  EXPECT_FALSE(s.Closed());
  ::close(client);
  EXPECT_TRUE(s.Closed());
  EXPECT_FALSE(ClientSocket().Closed());  // not found: never "closed"
  ::close(accepted);
  ::close(listener);
}

TEST(ServerAuth, BearerMatches) {
  EXPECT_TRUE(BearerMatches("Bearer k3y", "k3y"));
  EXPECT_FALSE(BearerMatches("Bearer k3z", "k3y"));
  EXPECT_FALSE(BearerMatches("Bearer k3", "k3y"));
  EXPECT_FALSE(BearerMatches("k3y", "k3y"));
  EXPECT_FALSE(BearerMatches("", "k3y"));
}

TEST(OpenAiResponse, FinalChunksEndWithDone) {
  ResponseMeta m{"chatcmpl-1", 1, "tiny", Endpoint::kChat, false};
  Outcome o;
  o.finish_reason = "length";
  o.prompt_tokens = 3;
  o.completion_tokens = 2;
  o.generated_ids = {5, 6};
  const std::string s = FinalChunks(m, o, /*usage=*/true);
  EXPECT_NE(s.find("\"finish_reason\":\"length\""), std::string::npos);
  EXPECT_NE(s.find("\"total_tokens\":5"), std::string::npos);
  EXPECT_NE(s.find("\"generated_ids\":[5,6]"), std::string::npos);
  EXPECT_EQ(s.substr(s.size() - 14), "data: [DONE]\n\n");
}

// ---- StreamText on the tiny model's tokenizer ----

class StreamTextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<Engine>> e = Engine::Open(Env::Default(), testing::TinyPreparedDir());
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(e).value();
    ASSERT_NE(engine_->tokenizer(), nullptr);
  }
  const tok::Tokenizer& tok() const { return *engine_->tokenizer(); }
  std::unique_ptr<Engine> engine_;
};

// Feeds every id; the deltas concatenated are the final text.
TextDelta FeedAll(StreamText* t, const std::vector<int32_t>& ids) {
  TextDelta all;
  for (int32_t id : ids) {
    const TextDelta d = t->Token(id);
    all.content += d.content;
    all.reasoning += d.reasoning;
  }
  const TextDelta d = t->Finish();
  all.content += d.content;
  all.reasoning += d.reasoning;
  EXPECT_EQ(all.content, t->content());
  EXPECT_EQ(all.reasoning, t->reasoning());
  return all;
}

TEST_F(StreamTextTest, PlainTextRoundTrips) {
  const std::string text = "Hello wörld, 3 × 4 = 12 € ✓";
  StreamText t(&tok(), nullptr, false, {});
  EXPECT_EQ(FeedAll(&t, tok().Encode(text, false)).content, text);
}

TEST_F(StreamTextTest, SplitUtf8NeverInADelta) {
  // One id per byte of a multi-byte character: no delta may end inside the character.
  const std::string text = "€✓ö";
  std::vector<int32_t> ids;
  const int64_t vocab = engine_->config().vocab;
  for (char ch : text) {
    int32_t found = -1;
    for (int32_t id = 0; id < vocab && found < 0; ++id) {
      if (tok().TokenBytes(id) == std::string_view(&ch, 1)) found = id;
    }
    ASSERT_GE(found, 0) << "no single-byte token for " << int(static_cast<unsigned char>(ch));
    ids.push_back(found);
  }
  StreamText t(&tok(), nullptr, false, {});
  std::string all;
  for (int32_t id : ids) {
    const std::string d = t.Token(id).content;
    EXPECT_EQ(d.find("\xEF\xBF\xBD"), std::string::npos) << "a U+FFFD for a split character";
    all += d;
  }
  all += t.Finish().content;
  EXPECT_EQ(all, text);
}

TEST_F(StreamTextTest, StopStringHeldBackAndNotShown) {
  StreamText t(&tok(), nullptr, false, {"STOP"});
  std::string shown;
  for (int32_t id : tok().Encode("abc ST", false)) shown += t.Token(id).content;
  EXPECT_EQ(shown, "abc ");  // "ST" may begin the stop string: held back
  for (int32_t id : tok().Encode("OP tail", false)) shown += t.Token(id).content;
  shown += t.Finish().content;
  EXPECT_TRUE(t.stopped());
  EXPECT_EQ(shown, "abc ");
}

TEST_F(StreamTextTest, ChatChannelsSplitThinkingFromAnswer) {
  Result<ChatTemplate> tmpl = ChatTemplate::Create(&tok(), "tiny");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  const std::vector<ChatMessage> user = {{"user", "hi", ""}};
  TemplateOptions o;
  const std::vector<int32_t> prompt = tmpl->Render(user, o, true);
  std::vector<ChatMessage> full = user;
  full.push_back({"assistant", "the answer", "some thought"});
  std::vector<int32_t> done = tmpl->Render(full, o, false);
  ASSERT_GT(done.size(), prompt.size());
  ASSERT_TRUE(std::equal(prompt.begin(), prompt.end(), done.begin()));
  const std::vector<int32_t> completion(done.begin() + static_cast<std::ptrdiff_t>(prompt.size()),
                                        done.end());
  StreamText t(&tok(), &*tmpl, /*thinking=*/true, {});
  const TextDelta all = FeedAll(&t, completion);
  EXPECT_EQ(all.reasoning, "some thought");
  EXPECT_EQ(all.content, "the answer");
}

}  // namespace
}  // namespace k3::run

namespace k3::run {
namespace {

// ---- The --serve flags, refused before anything listens ----

// Each case: the flags after the prepared directory, and what the refusal (exit 2) must say.
TEST(ServeFlags, RefusedWithExit2NamingTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--serve", "--ids", "1,2", "--no-floor"}, "--serve cannot be used with a prompt"},
      {{"--ids", "1,2", "--max-seqs", "2"}, "--max-seqs needs --batch or --serve"},
      // --spec itself serves (server_e2e_test.cpp ServerSpec); these cannot.
      {{"--serve", "--spec", "17", "--no-floor"}, "--spec 17: must be in [0, 16]"},
      {{"--serve", "--spec-fixed", "--no-floor"}, "--spec-fixed needs --spec N"},
      {{"--serve", "--spec", "2", "--spec-oracle", "1,2", "--no-floor"},
       "--serve cannot be used with --spec-oracle"},
      {{"--web", "--ids", "1,2"}, "--web needs --serve"},
      {{"--serve", "--port", "0", "--ctx", "64", "--no-floor", "--api-key-file",
        "/nonexistent/key"},
       "--api-key-file"},
  };
  for (const auto& [flags, says] : cases) {
    std::vector<std::string> args = {testing::TinyPreparedDir()};
    args.insert(args.end(), flags.begin(), flags.end());
    const testing::CliRun r = testing::RunCliArgs(args);
    EXPECT_EQ(r.exit_code, 2) << flags[0] << " " << flags[1];
    EXPECT_NE(r.stderr_text.find(says), std::string::npos) << r.stderr_text;
    EXPECT_EQ(r.stderr_text.find("listening on"), std::string::npos) << r.stderr_text;
  }
}

}  // namespace
}  // namespace k3::run
