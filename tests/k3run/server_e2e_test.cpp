// `k3run PREPARED --serve` as a process on a free loopback port, driven over HTTP: the same ids
// as the CLI (completions and chat, streamed and not, 8 concurrent clients), a client that leaves
// frees its slot, 429 when the queue is full, 400/404/413 and still serving, the API key,
// SIGTERM during a stream, /health, /v1/models, /metrics.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "k3run/text/utf8.h"
#include "tests/k3run/engine_fixture.h"
#include "tests/k3run/server_fixture.h"

namespace k3::run::testing {
namespace {

using nlohmann::json;

json PostJson(httplib::Client& c, const std::string& path, const json& body, int* status,
              std::string* raw = nullptr) {
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  if (!r) {
    ADD_FAILURE() << "no response from " << path;
    *status = -1;
    return json();
  }
  *status = r->status;
  if (raw) *raw = r->body;
  return json::parse(r->body, nullptr, false);
}

std::vector<int32_t> IdsOf(const json& j) {
  return j["k3"]["generated_ids"].get<std::vector<int32_t>>();
}

json Ids(const std::vector<int32_t>& ids) { return json(ids); }

std::vector<std::string> Tiny(std::vector<std::string> extra = {}, const std::string& ctx = "512") {
  std::vector<std::string> a = {TinyPreparedDir(), "--no-floor", "--ctx", ctx};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// The value of the Prometheus sample `name` in `text` (NaN when absent).
double MetricValue(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return std::nan("");
  return std::strtod(text.c_str() + at + name.size() + 2, nullptr);
}

TEST(Server, HealthModelsMetrics) {
  ServerProcess s(Tiny());
  ASSERT_TRUE(s.listening());
  {
    // The listener starts before the weights load: /health answers at once, 503 or 200.
    httplib::Client early = s.Client();
    auto h = early.Get("/health");
    ASSERT_TRUE(h);
    const std::string status = json::parse(h->body)["status"];
    EXPECT_TRUE((h->status == 503 && status == "loading") || (h->status == 200 && status == "ok"))
        << h->status << " " << h->body;
  }
  ASSERT_TRUE(s.WaitReady());
  httplib::Client c = s.Client();
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  const json j = json::parse(m->body);
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], BaseName(TinyPreparedDir()));
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(json::parse(h->body)["status"], "ok");
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("k3_passes_total"), std::string::npos);
  EXPECT_NE(metrics->body.find("k3_active_sequences 0"), std::string::npos);
}

