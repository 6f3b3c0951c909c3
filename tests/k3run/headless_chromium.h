// Headless Chromium driven over the DevTools protocol, for the web chat page test
// (server_web_test.cpp).
//
// Transport: `--remote-debugging-pipe`. Chromium reads protocol messages (JSON, each ended by a
// NUL byte) on its file descriptor 3 and writes its answers and events on descriptor 4. Chosen
// over `--remote-debugging-port` because it needs no WebSocket client (Node has one built in only
// from version 22; Debian bookworm's is 18, this machine's 20) and no second free port to race
// for, and it works offline with nothing but the browser. Commands are sent to the browser
// target, or, after Open, to one page through a flat session (Target.attachToTarget with
// "flatten": the page's messages carry its sessionId on the same pipe).
//
// Thread safety: none; one test thread drives it.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "tests/support/temp_dir.h"

namespace k3::run::testing {

class HeadlessChromium {
 public:
  // The browser to run: $K3_CHROMIUM, else the first of chromium, chromium-browser,
  // google-chrome on PATH; "" when there is none (the test then skips, saying so).
  static std::string Find();
  // Starts `exe` headless with a fresh profile in a temporary directory (--no-sandbox: the tests
  // may run as root, where Chromium's sandbox refuses to start; --disable-gpu, and shared memory
  // in the profile's file system rather than a small /dev/shm).
  static Result<std::unique_ptr<HeadlessChromium>> Start(const std::string& exe);
  // Asks the browser to close, kills it after 10 s, removes the profile.
  ~HeadlessChromium();
  HeadlessChromium(const HeadlessChromium&) = delete;
  HeadlessChromium& operator=(const HeadlessChromium&) = delete;

  // Opens `url` in a new tab and attaches to it: PageCall and Evaluate then go to that page.
  // Returns when the page has loaded (document.readyState "complete" at that URL).
  Status Open(const std::string& url, double seconds);
  // One command to the browser, or to the page; its "result" object.
  Result<nlohmann::json> BrowserCall(const std::string& method, const nlohmann::json& params,
                                     double seconds = 30);
  Result<nlohmann::json> PageCall(const std::string& method, const nlohmann::json& params,
                                  double seconds = 30);
  // Runtime.evaluate in the page (a promise is awaited): the value, returned by value as JSON.
  // A thrown exception is an error naming it.
  Result<nlohmann::json> Evaluate(const std::string& expression, double seconds = 30);
  // Types `text` into the focused element (Input.insertText), then presses Enter (key down and
  // up, as a keyboard does: the page's keydown handler sees key "Enter").
  Status TypeAndPressEnter(const std::string& text);
  // Chromium's own stderr so far (for failure messages).
  std::string log() const;

 private:
  HeadlessChromium() = default;
  Result<nlohmann::json> Call(const std::string& method, const nlohmann::json& params,
                              const std::string& session, double seconds);

  std::unique_ptr<k3::test::TempDir> profile_;
  pid_t pid_ = -1;
  int to_browser_ = -1;    // our end of its fd 3
  int from_browser_ = -1;  // our end of its fd 4
  std::string pending_;    // bytes read after the last whole message
  int next_id_ = 1;
  std::string session_;    // the page's session, after Open
};

}  // namespace k3::run::testing
