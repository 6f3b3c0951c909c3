#include "tests/k3run/headless_chromium.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace k3::run::testing {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool OnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (!dir.empty() && ::access((dir + "/" + name).c_str(), X_OK) == 0) return true;
  }
  return false;
}

bool WriteAll(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

std::string HeadlessChromium::Find() {
  if (const char* env = std::getenv("K3_CHROMIUM"); env != nullptr && *env != '\0') return env;
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    if (OnPath(name)) return name;
  }
  return "";
}

Result<std::unique_ptr<HeadlessChromium>> HeadlessChromium::Start(const std::string& exe) {
  std::unique_ptr<HeadlessChromium> b(new HeadlessChromium());
  b->profile_ = std::make_unique<k3::test::TempDir>();
  // A browser that died must be a failed write, not the death of the test process.
  ::signal(SIGPIPE, SIG_IGN);
  int in[2];   // we write in[1]; the browser reads in[0] as its fd 3
  int out[2];  // the browser writes out[1] as its fd 4; we read out[0]
  if (::pipe2(in, O_CLOEXEC) != 0) return Status::IoErrno("pipe", "devtools pipe", errno);
  if (::pipe2(out, O_CLOEXEC) != 0) {
    ::close(in[0]);
    ::close(in[1]);
    return Status::IoErrno("pipe", "devtools pipe", errno);
  }
  std::vector<std::string> owned = {
      exe,
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-dev-shm-usage",
      "--no-first-run",
      "--no-default-browser-check",
      "--disable-extensions",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
      "--mute-audio",
      "--remote-debugging-pipe",
      "--user-data-dir=" + b->profile_->Join("profile"),
      "about:blank",
  };
  std::vector<char*> argv;
  for (std::string& a : owned) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string log_path = b->profile_->Join("chromium.log");
  b->pid_ = ::fork();
  if (b->pid_ == 0) {
    // Park both ends above 4 first (dup2 onto the fd an end already has would keep its
    // close-on-exec flag), then put them at 3 and 4 without it.
    const int r = ::fcntl(in[0], F_DUPFD, 10);
    const int w = ::fcntl(out[1], F_DUPFD, 10);
    if (r < 0 || w < 0 || ::dup2(r, 3) != 3 || ::dup2(w, 4) != 4) ::_exit(126);
    const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (log >= 0) {
      ::dup2(log, 1);
      ::dup2(log, 2);
    }
    ::close_range(5, ~0U, 0);  // nothing else of the test process (servers' pipes) leaks
    ::execvp(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  b->to_browser_ = in[1];
  b->from_browser_ = out[0];
  if (b->pid_ < 0) return Status::IoErrno("fork", exe, errno);
  return b;
}

HeadlessChromium::~HeadlessChromium() {
  if (pid_ > 0) {
    if (to_browser_ >= 0) (void)BrowserCall("Browser.close", json::object(), 10);
    const auto t0 = Clock::now();
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (Since(t0) > 10) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  if (to_browser_ >= 0) ::close(to_browser_);
  if (from_browser_ >= 0) ::close(from_browser_);
}

std::string HeadlessChromium::log() const {
  std::ifstream f(profile_->Join("chromium.log"));
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

Result<json> HeadlessChromium::Call(const std::string& method, const json& params,
                                    const std::string& session, double seconds) {
  const int id = next_id_++;
  json message = {{"id", id}, {"method", method}, {"params", params}};
  if (!session.empty()) message["sessionId"] = session;
  if (!WriteAll(to_browser_, message.dump() + std::string(1, '\0'))) {
    return Status::Io(method + ": the browser is gone (write failed)");
  }
  const auto t0 = Clock::now();
  while (true) {
    // Whole messages first: events (no "id") and other answers are skipped.
    for (size_t end; (end = pending_.find('\0')) != std::string::npos;) {
      const json m = json::parse(pending_.substr(0, end), nullptr, false);
      pending_.erase(0, end + 1);
      if (!m.is_object() || !m.contains("id") || m["id"] != id) continue;
      if (m.contains("error")) return Status::Invalid(method + ": " + m["error"].dump());
      return m.value("result", json::object());
    }
    const double left = seconds - Since(t0);
    if (left <= 0) return Status::Io(method + ": no answer within " + std::to_string(seconds) + " s");
    pollfd p = {from_browser_, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left * 1000) + 1);
    if (ready < 0 && errno != EINTR) return Status::IoErrno("poll", "devtools pipe", errno);
    if (ready <= 0) continue;
    char buf[65536];
    const ssize_t n = ::read(from_browser_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::Io(method + ": the browser closed its pipe (exited?)");
    pending_.append(buf, static_cast<size_t>(n));
  }
}

Result<json> HeadlessChromium::BrowserCall(const std::string& method, const json& params,
                                           double seconds) {
  return Call(method, params, "", seconds);
}

Result<json> HeadlessChromium::PageCall(const std::string& method, const json& params,
                                        double seconds) {
  if (session_.empty()) return Status::Invalid(method + ": no page open");
  return Call(method, params, session_, seconds);
}

Status HeadlessChromium::Open(const std::string& url, double seconds) {
  Result<json> target = BrowserCall("Target.createTarget", {{"url", url}}, seconds);
  if (!target.ok()) return target.status();
  Result<json> attached = BrowserCall(
      "Target.attachToTarget", {{"targetId", (*target)["targetId"]}, {"flatten", true}}, seconds);
  if (!attached.ok()) return attached.status();
  session_ = (*attached)["sessionId"].get<std::string>();
  // Until the page has loaded, evaluation may fail (the context is replaced as it navigates).
  const auto t0 = Clock::now();
  const std::string loaded =
      "location.href === " + json(url).dump() + " && document.readyState === 'complete'";
  std::string last = "not loaded";
  while (Since(t0) < seconds) {
    Result<json> v = Evaluate(loaded, seconds);
    if (v.ok() && *v == true) return Status::Ok();
    if (!v.ok()) last = v.status().message();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Status::Io(url + " did not load within " + std::to_string(seconds) + " s: " + last);
}

Result<json> HeadlessChromium::Evaluate(const std::string& expression, double seconds) {
  Result<json> r = PageCall(
      "Runtime.evaluate",
      {{"expression", expression}, {"awaitPromise", true}, {"returnByValue", true}}, seconds);
  if (!r.ok()) return r.status();
  if (r->contains("exceptionDetails")) {
    const json& e = (*r)["exceptionDetails"];
    return Status::Invalid("the page threw: " +
                           e.value("exception", json::object()).value("description", e.dump()));
  }
  return (*r)["result"].value("value", json());
}

Status HeadlessChromium::TypeAndPressEnter(const std::string& text) {
  Result<json> typed = PageCall("Input.insertText", {{"text", text}});
  if (!typed.ok()) return typed.status();
  for (const char* type : {"keyDown", "keyUp"}) {
    Result<json> key = PageCall("Input.dispatchKeyEvent", {{"type", type},
                                                           {"key", "Enter"},
                                                           {"code", "Enter"},
                                                           {"windowsVirtualKeyCode", 13},
                                                           {"nativeVirtualKeyCode", 13}});
    if (!key.ok()) return key.status();
  }
  return Status::Ok();
}

}  // namespace k3::run::testing