TEST(Server, CompletionIdsEqualCli) {
  const std::vector<int32_t> cli = CliGeneratedIds({TinyPreparedDir(), "--ids", kPromptText,
                                                    "--gen", "12"});
  ServerProcess s(Tiny());
  ASSERT_TRUE(s.WaitReady());
  httplib::Client c = s.Client();
  int status = 0;
  const json r = PostJson(c, "/v1/completions",
                          {{"prompt", Ids(kPrompt)}, {"max_tokens", 12}, {"temperature", 0}},
                          &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(IdsOf(r), cli);
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["usage"]["prompt_tokens"], kPrompt.size());
  EXPECT_EQ(r["usage"]["completion_tokens"], cli.size());
  EXPECT_EQ(r["choices"][0]["finish_reason"], cli.size() == 12 ? "length" : "stop");
  // Streamed: the same ids, and the deltas make the same text.
  std::string raw;
  (void)PostJson(c, "/v1/completions",
                 {{"prompt", Ids(kPrompt)}, {"max_tokens", 12}, {"temperature", 0},
                  {"stream", true}, {"stream_options", {{"include_usage", true}}}},
                 &status, &raw);
  ASSERT_EQ(status, 200);
  const SseParse p = ParseSse(raw);
  EXPECT_TRUE(p.done);
  EXPECT_EQ(p.content, r["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(IdsOf(p.final_chunk), cli);
  EXPECT_NE(raw.find("\"total_tokens\""), std::string::npos);
}

TEST(Server, TextCompletionEqualsCliPrompt) {
  const std::string text = "The quick brown fox";
  std::string cli_text;
  const std::vector<int32_t> cli = CliGeneratedIds({TinyPreparedDir(), "--prompt", text, "--gen",
                                                    "10"}, &cli_text);
  ServerProcess s(Tiny());
  ASSERT_TRUE(s.WaitReady());
  httplib::Client c = s.Client();
  int status = 0;
  const json r = PostJson(
      c, "/v1/completions",
      {{"model", BaseName(TinyPreparedDir())}, {"prompt", text}, {"max_tokens", 10},
       {"temperature", 0}},
      &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(IdsOf(r), cli);
  // The text is the CLI's stdout, made valid UTF-8 for JSON.
  EXPECT_EQ(r["choices"][0]["text"].get<std::string>(), SanitizeUtf8(cli_text));
}

// The CLI's chat keeps each reply's ids in --history: the server's chat must give those ids.
std::vector<int32_t> CliChatIds(const std::string& message, const std::vector<std::string>& flags) {
  const std::string history = ::testing::TempDir() + "/server_chat_" + std::to_string(::getpid()) +
                              ".jsonl";
  std::filesystem::remove(history);
  std::filesystem::remove(history + ".state");
  std::vector<std::string> args = {TinyPreparedDir(), "--chat", "--history", history, "--no-floor",
                                   "--quiet", "--ctx", "512"};
  args.insert(args.end(), flags.begin(), flags.end());
  const CliRun run = RunCliArgs(args, Stdin({message}));
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  std::ifstream in(history);
  std::string line, last;
  while (std::getline(in, line)) last = line;
  const json j = json::parse(last, nullptr, false);
  if (j.is_discarded() || !j.contains("ids")) {
    ADD_FAILURE() << "no assistant line in " << history;
    return {};
  }
  return j["ids"].get<std::vector<int32_t>>();
}

TEST(Server, ChatIdsEqualCliChat) {
  const std::vector<int32_t> no_think = CliChatIds("hello there", {"--no-think", "--gen", "16"});
  const std::vector<int32_t> low = CliChatIds("hello there", {"--thinking-effort", "low", "--gen",
                                                              "16"});
  ServerProcess s(Tiny());
  ASSERT_TRUE(s.WaitReady());
  httplib::Client c = s.Client();
  const json messages = json::array({{{"role", "user"}, {"content", "hello there"}}});
  int status = 0;
  const json a = PostJson(c, "/v1/chat/completions",
                          {{"messages", messages}, {"max_tokens", 16}, {"temperature", 0},
                           {"reasoning_effort", "none"}},
                          &status);
  ASSERT_EQ(status, 200) << a.dump();
  EXPECT_EQ(IdsOf(a), no_think);
  EXPECT_EQ(a["object"], "chat.completion");
  EXPECT_EQ(a["choices"][0]["message"]["role"], "assistant");
  EXPECT_FALSE(a["choices"][0]["message"].contains("reasoning_content"));
  std::string raw;
  (void)PostJson(c, "/v1/chat/completions",
                 {{"messages", messages}, {"max_tokens", 16}, {"temperature", 0},
                  {"reasoning_effort", "low"}, {"stream", true}},
                 &status, &raw);
  ASSERT_EQ(status, 200);
  const SseParse p = ParseSse(raw);
  EXPECT_TRUE(p.done);
  EXPECT_EQ(IdsOf(p.final_chunk), low);
  const json b = PostJson(c, "/v1/chat/completions",
                          {{"messages", messages}, {"max_tokens", 16}, {"temperature", 0},
                           {"reasoning_effort", "low"}},
                          &status);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(IdsOf(b), low);
  EXPECT_EQ(b["choices"][0]["message"]["content"].get<std::string>(), p.content);
  EXPECT_EQ(b["choices"][0]["message"]["reasoning_content"].get<std::string>(), p.reasoning);
}

TEST(Server, EightConcurrentClientsGetTheirOwnCliIds) {
  const std::vector<int32_t> base = {3, 7, 11, 5, 9, 300, 1000, 42, 17, 23, 99, 250, 31, 64, 128,
                                     77, 5, 8, 13, 21, 34, 55, 89, 144};
  constexpr int kClients = 8;
  std::vector<std::vector<int32_t>> prompts, want;
  for (int i = 0; i < kClients; ++i) {
    prompts.emplace_back(base.begin(), base.begin() + 3 + 3 * i);
    std::string ids;
    for (int32_t id : prompts.back()) ids += (ids.empty() ? "" : ",") + std::to_string(id);
    want.push_back(CliGeneratedIds({TinyPreparedDir(), "--ids", ids, "--gen", "10"}));
  }
  ServerProcess s(Tiny({"--max-seqs", "4", "--queue", "8"}));
  ASSERT_TRUE(s.WaitReady());
  std::vector<std::vector<int32_t>> got(kClients);
  std::vector<int> statuses(kClients, 0);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      httplib::Client c = s.Client();
      const bool stream = i % 2 == 1;
      std::string raw;
      const json r = PostJson(c, "/v1/completions",
                              {{"prompt", Ids(prompts[static_cast<size_t>(i)])},
                               {"max_tokens", 10}, {"temperature", 0}, {"stream", stream}},
                              &statuses[static_cast<size_t>(i)], &raw);
      if (stream) {
        got[static_cast<size_t>(i)] = IdsOf(ParseSse(raw).final_chunk);
      } else if (r.contains("k3")) {
        got[static_cast<size_t>(i)] = IdsOf(r);
      }
    });
  }
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(statuses[static_cast<size_t>(i)], 200) << "client " << i;
    EXPECT_EQ(got[static_cast<size_t>(i)], want[static_cast<size_t>(i)]) << "client " << i;
  }
}

