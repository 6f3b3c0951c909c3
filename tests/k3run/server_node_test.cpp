// The official `openai` npm client against `k3run --serve` (tests/k3run/server/chat_stream.mjs):
// a streamed chat completion with usage, /v1/models, and a non-streamed call that must give the
// same text; and (tool_loop.mjs) a full streamed tool-call loop with the SDK's runTools. Needs node and tests/k3run/server/node_modules (scripts/setup.sh); SKIPS visibly
// without them.
#include <cstdio>
#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/k3run/engine_fixture.h"
#include "tests/k3run/server_fixture.h"

namespace k3::run::testing {
namespace {

const std::string kClientDir = std::string(K3_SOURCE_DIR) + "/tests/k3run/server";

std::string Missing() {
  if (std::system("command -v node >/dev/null 2>&1") != 0) return "node is not on PATH";
  if (!std::filesystem::exists(kClientDir + "/node_modules/openai/package.json")) {
    return "no openai npm package in " + kClientDir +
           "/node_modules (run scripts/setup.sh; it needs the npm registry)";
  }
  return "";
}

// Runs `node SCRIPT BASE_URL MODEL` from the client directory; its last JSON line.
nlohmann::json RunClient(const ServerProcess& s, const std::string& script) {
  const std::string cmd = "cd '" + kClientDir + "' && node " + script + " 'http://127.0.0.1:" +
                          std::to_string(s.port()) + "/v1' '" + BaseName(TinyPreparedDir()) +
                          "' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return nlohmann::json();
  std::string out;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = ::pclose(p);
  EXPECT_EQ(rc, 0) << out << "\nserver:\n" << s.stderr_text();
  const size_t brace = out.rfind("\n{\"");
  return nlohmann::json::parse(out.substr(brace == std::string::npos ? 0 : brace + 1), nullptr,
                               false);
}

TEST(ServerOpenAiClient, StreamsAChatCompletion) {
  const std::string missing = Missing();
  if (!missing.empty()) GTEST_SKIP() << "SKIPPED: the openai client test did not run: " << missing;
  ServerProcess s({TinyPreparedDir(), "--no-floor", "--ctx", "512"});
  ASSERT_TRUE(s.WaitReady());
  const nlohmann::json j = RunClient(s, "chat_stream.mjs");
  ASSERT_TRUE(j.is_object()) << j.dump();
  EXPECT_GT(j["chunks"].get<int>(), 1);
  EXPECT_TRUE(j["finish_reason"] == "stop" || j["finish_reason"] == "length") << j.dump();
  EXPECT_EQ(j["content"], j["whole_content"]) << j.dump();
  EXPECT_EQ(j["reasoning"], j["whole_reasoning"]) << j.dump();
  EXPECT_GT(j["usage"]["completion_tokens"].get<int>(), 0) << j.dump();
}

TEST(ServerOpenAiClient, RunsAStreamedToolCallLoop) {
  const std::string missing = Missing();
  if (!missing.empty()) GTEST_SKIP() << "SKIPPED: the openai client test did not run: " << missing;
  ServerProcess s({TinyPreparedDir(), "--no-floor", "--ctx", "1024"});
  ASSERT_TRUE(s.WaitReady());
  const nlohmann::json j = RunClient(s, "tool_loop.mjs");
  ASSERT_TRUE(j.is_object()) << j.dump();
  // The SDK parsed the streamed call and ran the function once with schema-valid arguments.
  ASSERT_EQ(j["called"].size(), 1u) << j.dump();
  const nlohmann::json& args = j["called"][0];
  EXPECT_TRUE(args["city"] == "Paris" || args["city"] == "Tokyo") << j.dump();
  EXPECT_TRUE(args["unit"] == "c" || args["unit"] == "f") << j.dump();
  EXPECT_EQ(j["calls_finish"], "tool_calls");
  ASSERT_GT(j["deltas"].size(), 1u) << j.dump();
  EXPECT_TRUE(j["deltas"][0].contains("id")) << j.dump();
  EXPECT_EQ(j["deltas"][0]["function"]["name"], "get_weather");
  // The conversation it sent back: user, the assistant's call, the tool's result.
  const nlohmann::json& m = j["messages"];
  ASSERT_GE(m.size(), 3u) << j.dump();
  EXPECT_EQ(m[1]["role"], "assistant");
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(m[2]["role"], "tool");
  EXPECT_EQ(m[2]["tool_call_id"], m[1]["tool_calls"][0]["id"]);
  EXPECT_TRUE(j["finish"] == "stop" || j["finish"] == "length") << j.dump();
}

}  // namespace
}  // namespace k3::run::testing
