// Test-only: runs tests/hubsim/hubsim.py (the local Hub + CDN simulator) as a child process on
// free 127.0.0.1 ports, and reads back the CDN's request log. The destructor stops it (SIGTERM,
// then SIGKILL) and reaps it; the simulator also exits by itself if the test process dies.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace k3::test {

struct HubSimConfig {
  std::string root;                 // files to serve
  std::string repo = "org/model";
  std::string commit = std::string(40, 'c');
  std::string token;                // required by the hub when non-empty
  std::string faults = "[]";        // JSON list (see hubsim.py)
  int page_size = 1000;
};

class HubSimProcess {
 public:
  // `workdir` receives the port file and the CDN log.
  HubSimProcess(const std::string& workdir, const HubSimConfig& cfg);
  ~HubSimProcess();
  HubSimProcess(const HubSimProcess&) = delete;
  HubSimProcess& operator=(const HubSimProcess&) = delete;

  bool started() const { return hub_port_ > 0; }
  const std::string& error() const { return error_; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(hub_port_); }
  // One JSON object per CDN request: {"method","path","headers":{...}}.
  std::vector<nlohmann::json> CdnRequests() const;
  void Stop();

 private:
  pid_t pid_ = -1;
  int hub_port_ = 0;
  std::string log_path_;
  std::string error_;
};

// The path of hubsim.py in the source tree.
std::string HubSimScript();

}  // namespace k3::test