TEST(Server, SeededSamplingIsTheSameWhateverIsBatched) {
  ServerProcess s(Tiny({"--max-seqs", "4"}));
  ASSERT_TRUE(s.WaitReady());
  const json sampled = {{"prompt", Ids(kPrompt)}, {"max_tokens", 12}, {"temperature", 0.9},
                        {"top_k", 50}, {"seed", 42}, {"ignore_eos", true}};
  httplib::Client c = s.Client();
  int status = 0;
  const json alone = PostJson(c, "/v1/completions", sampled, &status);
  ASSERT_EQ(status, 200) << alone.dump();
  std::vector<std::thread> others;
  for (int i = 0; i < 3; ++i) {
    others.emplace_back([&, i] {
      httplib::Client o = s.Client();
      int st = 0;
      std::vector<int32_t> prompt(kPrompt.begin(), kPrompt.begin() + 2 + i);
      (void)PostJson(o, "/v1/completions",
                     {{"prompt", Ids(prompt)}, {"max_tokens", 20}, {"temperature", 1.0},
                      {"seed", i}, {"ignore_eos", true}},
                     &st);
      EXPECT_EQ(st, 200);
    });
  }
  const json batched = PostJson(c, "/v1/completions", sampled, &status);
  for (std::thread& t : others) t.join();
  ASSERT_EQ(status, 200) << batched.dump();
  EXPECT_EQ(IdsOf(batched), IdsOf(alone));
}

