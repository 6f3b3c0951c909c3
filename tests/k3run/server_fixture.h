// Runs `k3run PREPARED --serve --port 0 ...` as a child process for the server tests: parses
// the "listening on http://HOST:PORT" line, collects stderr, waits for /health 200, and always
// kills the child when the object goes away.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

namespace k3::run::testing {

class ServerProcess {
 public:
  // Starts the server (the build's k3run binary); fails the test when it does not listen.
  explicit ServerProcess(const std::vector<std::string>& args);
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  bool listening() const { return port_ > 0; }
  // Polls /health until 200 (true) or `seconds` pass.
  bool WaitReady(double seconds = 120);
  httplib::Client Client() const;
  std::string stderr_text() const;
  // stderr once `needle` appears in it `count` times (or after `seconds`): a line the server
  // wrote before answering may still be in the pipe when the answer arrives, since a thread of
  // ours copies the pipe into stderr_text() and may not have run yet.
  std::string StderrOnceItHas(const std::string& needle, size_t count = 1,
                              double seconds = 10) const;
  // Waits for the child to exit: its exit status (waitpid's), or nullopt after `seconds`.
  std::optional<int> WaitExit(double seconds);

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  int err_fd_ = -1;
  std::thread reader_;
  mutable std::mutex mu_;
  std::string stderr_;
  bool reaped_ = false;
};

// How many times `needle` starts in `text` (overlapping occurrences count too).
size_t Occurrences(const std::string& text, const std::string& needle);

// A TCP connection to 127.0.0.1:port (-1, and a test failure, when it cannot connect).
int ConnectLoopback(int port);

// A raw HTTP/1.1 POST whose response is read incrementally (a client that may leave mid-stream).
class RawStream {
 public:
  RawStream(int port, const std::string& path, const std::string& body,
            const std::string& extra_headers = "");
  ~RawStream();
  // Reads until `needle` appears in what was received, EOF, or `seconds`; true if it appeared.
  bool ReadUntil(const std::string& needle, double seconds);
  // Reads to EOF (or `seconds`).
  void ReadToEnd(double seconds);
  void Close();
  const std::string& received() const { return received_; }

 private:
  int fd_ = -1;
  std::string received_;
};

// `k3run PREPARED args...` in-process with --out; the generated ids of its report (and, when
// `stdout_text` is given, what it wrote to stdout).
std::vector<int32_t> CliGeneratedIds(const std::vector<std::string>& args,
                                     std::string* stdout_text = nullptr);
// The concatenated delta text of an SSE body (content and, for chat, reasoning_content), its
// last chunk with a finish_reason, and whether it ended with [DONE].
struct SseParse {
  std::string content;
  std::string reasoning;
  nlohmann::json final_chunk;
  nlohmann::json error;
  bool done = false;
  int keep_alives = 0;
};
SseParse ParseSse(const std::string& body);
// The body of a raw HTTP/1.1 response with chunked transfer encoding (what has arrived of it).
std::string DechunkedBody(const std::string& raw);
std::string BaseName(const std::string& path);

}  // namespace k3::run::testing
