#include "tests/k3run/server_fixture.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "tests/k3run/engine_fixture.h"

namespace k3::run::testing {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

ServerProcess::ServerProcess(const std::vector<std::string>& args) {
  int fds[2];
  if (::pipe(fds) != 0) {
    ADD_FAILURE() << "pipe failed";
    return;
  }
  std::vector<std::string> owned = {std::string(K3_BINARY_DIR) + "/k3run/k3run"};
  owned.insert(owned.end(), args.begin(), args.end());
  owned.insert(owned.end(), {"--serve", "--port", "0"});
  std::vector<char*> argv;
  for (std::string& a : owned) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ == 0) {
    ::dup2(fds[1], 2);
    ::close(fds[0]);
    ::close(fds[1]);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  err_fd_ = fds[0];
  // The first line we need is the port; the rest is collected for the tests' checks.
  reader_ = std::thread([this] {
    char buf[4096];
    while (true) {
      const ssize_t n = ::read(err_fd_, buf, sizeof buf);
      if (n <= 0) break;
      std::lock_guard<std::mutex> lock(mu_);
      stderr_.append(buf, static_cast<size_t>(n));
    }
  });
  const auto t0 = Clock::now();
  const std::string marker = "listening on http://";
  while (Since(t0) < 60) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const size_t at = stderr_.find(marker);
      if (at != std::string::npos) {
        const size_t colon = stderr_.find(':', at + marker.size());
        const size_t eol = stderr_.find('\n', at);
        if (colon != std::string::npos && eol != std::string::npos) {
          port_ = std::stoi(stderr_.substr(colon + 1, eol - colon - 1));
          return;
        }
      }
    }
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      reaped_ = true;
      ADD_FAILURE() << "the server exited before listening:\n" << stderr_text();
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ADD_FAILURE() << "the server did not print its port:\n" << stderr_text();
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  if (reader_.joinable()) reader_.join();
  if (err_fd_ >= 0) ::close(err_fd_);
}

bool ServerProcess::WaitReady(double seconds) {
  if (!listening()) return false;
  const auto t0 = Clock::now();
  while (Since(t0) < seconds) {
    httplib::Client c = Client();
    if (auto r = c.Get("/health"); r && r->status == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

httplib::Client ServerProcess::Client() const {
  httplib::Client c("127.0.0.1", port_);
  c.set_read_timeout(120);
  return c;
}

std::string ServerProcess::stderr_text() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stderr_;
}

size_t Occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = 0; (at = text.find(needle, at)) != std::string::npos; ++at) ++n;
  return n;
}

std::string ServerProcess::StderrOnceItHas(const std::string& needle, size_t count,
                                           double seconds) const {
  const auto t0 = Clock::now();
  while (true) {
    std::string text = stderr_text();
    if (Occurrences(text, needle) >= count || Since(t0) > seconds) return text;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::optional<int> ServerProcess::WaitExit(double seconds) {
  const auto t0 = Clock::now();
  while (Since(t0) < seconds) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      reaped_ = true;
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return std::nullopt;
}

int ConnectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ADD_FAILURE() << "connect to 127.0.0.1:" << port << " failed";
    ::close(fd);
    return -1;
  }
  return fd;
}

RawStream::RawStream(int port, const std::string& path, const std::string& body,
                     const std::string& extra_headers) {
  fd_ = ConnectLoopback(port);
  if (fd_ < 0) return;
  const std::string req = "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                          "application/json\r\nContent-Length: " + std::to_string(body.size()) +
                          "\r\n" + extra_headers + "Connection: close\r\n\r\n" + body;
  EXPECT_EQ(::send(fd_, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
}

RawStream::~RawStream() { Close(); }

bool RawStream::ReadUntil(const std::string& needle, double seconds) {
  const auto t0 = Clock::now();
  while (received_.find(needle) == std::string::npos) {
    if (fd_ < 0 || Since(t0) > seconds) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return received_.find(needle) != std::string::npos;
    received_.append(buf, static_cast<size_t>(n));
  }
  return true;
}

void RawStream::ReadToEnd(double seconds) {
  const auto t0 = Clock::now();
  while (fd_ >= 0 && Since(t0) < seconds) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return;
    received_.append(buf, static_cast<size_t>(n));
  }
}

void RawStream::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::vector<int32_t> CliGeneratedIds(const std::vector<std::string>& args,
                                     std::string* stdout_text) {
  const std::string out = ::testing::TempDir() + "/server_cli_report_" +
                          std::to_string(::getpid()) + ".json";
  std::vector<std::string> full = args;
  full.insert(full.end(), {"--out", out, "--no-floor", "--quiet"});
  const CliRun run = RunCliArgs(full);
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  if (stdout_text) *stdout_text = run.stdout_text();
  std::ifstream in(out);
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.contains("generated_ids")) {
    ADD_FAILURE() << "no report at " << out;
    return {};
  }
  return j["generated_ids"].get<std::vector<int32_t>>();
}

SseParse ParseSse(const std::string& body) {
  SseParse p;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind(": keep-alive", 0) == 0) ++p.keep_alives;
    if (line.rfind("data: ", 0) != 0) continue;
    const std::string data = line.substr(6);
    if (data == "[DONE]") {
      p.done = true;
      continue;
    }
    const nlohmann::json j = nlohmann::json::parse(data, nullptr, false);
    if (j.is_discarded()) continue;
    if (j.contains("error")) {
      p.error = j["error"];
      continue;
    }
    if (!j.contains("choices") || j["choices"].empty()) continue;
    const nlohmann::json& c = j["choices"][0];
    if (c.contains("delta")) {
      p.content += c["delta"].value("content", std::string());
      p.reasoning += c["delta"].value("reasoning_content", std::string());
    } else {
      p.content += c.value("text", std::string());
    }
    if (!c["finish_reason"].is_null()) p.final_chunk = j;
  }
  return p;
}

std::string DechunkedBody(const std::string& raw) {
  size_t at = raw.find("\r\n\r\n");
  if (at == std::string::npos) return "";
  at += 4;
  std::string body;
  while (true) {
    const size_t eol = raw.find("\r\n", at);
    if (eol == std::string::npos) break;
    const size_t n = std::stoul(raw.substr(at, eol - at), nullptr, 16);
    if (n == 0 || eol + 2 + n > raw.size()) break;
    body += raw.substr(eol + 2, n);
    at = eol + 2 + n + 2;
  }
  return body;
}

std::string BaseName(const std::string& path) {
  return std::filesystem::path(path).filename().string();
}

}  // namespace k3::run::testing