// A client re-sends its conversation each turn: with --prompt-cache-gb the second request starts
// from a snapshot of the first (its prompt and reply), with the same ids as without the cache.
// Ids, not chat text: a reply re-encoded from its text need not be the ids it was generated as.
TEST(Server, PromptCacheServesTheResentConversation) {
  auto turn = [](const std::vector<int32_t>& prompt) {
    return json{{"prompt", Ids(prompt)}, {"max_tokens", 8}, {"temperature", 0},
                {"ignore_eos", true}};
  };
  // The first turn, then the second (the first's prompt and reply, then 3 new ids): the second
  // turn's response (null when a request failed).
  auto two_turns = [&](ServerProcess& s, httplib::Client& c) -> json {
    EXPECT_TRUE(s.WaitReady());
    int status = 0;
    const json a = PostJson(c, "/v1/completions", turn(kPrompt), &status);
    EXPECT_EQ(status, 200) << a.dump();
    if (status != 200) return nullptr;
    std::vector<int32_t> p = kPrompt;
    for (int32_t id : IdsOf(a)) p.push_back(id);
    for (int32_t id : {12, 34, 56}) p.push_back(id);
    const json b = PostJson(c, "/v1/completions", turn(p), &status);
    EXPECT_EQ(status, 200) << b.dump();
    return status == 200 ? b : json(nullptr);
  };
  std::vector<int32_t> uncached;
  {
    ServerProcess s(Tiny());
    httplib::Client c = s.Client();
    const json b = two_turns(s, c);
    ASSERT_FALSE(b.is_null());
    EXPECT_EQ(b["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    uncached = IdsOf(b);
  }
  ServerProcess s(Tiny({"--prompt-cache-gb", "0.5"}));
  httplib::Client c = s.Client();
  const json b = two_turns(s, c);
  ASSERT_FALSE(b.is_null());
  EXPECT_EQ(IdsOf(b), uncached);
  EXPECT_GE(b["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(),
            static_cast<int64_t>(kPrompt.size()))
      << b.dump();
  EXPECT_EQ(b["k3"]["prompt_cached_tokens"], b["usage"]["prompt_tokens_details"]["cached_tokens"]);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("k3_prompt_cache_hits_total 1"), std::string::npos) << m->body;
  // Two requests of several tokens each: the engine's gaps between their passes are timed.
  const double passes = MetricValue(m->body, "k3_passes_total");
  const double gaps = MetricValue(m->body, "k3_engine_idle_seconds_count");
  EXPECT_GE(passes, 4) << m->body;
  EXPECT_GE(gaps, passes - 2) << m->body;  // the wait for the second request is not a gap
  EXPECT_LE(gaps, passes - 1) << m->body;
  EXPECT_GE(MetricValue(m->body, "k3_engine_idle_seconds{quantile=\"0.5\"}"), 0.0) << m->body;
}

const json kLongRequest = {{"prompt", Ids(kPrompt)}, {"max_tokens", 20000}, {"temperature", 0},
                           {"ignore_eos", true}, {"stream", true}};

// After the first request (cmpl-1, 20000 tokens asked) was left by its client on a one-slot
// server: the next request runs, and the first ended early (stopped or cancelled).
void ExpectTheSlotWasFreed(const ServerProcess& s, httplib::Client& c) {
  int status = 0;
  const json r = PostJson(c, "/v1/completions",
                          {{"prompt", Ids(kPrompt)}, {"max_tokens", 4}, {"temperature", 0}},
                          &status);
  EXPECT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["usage"]["completion_tokens"], 4);
  const std::string log = s.StderrOnceItHas("request cmpl-1:");
  const size_t at = log.find("request cmpl-1:");
  ASSERT_NE(at, std::string::npos) << log;
  const std::string line = log.substr(at, log.find('\n', at) - at);
  EXPECT_TRUE(line.find("stopped") != std::string::npos ||
              line.find("cancelled") != std::string::npos) << line;
}

TEST(Server, ClientThatLeavesFreesItsSlot) {
  ServerProcess s(Tiny({"--max-seqs", "1", "--queue", "4"}, "20100"));
  ASSERT_TRUE(s.WaitReady());
  {
    RawStream leaving(s.port(), "/v1/completions", kLongRequest.dump());
    ASSERT_TRUE(leaving.ReadUntil("\"text\"", 60)) << leaving.received();
    leaving.Close();
  }
  httplib::Client c = s.Client();
  ExpectTheSlotWasFreed(s, c);
}

// A non-streamed request writes nothing until it is done: the server watches its connection,
// and a client that closes it frees the slot at the next pass.
TEST(Server, NonStreamedClientThatLeavesFreesItsSlot) {
  ServerProcess s(Tiny({"--max-seqs", "1", "--queue", "4"}, "20100"));
  ASSERT_TRUE(s.WaitReady());
  httplib::Client c = s.Client();
  json whole = kLongRequest;
  whole["stream"] = false;
  {
    RawStream leaving(s.port(), "/v1/completions", whole.dump());
    // Running: wait until it holds the slot.
    bool active = false;
    for (int i = 0; i < 600 && !active; ++i) {
      auto m = c.Get("/metrics");
      active = m && m->body.find("k3_active_sequences 1") != std::string::npos;
      if (!active) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(active);
    leaving.Close();
  }
  ExpectTheSlotWasFreed(s, c);
}

TEST(Server, QueueFullAnswers429) {
  ServerProcess s(Tiny({"--max-seqs", "1", "--queue", "0"}, "20100"));
  ASSERT_TRUE(s.WaitReady());
  RawStream running(s.port(), "/v1/completions", kLongRequest.dump());
  ASSERT_TRUE(running.ReadUntil("\"text\"", 60)) << running.received();
  httplib::Client c = s.Client();
  auto r = c.Post("/v1/completions",
                  json{{"prompt", Ids(kPrompt)}, {"max_tokens", 2}, {"temperature", 0}}.dump(),
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429) << r->body;
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "queue_full");
  running.Close();
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("k3_requests_rejected_total 1"), std::string::npos) << m->body;
}

