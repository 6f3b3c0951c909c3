// Tool calls and structured output through `k3run --serve` (docs/TOOLS.md), on the tiny
// synthetic model: a call forced with tool_choice comes back as message.tool_calls (and as
// streamed tool_calls deltas that join to the same call), its arguments match the tool's
// schema, the result goes back as a `tool` message; response_format json_schema/json_object
// answers parse and validate; a constrained request has the same ids whatever else is batched
// and leaves the others' ids unchanged; malformed tool requests are 400s naming the field.
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "k3run/serve/openai_request.h"
#include "k3run/text/chat_template.h"
#include "tests/k3run/engine_fixture.h"
#include "tests/k3run/server_fixture.h"

namespace k3::run::testing {
namespace {

using nlohmann::json;

json Post(httplib::Client& c, const json& body, int* status, std::string* raw = nullptr) {
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  if (!r) {
    ADD_FAILURE() << "no response";
    *status = -1;
    return json();
  }
  *status = r->status;
  if (raw) *raw = r->body;
  return json::parse(r->body, nullptr, false);
}

std::vector<std::string> Tiny(std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {TinyPreparedDir(), "--no-floor", "--ctx", "1024"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// Enumerated values only: a forced call on random weights ends within a few tokens.
const json kWeatherParams = {
    {"type", "object"},
    {"properties",
     {{"city", {{"type", "string"}, {"enum", {"Paris", "Tokyo", "São Paulo"}}}},
      {"unit", {{"type", "string"}, {"enum", {"c", "f"}}}},
      {"days", {{"type", "integer"}, {"enum", {1, 2, 3}}}}}},
    {"required", {"city", "unit"}},
    {"additionalProperties", false}};

json Tools() {
  return json::array(
      {{{"type", "function"},
        {"function", {{"name", "get_weather"}, {"description", "Weather of a city."},
                      {"parameters", kWeatherParams}}}},
       {{"type", "function"},
        {"function", {{"name", "get_time"},
                      {"parameters", {{"type", "object"},
                                      {"properties", {{"zone", {{"enum", {"utc", "cet"}}}}}},
                                      {"required", {"zone"}}}}}}}});
}

json ForcedCall(bool stream) {
  return {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
          {"tools", Tools()},
          {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
          {"parallel_tool_calls", false},
          {"reasoning_effort", "none"},
          {"temperature", 0},
          {"max_tokens", 400},
          {"seed", 7},
          {"stream", stream}};
}

// The arguments of a get_weather call validate against kWeatherParams.
void ExpectWeatherArguments(const std::string& arguments) {
  const json a = json::parse(arguments, nullptr, false);
  ASSERT_TRUE(a.is_object()) << arguments;
  const std::set<std::string> cities = {"Paris", "Tokyo", "São Paulo"};
  ASSERT_TRUE(a.contains("city") && a["city"].is_string()) << arguments;
  EXPECT_TRUE(cities.count(a["city"].get<std::string>())) << arguments;
  ASSERT_TRUE(a.contains("unit") && a["unit"].is_string()) << arguments;
  EXPECT_TRUE(a["unit"] == "c" || a["unit"] == "f") << arguments;
  if (a.contains("days")) {
    EXPECT_TRUE(a["days"] == 1 || a["days"] == 2 || a["days"] == 3);
  }
  for (auto it = a.begin(); it != a.end(); ++it) {
    EXPECT_TRUE(it.key() == "city" || it.key() == "unit" || it.key() == "days") << arguments;
  }
}

TEST(ServerTools, ForcedCallRoundTrip) {
  ServerProcess s(Tiny());
  ASSERT_TRUE(s.WaitReady());
  httplib::Client c = s.Client();
  int status = 0;
  const json first = Post(c, ForcedCall(false), &status);
  ASSERT_EQ(status, 200) << first.dump() << s.stderr_text();
  const json& choice = first["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls") << first.dump();
  const json& message = choice["message"];
  EXPECT_TRUE(message["content"].is_null()) << first.dump();
  ASSERT_EQ(message["tool_calls"].size(), 1u) << first.dump();
  const json& call = message["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u) << call.dump();
  ExpectWeatherArguments(call["function"]["arguments"].get<std::string>());

  // The result goes back as the client sends it: the assistant message as returned, then the
  // tool message; the next turn is unconstrained (tool_choice none) and answers.
  json second = ForcedCall(false);
  second["tool_choice"] = "none";
  second["max_tokens"] = 4;
  second["messages"].push_back(message);
  second["messages"].push_back(
      {{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", "{\"temperature\":21}"}});
  const json next = Post(c, second, &status);
  ASSERT_EQ(status, 200) << next.dump();
  EXPECT_FALSE(next["choices"][0]["message"].contains("tool_calls")) << next.dump();
  // The server rendered the turn as the template renders those messages (the call's arguments
  // as XTML arguments, the result as a tool message: chat_template_test.cpp checks those ids
  // against hand-written ones).
  ApiRequest parsed;
  ApiError error;
  ASSERT_TRUE(ParseApiRequest(second.dump(), Endpoint::kChat, &parsed, &error)) << error.message;
  Result<ChatTemplate> tmpl = ChatTemplate::Create(&TinyTokenizer(), "tiny");
  ASSERT_TRUE(tmpl.ok());
  Result<std::vector<int32_t>> ids = tmpl->RenderChecked(parsed.messages, parsed.tmpl, true);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  EXPECT_EQ(next["usage"]["prompt_tokens"].get<size_t>(), ids->size());
  const std::string text = TinyTokenizer().Decode(*ids);
  EXPECT_NE(text.find("<|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>argument key="),
            std::string::npos) << text;
  EXPECT_NE(text.find("<|open|>message role=\"tool\" tool=\"get_weather\" index=\"1\"<|sep|>"
                      "{\"temperature\":21}<|close|>message<|sep|>"),
            std::string::npos) << text;
  EXPECT_GT(next["usage"]["prompt_tokens"].get<int>(), first["usage"]["prompt_tokens"].get<int>());
}

TEST(ServerTools, StreamedCallJoinsToTheWholeOne) {
  ServerProcess s(Tiny());
  ASSERT_TRUE(s.WaitReady());
  httplib::Client c = s.Client();
  int status = 0;
  const json whole = Post(c, ForcedCall(false), &status);
  ASSERT_EQ(status, 200) << whole.dump();
  std::string raw;
  (void)Post(c, ForcedCall(true), &status, &raw);
  ASSERT_EQ(status, 200) << raw;
  std::string id, name, arguments, finish;
  int pieces = 0;
  size_t at = 0;
  while ((at = raw.find("data: {", at)) != std::string::npos) {
    const size_t end = raw.find("\n\n", at);
    const json chunk = json::parse(raw.substr(at + 6, end - at - 6), nullptr, false);
    at = end;
    ASSERT_FALSE(chunk.is_discarded());
    if (chunk["choices"].empty()) continue;
    const json& ch = chunk["choices"][0];
    if (ch["finish_reason"].is_string()) finish = ch["finish_reason"];
    const json& delta = ch["delta"];
    if (delta.contains("content") && delta["content"].is_string()) {
      EXPECT_EQ(delta["content"], "") << "tool markup leaked into content: " << raw;
    }
    if (!delta.contains("tool_calls")) continue;
    for (const json& t : delta["tool_calls"]) {
      EXPECT_EQ(t["index"], 0);
      if (pieces++ == 0) {
        ASSERT_TRUE(t.contains("id") && t.contains("type")) << t.dump();
        id = t["id"];
        name = t["function"]["name"];
      } else {
        EXPECT_FALSE(t.contains("id")) << t.dump();
        EXPECT_FALSE(t["function"].contains("name")) << t.dump();
      }
      arguments += t["function"]["arguments"].get<std::string>();
    }
  }
  EXPECT_GT(pieces, 1) << raw;  // the id and name first, argument fragments after
  EXPECT_EQ(finish, "tool_calls");
  const json& call = whole["choices"][0]["message"]["tool_calls"][0];
  EXPECT_EQ(id, call["id"]);  // seeded: the same id
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(arguments, call["function"]["arguments"]);
}

// tool_choice none with tools declared: never a call, and never markup in the content.
TEST(ServerTools, ToolChoiceNoneNeverCalls) {
  ServerProcess s(Tiny());
  ASSERT_TRUE(s.WaitReady());
  httplib::Client c = s.Client();
  for (uint64_t seed = 0; seed < 4; ++seed) {
    json body = ForcedCall(false);
    body["tool_choice"] = "none";
    body["temperature"] = 1.0;
    body["seed"] = seed;
    body["max_tokens"] = 48;
    int status = 0;
    const json r = Post(c, body, &status);
    ASSERT_EQ(status, 200) << r.dump();
    const json& m = r["choices"][0]["message"];
    EXPECT_FALSE(m.contains("tool_calls")) << r.dump();
    EXPECT_NE(r["choices"][0]["finish_reason"], "tool_calls") << r.dump();
  }
}

const json kAnswerSchema = {
    {"type", "object"},
    {"properties",
     {{"answer", {{"enum", {"yes", "no"}}}},
      {"sure", {{"type", "boolean"}}},
      {"score", {{"type", "integer"}}},
      {"tags", {{"type", "array"}, {"items", {{"enum", {"a", "b"}}}}, {"maxItems", 3}}},
      {"why", {{"anyOf", {{{"type", "null"}}, {{"$ref", "#/$defs/level"}}}}}}}},
    {"required", {"answer", "sure", "score", "tags"}},
    {"additionalProperties", false},
    {"$defs", {{"level", {{"enum", {"low", "high"}}}}}}};

void ExpectValidAnswer(const std::string& content) {
  const json a = json::parse(content, nullptr, false);
  ASSERT_TRUE(a.is_object()) << content;
  EXPECT_TRUE(a["answer"] == "yes" || a["answer"] == "no") << content;
  EXPECT_TRUE(a["sure"].is_boolean()) << content;
  EXPECT_TRUE(a["score"].is_number_integer()) << content;
  ASSERT_TRUE(a["tags"].is_array()) << content;
  EXPECT_LE(a["tags"].size(), 3u) << content;
  for (const json& t : a["tags"]) EXPECT_TRUE(t == "a" || t == "b") << content;
  if (a.contains("why")) {
    EXPECT_TRUE(a["why"].is_null() || a["why"] == "low" || a["why"] == "high");
  }
  for (auto it = a.begin(); it != a.end(); ++it) {
    EXPECT_TRUE(kAnswerSchema["properties"].contains(it.key())) << content;
  }
}

json SchemaRequest(uint64_t seed) {
  return {{"messages", {{{"role", "user"}, {"content", "Answer in JSON."}}}},
          {"response_format",
           {{"type", "json_schema"}, {"json_schema", {{"name", "a"}, {"schema", kAnswerSchema}}}}},
          {"reasoning_effort", "none"},
          {"temperature", 1.0},
          {"seed", seed},
          {"max_tokens", 200}};
}

TEST(ServerTools, JsonSchemaAnswersValidate) {
  ServerProcess s(Tiny());
  ASSERT_TRUE(s.WaitReady());
  httplib::Client c = s.Client();
  for (uint64_t seed = 0; seed < 6; ++seed) {
    int status = 0;
    const json r = Post(c, SchemaRequest(seed), &status);
    ASSERT_EQ(status, 200) << r.dump();
    EXPECT_EQ(r["choices"][0]["finish_reason"], "stop") << r.dump();
    ExpectValidAnswer(r["choices"][0]["message"]["content"].get<std::string>());
  }
  json object = SchemaRequest(1);
  object["response_format"] = {{"type", "json_object"}};
  for (uint64_t seed = 0; seed < 4; ++seed) {
    object["seed"] = seed;
    int status = 0;
    const json r = Post(c, object, &status);
    ASSERT_EQ(status, 200) << r.dump();
    const std::string content = r["choices"][0]["message"]["content"];
    if (r["choices"][0]["finish_reason"] == "stop") {
      EXPECT_TRUE(json::parse(content, nullptr, false).is_object()) << content;
    }
  }
}

std::vector<int32_t> IdsOf(const json& j) { return j["k3"]["generated_ids"].get<std::vector<int32_t>>(); }

TEST(ServerTools, ConstrainedIdsAreTheSameWhateverIsBatched) {
  ServerProcess s(Tiny({"--max-seqs", "4"}));
  ASSERT_TRUE(s.WaitReady());
  httplib::Client c = s.Client();
  const json plain = {{"messages", {{{"role", "user"}, {"content", "Say something."}}}},
                      {"reasoning_effort", "none"}, {"temperature", 0}, {"max_tokens", 24},
                      {"ignore_eos", true}};
  int status = 0;
  const json constrained_alone = Post(c, SchemaRequest(3), &status);
  ASSERT_EQ(status, 200);
  const json plain_alone = Post(c, plain, &status);
  ASSERT_EQ(status, 200);
  json constrained_batched, plain_batched;
  std::vector<std::thread> t;
  t.emplace_back([&] {
    httplib::Client o = s.Client();
    int st = 0;
    constrained_batched = Post(o, SchemaRequest(3), &st);
    EXPECT_EQ(st, 200);
  });
  t.emplace_back([&] {
    httplib::Client o = s.Client();
    int st = 0;
    plain_batched = Post(o, plain, &st);
    EXPECT_EQ(st, 200);
  });
  t.emplace_back([&] {
    httplib::Client o = s.Client();
    int st = 0;
    (void)Post(o, ForcedCall(false), &st);
    EXPECT_EQ(st, 200);
  });
  for (std::thread& x : t) x.join();
  EXPECT_EQ(IdsOf(constrained_batched), IdsOf(constrained_alone));
  EXPECT_EQ(IdsOf(plain_batched), IdsOf(plain_alone));
}

TEST(ServerTools, BadToolRequestsName400Fields) {
  ServerProcess s(Tiny());
  ASSERT_TRUE(s.WaitReady());
  httplib::Client c = s.Client();
  struct Case {
    const char* what;
    json patch;         // merged into a valid request
    std::string param;  // the field the 400 names
    std::string words;  // in the message
  };
  const json user = {{{"role", "user"}, {"content", "hi"}}};
  json orphan = user;
  orphan.push_back({{"role", "tool"}, {"tool_call_id", "call_x"}, {"content", "1"}});
  json bad_schema = kAnswerSchema;
  bad_schema["properties"]["why"] = {{"type", "string"}, {"pattern", "^a+$"}};
  const std::vector<Case> cases = {
      {"tools not an array", {{"tools", {{"type", "function"}}}}, "tools", "array"},
      {"tool without a name", {{"tools", {{{"type", "function"}, {"function", json::object()}}}}},
       "tools[0].function.name", "characters"},
      {"unknown function", {{"tools", Tools()}, {"tool_choice", {{"type", "function"},
                                                                 {"function", {{"name", "nope"}}}}}},
       "tool_choice", "\"nope\""},
      {"tool message without a call", {{"messages", orphan}}, "messages[1].tool_call_id",
       "must follow"},
      {"unsupported keyword", {{"response_format", {{"type", "json_schema"},
                                                    {"json_schema", {{"schema", bad_schema}}}}}},
       "response_format.json_schema.schema", "pattern"},
      {"unsupported keyword in parameters",
       {{"tools", {{{"type", "function"},
                    {"function", {{"name", "f"}, {"parameters", {{"type", "object"},
                                                                 {"minProperties", 1}}}}}}}},
        {"tool_choice", "required"}},
       "tools[0].function.parameters", "minProperties"},
  };
  for (const Case& k : cases) {
    json body = {{"messages", user}, {"max_tokens", 4}};
    body.merge_patch(k.patch);
    int status = 0;
    const json r = Post(c, body, &status);
    EXPECT_EQ(status, 400) << k.what << ": " << r.dump();
    EXPECT_EQ(r["error"]["param"], k.param) << k.what << ": " << r.dump();
    EXPECT_NE(r["error"]["message"].get<std::string>().find(k.words), std::string::npos)
        << k.what << ": " << r.dump();
  }
  // Still serving, and tools with tool_choice auto are accepted (unconstrained).
  int status = 0;
  const json ok = Post(c, {{"messages", user}, {"tools", Tools()}, {"max_tokens", 4}}, &status);
  EXPECT_EQ(status, 200) << ok.dump();
}

}  // namespace
}  // namespace k3::run::testing
