#include "tests/k3prep/hubsim_process.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace k3::test {

std::string HubSimScript() { return std::string(K3_SOURCE_DIR) + "/tests/hubsim/hubsim.py"; }

HubSimProcess::HubSimProcess(const std::string& workdir, const HubSimConfig& cfg) {
  std::filesystem::create_directories(workdir);
  const std::string port_file = workdir + "/hubsim.port";
  log_path_ = workdir + "/cdn-log.jsonl";
  std::filesystem::remove(port_file);
  std::vector<std::string> args = {"/usr/bin/python3", HubSimScript(), "--root", cfg.root,
                                   "--repo", cfg.repo, "--commit", cfg.commit,
                                   "--faults", cfg.faults, "--page-size",
                                   std::to_string(cfg.page_size), "--port-file", port_file,
                                   "--cdn-log", log_path_, "--parent-pid",
                                   std::to_string(getpid())};
  if (!cfg.token.empty()) {
    args.push_back("--token");
    args.push_back(cfg.token);
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  if (posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ) != 0) {
    pid_ = -1;
    error_ = "posix_spawn /usr/bin/python3 failed";
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(port_file);
    int hub = 0, cdn = 0;
    if (in >> hub >> cdn) {
      hub_port_ = hub;
      return;
    }
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      error_ = "hubsim.py exited during start-up";
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  error_ = "hubsim.py did not write its port file within 15 s";
}

void HubSimProcess::Stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  for (int i = 0; i < 100; ++i) {
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

HubSimProcess::~HubSimProcess() { Stop(); }

std::vector<nlohmann::json> HubSimProcess::CdnRequests() const {
  std::vector<nlohmann::json> out;
  std::ifstream in(log_path_);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

}  // namespace k3::test