TEST(Server, BadRequestsAreRefusedAndTheServerGoesOn) {
  ServerProcess s(Tiny());
  ASSERT_TRUE(s.WaitReady());
  httplib::Client c = s.Client();
  auto post = [&](const std::string& path, const std::string& body) {
    auto r = c.Post(path.c_str(), body, "application/json");
    EXPECT_TRUE(r);
    return r ? std::make_pair(r->status, json::parse(r->body, nullptr, false))
             : std::make_pair(-1, json());
  };
  auto [s1, b1] = post("/v1/chat/completions", "{\"messages\": [");
  EXPECT_EQ(s1, 400);
  EXPECT_EQ(b1["error"]["type"], "invalid_request_error");
  auto [s2, b2] = post("/v1/completions", R"({"prompt":[1,2],"temperature":"hot"})");
  EXPECT_EQ(s2, 400);
  EXPECT_EQ(b2["error"]["param"], "temperature");
  auto [s3, b3] = post("/v1/completions", R"({"prompt":[1,2],"max_tokens":-1})");
  EXPECT_EQ(s3, 400);
  EXPECT_EQ(b3["error"]["param"], "max_tokens");
  auto [s4, b4] = post("/v1/completions", R"({"model":"gpt-4","prompt":[1,2]})");
  EXPECT_EQ(s4, 404);
  EXPECT_EQ(b4["error"]["code"], "model_not_found");
  auto [s5, b5] = post("/v1/completions", R"({"prompt":[1,2,99999999]})");
  EXPECT_EQ(s5, 400);
  EXPECT_EQ(b5["error"]["param"], "prompt");
  auto [s6, b6] = post("/v1/completions", json{{"prompt", std::vector<int32_t>(600, 5)}}.dump());
  EXPECT_EQ(s6, 400);
  EXPECT_EQ(b6["error"]["code"], "context_length_exceeded");
  auto [s7, b7] = post("/v1/chat/completions",
                       R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})");
  EXPECT_EQ(s7, 400);  // a tool without its function (tools themselves: server_tools_test.cpp)
  EXPECT_EQ(b7["error"]["param"], "tools[0].function");
  const std::string big = "{\"prompt\":\"" + std::string(5u << 20, 'a') + "\"}";
  auto r8 = c.Post("/v1/completions", big, "application/json");
  if (r8) {  // the server may also close the connection before reading the body
    EXPECT_EQ(r8->status, 413);
  }
  auto r9 = c.Get("/v1/nothing");
  ASSERT_TRUE(r9);
  EXPECT_EQ(r9->status, 404);
  int status = 0;
  const json ok = PostJson(c, "/v1/completions",
                           {{"prompt", Ids(kPrompt)}, {"max_tokens", 3}, {"temperature", 0}},
                           &status);
  EXPECT_EQ(status, 200) << ok.dump();
}

TEST(Server, ApiKeyRequiredWhenSet) {
  const std::string key_file = ::testing::TempDir() + "/server_key_" + std::to_string(::getpid());
  const std::string key = "sekrit-key-5150";
  std::ofstream(key_file) << key << "\n";
  ServerProcess s(Tiny({"--api-key-file", key_file}));
  ASSERT_TRUE(s.listening());
  ASSERT_TRUE(s.WaitReady());  // /health needs no key
  httplib::Client c = s.Client();
  const std::string body =
      json{{"prompt", Ids(kPrompt)}, {"max_tokens", 2}, {"temperature", 0}}.dump();
  auto none = c.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(json::parse(none->body)["error"]["code"], "invalid_api_key");
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401);
  auto wrong = c.Post("/v1/completions", {{"Authorization", "Bearer nope"}}, body,
                      "application/json");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  auto right = c.Post("/v1/completions", {{"Authorization", "Bearer " + key}}, body,
                      "application/json");
  ASSERT_TRUE(right);
  EXPECT_EQ(right->status, 200) << right->body;
  EXPECT_EQ(s.stderr_text().find(key), std::string::npos) << "the key was logged";
}

