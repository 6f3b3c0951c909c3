// The server against slow clients (k3run/serve/front_door.h), with k3run --serve as a process:
// 60 connections trickling one header byte a second do not delay /health (< 1 s every time) nor
// stop a completion from getting its CLI ids; a head or body that misses its deadline gets 408;
// past --max-connections the connection that waited longest is closed with 503; the front
// door's own refusals (411, 413, 431, 400); Expect: 100-continue; keep-alive and pipelining.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/k3run/engine_fixture.h"
#include "tests/k3run/server_fixture.h"

namespace k3::run::testing {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<std::string> Tiny(std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {TinyPreparedDir(), "--no-floor", "--ctx", "512"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// A raw client connection to the server.
class Conn {
 public:
  explicit Conn(int port) : fd_(ConnectLoopback(port)) {}
  ~Conn() {
    if (fd_ >= 0) ::close(fd_);
  }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  bool Send(const std::string& s) {
    return fd_ >= 0 && ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size());
  }
  // Reads what arrives until `needle` is in it, EOF, or `seconds`; true if it appeared.
  bool ReadUntil(const std::string& needle, double seconds) {
    const auto t0 = Clock::now();
    while (received_.find(needle) == std::string::npos) {
      if (eof_ || Since(t0) > seconds) return false;
      Poll(100);
    }
    return true;
  }
  // Waits for EOF at most `seconds`; true when the server closed the connection.
  bool WaitEof(double seconds) {
    const auto t0 = Clock::now();
    while (!eof_ && Since(t0) < seconds) Poll(100);
    return eof_;
  }
  // Reads the next whole response after `from` (status line, head, Content-Length body) within
  // `seconds`; its status and body, and where it ends in received() (for the next call).
  bool ReadResponse(double seconds, int* status, std::string* body, size_t* from) {
    const auto t0 = Clock::now();
    for (;;) {
      const size_t start = received_.find("HTTP/1.1 ", *from);
      const size_t end = start == std::string::npos ? start : received_.find("\r\n\r\n", start);
      if (end != std::string::npos) {
        const std::string head = received_.substr(start, end - start);
        const size_t cl = head.find("Content-Length: ");
        const size_t length = cl == std::string::npos ? 0 : std::stoul(head.substr(cl + 16));
        if (received_.size() >= end + 4 + length) {
          *status = std::stoi(head.substr(9, 3));
          *body = received_.substr(end + 4, length);
          *from = end + 4 + length;
          return true;
        }
      }
      if (eof_ || Since(t0) > seconds) return false;
      Poll(100);
    }
  }
  // Reads whatever is there now without waiting.
  void Drain() { Poll(0); }
  const std::string& received() const { return received_; }
  bool eof() const { return eof_; }

 private:
  void Poll(int ms) {
    pollfd p{fd_, POLLIN, 0};
    if (fd_ < 0 || ::poll(&p, 1, ms) <= 0) return;
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      received_.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      eof_ = true;
    }
  }

  int fd_ = -1;
  std::string received_;
  bool eof_ = false;
};

std::string Post(const std::string& path, const std::string& body, const std::string& extra = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
         extra + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

std::string CompletionBody(int max_tokens) {
  return json{{"prompt", kPrompt}, {"max_tokens", max_tokens}, {"temperature", 0}}.dump();
}

// Opens `n` connections that each send one byte of a request head every second from a thread
// (a slowloris attack), until Stop().
class Tricklers {
 public:
  Tricklers(int port, int n) {
    for (int i = 0; i < n; ++i) conns_.push_back(std::make_unique<Conn>(port));
    thread_ = std::thread([this] {
      const std::string head = Post("/v1/completions", CompletionBody(4));
      for (size_t at = 0; at < head.size() && !stop_.load(); ++at) {
        for (auto& c : conns_) (void)c->Send(head.substr(at, 1));
        for (int t = 0; t < 10 && !stop_.load(); ++t) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      }
    });
  }
  ~Tricklers() { Stop(); }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  std::vector<std::unique_ptr<Conn>>& conns() { return conns_; }

 private:
  std::vector<std::unique_ptr<Conn>> conns_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(SlowClients, HealthAndCompletionsAreServedWhileSixtyClientsTrickleHeaders) {
  const std::vector<int32_t> cli =
      CliGeneratedIds({TinyPreparedDir(), "--ids", kPromptText, "--gen", "6"});
  // A header deadline longer than the test: the tricklers stay connected throughout.
  ServerProcess s(Tiny({"--header-timeout", "60"}));
  ASSERT_TRUE(s.WaitReady());
  Tricklers slow(s.port(), 60);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // every trickler has begun
  double slowest = 0;
  for (int i = 0; i < 12; ++i) {
    httplib::Client c = s.Client();
    c.set_connection_timeout(1);
    c.set_read_timeout(1);
    const auto t0 = Clock::now();
    auto h = c.Get("/health");
    const double took = Since(t0);
    ASSERT_TRUE(h) << "no /health answer within 1 s while 60 clients trickle (try " << i << ")";
    EXPECT_EQ(h->status, 200);
    EXPECT_LT(took, 1.0) << "try " << i;
    slowest = std::max(slowest, took);
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
  }
  std::printf("[   INFO   ] slowest of 12 /health answers with 60 tricklers: %.1f ms\n",
              slowest * 1e3);
  for (int i = 0; i < 2; ++i) {  // through a worker: the tricklers hold none
    httplib::Client c = s.Client();
    auto r = c.Post("/v1/completions", CompletionBody(6), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["k3"]["generated_ids"].get<std::vector<int32_t>>(), cli);
  }
  // Every trickler is still connected and has been answered nothing: it is only slow.
  for (auto& c : slow.conns()) {
    c->Drain();
    EXPECT_FALSE(c->eof());
    EXPECT_EQ(c->received(), "");
  }
}

TEST(SlowClients, HeadAndBodyDeadlinesAnswer408) {
  ServerProcess s(Tiny({"--header-timeout", "1", "--body-timeout", "1.5"}));
  ASSERT_TRUE(s.WaitReady());
  Conn head(s.port()), body(s.port()), idle(s.port());
  const auto t0 = Clock::now();
  ASSERT_TRUE(head.Send("GET /v1/mod"));
  ASSERT_TRUE(body.Send(Post("/v1/completions", CompletionBody(2)).substr(0, 120)));
  ASSERT_TRUE(head.ReadUntil("\r\n\r\n{", 4));
  EXPECT_EQ(head.received().rfind("HTTP/1.1 408 ", 0), 0u) << head.received();
  EXPECT_NE(head.received().find("the request head did not arrive within 1 s"), std::string::npos);
  EXPECT_NE(head.received().find("request_timeout"), std::string::npos);
  EXPECT_TRUE(head.WaitEof(2));
  EXPECT_GE(Since(t0), 0.9);
  ASSERT_TRUE(body.ReadUntil("\r\n\r\n{", 4));
  EXPECT_EQ(body.received().rfind("HTTP/1.1 408 ", 0), 0u) << body.received();
  EXPECT_NE(body.received().find("the request body did not arrive within 1.5 s"),
            std::string::npos);
  // A connection that sends nothing is closed without an answer.
  EXPECT_TRUE(idle.WaitEof(4));
  EXPECT_EQ(idle.received(), "");
  // The server goes on: a request sent at once on a fresh connection is answered.
  Conn again(s.port());
  ASSERT_TRUE(again.Send("GET /v1/models HTTP/1.1\r\nHost: a\r\n\r\n"));
  ASSERT_TRUE(again.ReadUntil("\"data\"", 10));
  EXPECT_EQ(again.received().rfind("HTTP/1.1 200 ", 0), 0u);
}

TEST(SlowClients, PastTheConnectionLimitTheLongestWaitingIsClosed) {
  ServerProcess s(Tiny({"--max-connections", "8", "--header-timeout", "60"}));
  ASSERT_TRUE(s.WaitReady());
  std::vector<std::unique_ptr<Conn>> waiting;
  for (int i = 0; i < 8; ++i) {
    waiting.push_back(std::make_unique<Conn>(s.port()));
    ASSERT_TRUE(waiting.back()->Send("GET /heal"));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // Each probe stays open (kept alive, idle): the limit stays reached, and the next probe
  // closes the next oldest waiting connection, not a probe (they waited less).
  std::vector<std::unique_ptr<Conn>> probes;
  for (int round = 0; round < 3; ++round) {
    probes.push_back(std::make_unique<Conn>(s.port()));
    Conn& probe = *probes.back();
    ASSERT_TRUE(probe.Send("GET /health HTTP/1.1\r\nHost: a\r\n\r\n"));
    ASSERT_TRUE(probe.ReadUntil("\"ok\"", 2)) << probe.received();
    EXPECT_EQ(probe.received().rfind("HTTP/1.1 200 ", 0), 0u);
    // The oldest waiting connection made room, with a 503 that says why.
    Conn& oldest = *waiting[static_cast<size_t>(round)];
    ASSERT_TRUE(oldest.ReadUntil("too many connections", 2)) << oldest.received();
    EXPECT_EQ(oldest.received().rfind("HTTP/1.1 503 ", 0), 0u);
    EXPECT_TRUE(oldest.WaitEof(2));
    // Its client closes too (else the server would drop it, answered, to make the next room).
    waiting[static_cast<size_t>(round)].reset();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  for (size_t i = 4; i < waiting.size(); ++i) {  // the newer ones wait on, untouched
    waiting[i]->Drain();
    EXPECT_FALSE(waiting[i]->eof()) << i;
    EXPECT_EQ(waiting[i]->received(), "") << i;
  }
}

TEST(SlowClients, FrontDoorRefusalsAreOpenAiErrors) {
  ServerProcess s(Tiny());
  ASSERT_TRUE(s.WaitReady());
  struct Case {
    std::string request;
    int status;
    std::string words;
  };
  const std::vector<Case> cases = {
      {"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
       411, "send Content-Length"},
      {"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n", 413,
       "larger than the server reads"},
      {"GET / HTTP/1.1\r\nX: " + std::string(70000, 'a') + "\r\n\r\n", 431, "request head is longer"},
      {"GET /v1/models HTTP/1.1\r\nBad Header\r\n\r\n", 400, "Name: value"},
      {"BREW /pot HTCPCP/1.0\r\n\r\n", 400, "request line"},
  };
  for (const Case& k : cases) {
    Conn c(s.port());
    (void)c.Send(k.request);
    size_t from = 0;
    int status = 0;
    std::string body;
    ASSERT_TRUE(c.ReadResponse(5, &status, &body, &from)) << k.status << ": " << c.received();
    EXPECT_EQ(status, k.status) << c.received();
    const json j = json::parse(body, nullptr, false);
    ASSERT_TRUE(j.contains("error")) << body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(k.words), std::string::npos) << body;
    EXPECT_TRUE(c.WaitEof(2));
  }
  httplib::Client c = s.Client();  // and the server goes on
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

TEST(SlowClients, ExpectContinueKeepAliveAndPipelining) {
  const std::vector<int32_t> cli =
      CliGeneratedIds({TinyPreparedDir(), "--ids", kPromptText, "--gen", "3"});
  ServerProcess s(Tiny());
  ASSERT_TRUE(s.WaitReady());
  {  // The front door says 100 Continue; the body follows; the answer is the CLI's.
    Conn c(s.port());
    const std::string body = CompletionBody(3);
    const std::string req = Post("/v1/completions", body, "Expect: 100-continue\r\n");
    ASSERT_TRUE(c.Send(req.substr(0, req.size() - body.size())));
    ASSERT_TRUE(c.ReadUntil("HTTP/1.1 100 Continue\r\n\r\n", 2)) << c.received();
    ASSERT_TRUE(c.Send(body));
    size_t from = c.received().find("Continue\r\n\r\n");
    int status = 0;
    std::string answer;
    ASSERT_TRUE(c.ReadResponse(30, &status, &answer, &from)) << c.received();
    ASSERT_EQ(status, 200) << answer;
    const json j = json::parse(answer, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << answer;
    EXPECT_EQ(j["k3"]["generated_ids"].get<std::vector<int32_t>>(), cli);
  }
  {  // Three requests in one write, on one kept-alive connection: three answers, in order.
    Conn c(s.port());
    ASSERT_TRUE(c.Send("GET /v1/models HTTP/1.1\r\nHost: a\r\n\r\n"
                       "GET /health HTTP/1.1\r\nHost: a\r\n\r\n"
                       "GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n"));
    size_t from = 0;
    int status = 0;
    std::string models, health, metrics, again;
    ASSERT_TRUE(c.ReadResponse(10, &status, &models, &from)) << c.received();
    EXPECT_EQ(status, 200);
    EXPECT_NE(models.find("\"data\""), std::string::npos) << models;
    ASSERT_TRUE(c.ReadResponse(10, &status, &health, &from)) << c.received();
    EXPECT_EQ(status, 200);
    EXPECT_EQ(health, "{\"status\":\"ok\"}");
    ASSERT_TRUE(c.ReadResponse(10, &status, &metrics, &from)) << c.received();
    EXPECT_NE(metrics.find("k3_ready 1"), std::string::npos) << metrics;
    EXPECT_FALSE(c.eof());
    // The connection is still open for a fourth.
    ASSERT_TRUE(c.Send("GET /health HTTP/1.1\r\nHost: a\r\n\r\n"));
    ASSERT_TRUE(c.ReadResponse(2, &status, &again, &from)) << c.received();
    EXPECT_EQ(again, "{\"status\":\"ok\"}");
  }
}

}  // namespace
}  // namespace k3::run::testing
