// The chat page of `k3run --serve --web` (k3run/serve/web_page.h, k3run/serve/web/): the
// embedded bytes are the source tree's files (the test reads the tree; the binary never does),
// their content types, no key needed for the page while the API keeps its key, 404 without
// --web; and one exchange typed into the page in headless Chromium, whose streamed answer must
// be the text the API answers non-streamed for the same greedy request. The browser test SKIPS,
// saying so, when no Chromium is installed (Debian package chromium, or $K3_CHROMIUM).
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "k3run/serve/web_page.h"
#include "tests/k3run/engine_fixture.h"
#include "tests/k3run/headless_chromium.h"
#include "tests/k3run/server_fixture.h"
#include "tests/support/temp_dir.h"

namespace k3::run::testing {
namespace {

using nlohmann::json;

const char* const kFiles[] = {"chat.html", "chat.css", "chat.js"};

std::string SourceFile(const std::string& name) {
  std::ifstream f(std::string(K3_SOURCE_DIR) + "/k3run/serve/web/" + name, std::ios::binary);
  EXPECT_TRUE(f.good()) << name;
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A string field, "" when absent or null.
std::string StringOr(const json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : "";
}

std::vector<std::string> Tiny(std::vector<std::string> extra) {
  std::vector<std::string> a = {TinyPreparedDir(), "--no-floor", "--ctx", "512"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// ---- The embedded files, without a server ----

TEST(WebPage, EmbeddedFilesAreTheSourceFiles) {
  ASSERT_EQ(EmbeddedWebFiles().size(), std::size(kFiles));
  for (const char* name : kFiles) {
    const std::optional<WebAsset> a = FindWebAsset(std::string("/") + name);
    ASSERT_TRUE(a.has_value()) << name;
    // EXPECT_TRUE, not EXPECT_EQ: a difference names the file rather than printing it twice.
    EXPECT_TRUE(a->bytes == SourceFile(name)) << name << " differs from the source tree: rebuild";
  }
  EXPECT_TRUE(FindWebAsset("/")->bytes == SourceFile("chat.html"));
}

TEST(WebPage, ContentTypes) {
  EXPECT_EQ(FindWebAsset("/")->content_type, "text/html; charset=utf-8");
  EXPECT_EQ(FindWebAsset("/chat.css")->content_type, "text/css; charset=utf-8");
  EXPECT_EQ(FindWebAsset("/chat.js")->content_type, "text/javascript; charset=utf-8");
}

TEST(WebPage, OtherPathsAreNotFiles) {
  for (const char* path : {"", "chat.js", "/chat", "/web/chat.js", "/../chat.js", "/chat.js/",
                           "/CHAT.JS", "/index.html"}) {
    EXPECT_FALSE(FindWebAsset(path).has_value()) << path;
  }
}

// No external assets: nothing in the page names another origin (the server's
// Content-Security-Policy would block it anyway).
TEST(WebPage, NamesNoOtherOrigin) {
  for (const char* name : kFiles) {
    const std::string text = SourceFile(name);
    for (const char* scheme : {"http:", "https:", "ws:", "wss:", "url("}) {
      EXPECT_EQ(text.find(scheme), std::string::npos) << name << " contains " << scheme;
    }
  }
}

// ---- The server ----

TEST(ServerWeb, ServesThePageWithoutTheKeyAndKeepsTheApiKey) {
  const k3::test::TempDir dir;
  const std::string key_file = dir.WriteFile("key", "sesame\n");
  ServerProcess s(Tiny({"--web", "--api-key-file", key_file}));
  ASSERT_TRUE(s.WaitReady()) << s.stderr_text();
  httplib::Client c = s.Client();
  for (const auto& [path, name, type] :
       {std::tuple{"/", "chat.html", "text/html; charset=utf-8"},
        std::tuple{"/chat.css", "chat.css", "text/css; charset=utf-8"},
        std::tuple{"/chat.js", "chat.js", "text/javascript; charset=utf-8"}}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 200) << path << ": " << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), type) << path;
    EXPECT_TRUE(r->body == SourceFile(name)) << path << " is not the source tree's " << name;
    EXPECT_EQ(r->get_header_value("Cache-Control"), "no-cache") << path;
    EXPECT_NE(r->get_header_value("Content-Security-Policy").find("default-src 'self'"),
              std::string::npos)
        << path;
  }
  // Only the page is open: the API still wants the key.
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401) << models->body;
  auto keyed = c.Get("/v1/models", {{"Authorization", "Bearer sesame"}});
  ASSERT_TRUE(keyed);
  EXPECT_EQ(keyed->status, 200) << keyed->body;
  auto other = c.Get("/index.html");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
  // A query string does not change what / is.
  auto query = c.Get("/?q=1");
  ASSERT_TRUE(query);
  EXPECT_TRUE(query->body == SourceFile("chat.html"));
}

TEST(ServerWeb, NoPageWithoutWeb) {
  ServerProcess s(Tiny({}));
  ASSERT_TRUE(s.WaitReady()) << s.stderr_text();
  httplib::Client c = s.Client();
  for (const char* path : {"/", "/chat.js", "/chat.css"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 404) << path;
    const json body = json::parse(r->body, nullptr, false);
    EXPECT_EQ(body["error"]["code"], "not_found") << r->body;
  }
}

// ---- One exchange in headless Chromium ----

// Polls `expression` in the page until it is true (JSON true) or `seconds` pass.
bool WaitFor(HeadlessChromium* b, const std::string& expression, double seconds,
             std::string* last) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) {
    Result<json> v = b->Evaluate(expression);
    if (v.ok() && *v == true) return true;
    *last = v.ok() ? v->dump() : v.status().message();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// Opens the page, enters the key and the request's settings, types a question, presses Enter,
// waits for the streamed answer, and checks it is what the API answers non-streamed with
// temperature 0 (the same tokens: the server's deltas concatenate to the non-streamed text).
TEST(ServerWebChromium, OneExchangeMatchesTheApi) {
  const std::string exe = HeadlessChromium::Find();
  if (exe.empty()) {
    GTEST_SKIP() << "SKIPPED: the web chat page was not tested in a browser: no chromium, "
                    "chromium-browser or google-chrome on PATH (Debian: apt-get install chromium; "
                    "or set K3_CHROMIUM)";
  }
  const k3::test::TempDir dir;
  const std::string key_file = dir.WriteFile("key", "sesame\n");
  ServerProcess s(Tiny({"--web", "--api-key-file", key_file}));
  ASSERT_TRUE(s.WaitReady()) << s.stderr_text();

  const std::string question = "Say hello.";
  const json request = {{"messages", {{{"role", "user"}, {"content", question}}}},
                        {"max_tokens", 24},
                        {"temperature", 0},
                        {"reasoning_effort", "none"}};
  httplib::Client c = s.Client();
  auto whole = c.Post("/v1/chat/completions", {{"Authorization", "Bearer sesame"}},
                      request.dump(), "application/json");
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json message = json::parse(whole->body)["choices"][0]["message"];
  const std::string expected = StringOr(message, "content");
  // Never vacuous: the answer to compare has text (the tiny model's greedy tokens are fixed).
  ASSERT_FALSE(expected.empty()) << whole->body;

  Result<std::unique_ptr<HeadlessChromium>> started = HeadlessChromium::Start(exe);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  HeadlessChromium& b = **started;
  // Generous: two shared cores, and Chromium's first start creates its profile.
  const Status opened = b.Open("http://127.0.0.1:" + std::to_string(s.port()) + "/", 120);
  ASSERT_TRUE(opened.ok()) << opened.ToString() << "\n" << b.log();
  std::string last;
  ASSERT_TRUE(WaitFor(&b, "document.getElementById('health').textContent === 'ready'", 60, &last))
      << last;

  // The settings of the request above; the key, whose change makes the page fetch the model.
  const Result<json> set = b.Evaluate(R"JS((() => {
    const $ = (id) => document.getElementById(id);
    $('max-tokens').value = '24';
    $('temperature').value = '0';
    $('effort').value = 'none';
    $('api-key').value = 'sesame';
    $('api-key').dispatchEvent(new Event('change'));
    $('input').focus();
    return document.activeElement.id;
  })())JS");
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(*set, "input");
  ASSERT_TRUE(WaitFor(&b,
                      "document.getElementById('model').textContent === " +
                          json(BaseName(TinyPreparedDir())).dump(),
                      60, &last))
      << "the page did not show the model name (the bearer key from its settings): " << last;

  const Status typed = b.TypeAndPressEnter(question);
  ASSERT_TRUE(typed.ok()) << typed.ToString();
  ASSERT_TRUE(WaitFor(&b,
                      "(() => { const m = document.querySelector('.msg.assistant');"
                      " return m !== null && m.dataset.state !== 'streaming'; })()",
                      180, &last))
      << "no finished answer on the page: " << last << "\nserver:\n" << s.stderr_text();
  const Result<json> shown = b.Evaluate(R"JS((() => {
    const m = document.querySelector('.msg.assistant');
    const error = m.querySelector('.error');
    return {
      state: m.dataset.state, chunks: Number(m.dataset.chunks), events: Number(m.dataset.events),
      content: m.querySelector('.content').textContent,
      thinking: m.querySelector('.thinking').textContent,
      error: error ? error.textContent : '',
      user: Array.from(document.querySelectorAll('.msg.user'), (u) => u.textContent),
      input: document.getElementById('input').value,
      send_enabled: !document.getElementById('send').disabled,
      stop_disabled: document.getElementById('stop').disabled,
    };
  })())JS");
  ASSERT_TRUE(shown.ok()) << shown.status().ToString();
  const json& v = *shown;
  EXPECT_EQ(v["state"], "done") << v.dump();
  EXPECT_EQ(v["error"], "") << v.dump();
  EXPECT_EQ(v["user"], json::array({question})) << v.dump();
  EXPECT_EQ(v["content"], expected) << v.dump() << "\nAPI: " << whole->body;
  EXPECT_EQ(v["thinking"], StringOr(message, "reasoning_content")) << v.dump();
  // Streamed: the page read the answer as server-sent events (the role chunk, the deltas, the
  // finish chunk, [DONE]) and rendered each delta as it came. How many content deltas there are
  // is the server's timing (under load it sends the text of several tokens in one delta), so
  // only their presence is asserted.
  EXPECT_GE(v["events"].get<int>(), 3) << v.dump();
  EXPECT_GE(v["chunks"].get<int>(), 1) << v.dump();
  EXPECT_EQ(v["input"], "") << v.dump();
  EXPECT_TRUE(v["send_enabled"].get<bool>()) << v.dump();
  EXPECT_TRUE(v["stop_disabled"].get<bool>()) << v.dump();
}

}  // namespace
}  // namespace k3::run::testing