// SIGTERM to the server while `stream` is open: it exits 0 within 5 s, without leaving a pass
// behind; what the stream received, parsed.
SseParse SigtermAndExpectACleanExit(ServerProcess& s, RawStream* stream) {
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(::kill(s.pid(), SIGTERM), 0);
  stream->ReadToEnd(10);
  const std::optional<int> status = s.WaitExit(10);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(status) << "still running 10 s after SIGTERM";
  if (status) {
    EXPECT_TRUE(WIFEXITED(*status)) << *status;
    EXPECT_EQ(WEXITSTATUS(*status), 0) << s.stderr_text();
  }
  EXPECT_LT(seconds, 5.0);
  EXPECT_EQ(s.stderr_text().find("exiting without waiting"), std::string::npos) << s.stderr_text();
  return ParseSse(DechunkedBody(stream->received()));
}

TEST(Server, SigtermEndsStreamsWithAnErrorAndExitsZero) {
  ServerProcess s(Tiny({}, "20100"));
  ASSERT_TRUE(s.WaitReady());
  RawStream stream(s.port(), "/v1/completions", kLongRequest.dump());
  ASSERT_TRUE(stream.ReadUntil("\"text\"", 60)) << stream.received();
  const SseParse p = SigtermAndExpectACleanExit(s, &stream);
  EXPECT_FALSE(p.error.is_null()) << stream.received().substr(0, 2000);
  EXPECT_FALSE(p.done);
}

// A pass of the released model takes tens of seconds: SIGTERM discards the pass in flight at
// its next layer (Engine::Interrupt) instead of waiting for it. Here one 1000-row prefill pass
// of the small model (about 14 s on 2 cores) is interrupted.
TEST(Server, SigtermInterruptsThePassInFlight) {
  ServerProcess s({SmallPreparedDir(), "--no-floor", "--ctx", "1100", "--chunk", "1000"});
  ASSERT_TRUE(s.WaitReady());
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 1000; ++i) prompt.push_back((i * 7919) % 4000 + 1);
  const json request = {{"prompt", Ids(prompt)}, {"max_tokens", 4}, {"temperature", 0},
                        {"stream", true}};
  RawStream stream(s.port(), "/v1/completions", request.dump());
  // The first keep-alive comes a second into the prefill pass.
  ASSERT_TRUE(stream.ReadUntil(": keep-alive", 30)) << stream.received();
  const SseParse p = SigtermAndExpectACleanExit(s, &stream);
  ASSERT_FALSE(p.error.is_null()) << stream.received().substr(0, 2000);
  EXPECT_EQ(p.error["code"], "shutting_down") << p.error.dump();
  EXPECT_NE(p.error["message"].get<std::string>().find("interrupted: the pass stopped before layer"),
            std::string::npos)
      << p.error.dump();
}

TEST(Server, PortInUseIsAnIoError) {
  ServerProcess s(Tiny());
  ASSERT_TRUE(s.listening());
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--serve", "--port", std::to_string(s.port()),
                               "--ctx", "64", "--no-floor"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.stderr_text.find("cannot listen on 127.0.0.1:" + std::to_string(s.port())),
            std::string::npos)
      << r.stderr_text;
}

