#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <string>

namespace k3 {
namespace {

std::atomic<bool> g_quiet{false};

// One write(2) per line keeps lines from concurrent threads whole.
void WriteLine(std::string_view prefix, std::string_view msg) {
  std::string line;
  line.reserve(prefix.size() + msg.size() + 1);
  line.append(prefix).append(msg).push_back('\n');
  WriteStderr(line);
}

}  // namespace

void WriteStderr(std::string_view text) {
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n <= 0) return;  // stderr closed or broken: nothing better to do
    p += n;
    left -= static_cast<size_t>(n);
  }
}

void SetQuiet(bool quiet) { g_quiet.store(quiet); }
bool Quiet() { return g_quiet.load(); }

void LogInfo(std::string_view msg) {
  if (!Quiet()) WriteLine("", msg);
}
void LogWarn(std::string_view msg) {
  WriteLine("warning: ", msg);
}
void LogError(std::string_view msg) { WriteLine("error: ", msg); }

}  // namespace k3