TEST(Server, SmallCompletionIdsEqualCli) {
  const std::vector<int32_t> cli = CliGeneratedIds({SmallPreparedDir(), "--ids", kPromptText,
                                                    "--gen", "6"});
  ServerProcess s({SmallPreparedDir(), "--no-floor", "--ctx", "64", "--max-seqs", "2"});
  ASSERT_TRUE(s.WaitReady());
  httplib::Client c = s.Client();
  int status = 0;
  const json r = PostJson(c, "/v1/completions",
                          {{"prompt", Ids(kPrompt)}, {"max_tokens", 6}, {"temperature", 0},
                           {"stream", false}},
                          &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(IdsOf(r), cli);
}

// --spec 4: four concurrent requests (greedy, greedy streamed, seeded sampled, and a chat under
// response_format) get the ids of the same requests to a server without --spec; the greedy
// ones are also the CLI's. Only the greedy ones may draft (the others decode without drafts).
TEST(ServerSpec, ConcurrentRequestsGetTheIdsOfAServerWithoutSpec) {
  std::vector<int32_t> repeated;
  for (int i = 0; i < 3; ++i) repeated.insert(repeated.end(), kPrompt.begin(), kPrompt.end());
  const std::vector<json> bodies = {
      {{"prompt", Ids(repeated)}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}},
      {{"prompt", Ids(kPrompt)}, {"max_tokens", 20}, {"temperature", 0}, {"ignore_eos", true},
       {"stream", true}},
      {{"prompt", Ids(kPrompt)}, {"max_tokens", 12}, {"temperature", 0.9}, {"top_k", 50},
       {"seed", 42}, {"ignore_eos", true}},
      {{"messages", {{{"role", "user"}, {"content", "Give me a JSON object."}}}},
       {"max_tokens", 16}, {"temperature", 0}, {"reasoning_effort", "none"},
       {"response_format", {{"type", "json_object"}}}},
  };
  auto serve = [&](std::vector<std::string> flags, std::string* metrics) {
    ServerProcess s(Tiny(flags));
    EXPECT_TRUE(s.WaitReady());
    std::vector<std::vector<int32_t>> ids(bodies.size());
    std::vector<std::thread> clients;
    for (size_t i = 0; i < bodies.size(); ++i) {
      clients.emplace_back([&, i] {
        httplib::Client c = s.Client();
        int status = 0;
        std::string raw;
        const bool chat = bodies[i].contains("messages");
        const json r = PostJson(c, chat ? "/v1/chat/completions" : "/v1/completions", bodies[i],
                                &status, &raw);
        EXPECT_EQ(status, 200) << "request " << i << ": " << raw;
        if (bodies[i].contains("stream")) {
          ids[i] = IdsOf(ParseSse(raw).final_chunk);
        } else if (r.contains("k3")) {
          ids[i] = IdsOf(r);
        }
      });
    }
    for (std::thread& t : clients) t.join();
    httplib::Client c = s.Client();
    auto m = c.Get("/metrics");
    EXPECT_TRUE(m);
    if (m) *metrics = m->body;
    return ids;
  };
  std::string plain_metrics, spec_metrics;
  const auto plain = serve({"--max-seqs", "4"}, &plain_metrics);
  const auto spec = serve({"--max-seqs", "4", "--spec", "4"}, &spec_metrics);
  ASSERT_EQ(plain.size(), spec.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_FALSE(plain[i].empty()) << "request " << i;
    EXPECT_EQ(spec[i], plain[i]) << "request " << i;
  }
  std::string repeated_text;
  for (int32_t id : repeated) {
    repeated_text += (repeated_text.empty() ? "" : ",") + std::to_string(id);
  }
  EXPECT_EQ(plain[0], CliGeneratedIds({TinyPreparedDir(), "--ids", repeated_text, "--gen", "24",
                                       "--ignore-eos"}));
  EXPECT_EQ(plain[1], CliGeneratedIds({TinyPreparedDir(), "--ids", kPromptText, "--gen", "20",
                                       "--ignore-eos"}));
  EXPECT_EQ(MetricValue(plain_metrics, "k3_spec_drafted_tokens_total"), 0);
  const double drafted = MetricValue(spec_metrics, "k3_spec_drafted_tokens_total");
  const double accepted = MetricValue(spec_metrics, "k3_spec_accepted_tokens_total");
  EXPECT_GE(drafted, accepted) << spec_metrics;
  EXPECT_GE(MetricValue(spec_metrics, "k3_spec_verifications_total"), 0) << spec_metrics;
}

}  // namespace
}  // namespace k3::run::testing
