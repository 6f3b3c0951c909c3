// Test-only helpers shared by the download tests: a small repo to serve, default options with
// second-scale timeouts, the checks every download test makes (final files byte-identical or
// absent, manifest agrees, the token never reached the CDN), and FaultRun (one download
// against hubsim with faults).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/hash.h"
#include "formats/download_manifest.h"
#include "k3prep/download/download.h"
#include "tests/k3prep/hubsim_process.h"
#include "tests/support/temp_dir.h"

namespace k3::test {

inline const char* kTestToken = "hf_TESTtoken_never_leaves_the_hub";

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void WriteAll(const std::string& path, const std::string& data) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

inline std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(g() & 0xff);
  return s;
}

// A repo of two "shards" (LFS, served by the CDN), a git-stored config.json and an unselected
// README.md. Returns path → bytes.
inline std::map<std::string, std::string> MakeSmallRepo(const std::string& root) {
  std::map<std::string, std::string> files = {
      {"model-00001-of-000002.safetensors", RandomBytes(300000, 1)},
      {"model-00002-of-000002.safetensors", RandomBytes(120000, 2)},
      {"config.json", "{\"model_type\": \"kimi_k3\"}\n"},
      {"README.md", "not selected by default\n"},
  };
  for (const auto& [p, d] : files) WriteAll(root + "/" + p, d);
  return files;
}

inline download::DownloadOptions TestOptions(const std::string& endpoint,
                                             const std::string& dest) {
  download::DownloadOptions o;
  o.repo = "org/model";
  o.dest = dest;
  o.endpoint = endpoint;
  o.token = kTestToken;
  o.jobs = 2;
  o.stall_bytes_per_s = 1000;
  o.stall_seconds = 1;
  o.connect_timeout_s = 5;
  o.retry_max = 3;
  o.backoff_base_ms = 10;
  return o;
}

// Every file under a final name in `dest` has exactly the source's bytes (or is absent).
inline void ExpectFinalFilesCorrectOrAbsent(const std::string& dest,
                                            const std::map<std::string, std::string>& src) {
  for (const auto& [p, d] : src) {
    const std::string path = dest + "/" + p;
    if (std::filesystem::exists(path)) {
      EXPECT_EQ(ReadAll(path), d) << "wrong bytes under " << p;
    }
  }
}

// Every file named in `want` is in `dest` with the source's bytes and in the manifest with
// the source's size and sha256 (computed here, independently of the downloader).
inline void ExpectDownloaded(const std::string& dest, const std::map<std::string, std::string>& src,
                             const std::vector<std::string>& want) {
  Result<dl::DownloadManifest> m =
      dl::LoadDownloadManifest(Env::Default(), dest + "/k3-download.json");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->repo, "org/model");
  EXPECT_EQ(m->commit, std::string(40, 'c'));
  for (const std::string& p : want) {
    const std::string& d = src.at(p);
    EXPECT_EQ(ReadAll(dest + "/" + p), d) << p;
    const dl::DownloadFile* e = m->Find(p);
    ASSERT_NE(e, nullptr) << p << " missing from the manifest";
    EXPECT_EQ(e->size, d.size()) << p;
    EXPECT_EQ(e->sha256, Sha256Hex(d.data(), d.size())) << p;
  }
}

inline void ExpectTokenNeverAtCdn(const HubSimProcess& sim) {
  for (const nlohmann::json& r : sim.CdnRequests()) {
    EXPECT_FALSE(r["headers"].contains("Authorization")) << r.dump();
    EXPECT_EQ(r.dump().find(kTestToken), std::string::npos) << r.dump();
  }
}

// Range headers the CDN saw for requests of blob `sha256`, in order ("" = no Range).
inline std::vector<std::string> CdnRanges(const HubSimProcess& sim, const std::string& sha256) {
  std::vector<std::string> out;
  for (const nlohmann::json& r : sim.CdnRequests()) {
    if (r["path"] != "/blobs/" + sha256) continue;
    out.push_back(r["headers"].contains("Range") ? r["headers"]["Range"].get<std::string>() : "");
  }
  return out;
}

inline const char* kShard1 = "model-00001-of-000002.safetensors";  // 300,000 bytes
inline const char* kShard2 = "model-00002-of-000002.safetensors";  // 120,000 bytes

// One download against hubsim serving the small repo (MakeSmallRepo) with the given faults.
// Waits before retries are recorded, not slept: a test checks which wait the downloader chose
// (a server's Retry-After, or the backoff), never how long the run took.
struct FaultRun {
  test::TempDir tmp;
  std::map<std::string, std::string> src;
  std::unique_ptr<HubSimProcess> sim;
  download::DownloadResult result;
  Status status;

  // Serves the small repo with `faults` and runs one download (options adjustable).
  // `before` runs after the repo exists and before the download (e.g. to plant a .part).
  explicit FaultRun(const std::string& faults,
                    const std::function<void(download::DownloadOptions*)>& adjust = nullptr,
                    const std::function<void(FaultRun*)>& before = nullptr) {
    src = test::MakeSmallRepo(tmp.Join("src"));
    if (before) before(this);
    HubSimConfig cfg;
    cfg.root = tmp.Join("src");
    cfg.token = test::kTestToken;
    cfg.faults = faults;
    sim = std::make_unique<HubSimProcess>(tmp.Join("sim"), cfg);
    if (!sim->started()) {
      ADD_FAILURE() << sim->error();
      return;
    }
    auto o = test::TestOptions(sim->endpoint(), dest());
    o.wait_before_retry = [this](double s) {
      std::lock_guard<std::mutex> lock(waits_mu_);
      waits_.push_back(s);
    };
    if (adjust) adjust(&o);
    status = download::RunDownload(Env::Default(), o, &result);
  }
  std::string dest() const { return tmp.Join("dst"); }
  const download::FileOutcome& Outcome(const std::string& path) const {
    for (const download::FileOutcome& o : result.files) {
      if (o.path == path) return o;
    }
    static download::FileOutcome none;
    ADD_FAILURE() << path << " not in the result";
    return none;
  }
  std::string Sha(const std::string& path) const {
    return Sha256Hex(src.at(path).data(), src.at(path).size());
  }
  // The waits before retries, in the order they were asked for (over all threads).
  std::vector<double> Waits() {
    std::lock_guard<std::mutex> lock(waits_mu_);
    return waits_;
  }
  void ExpectAllGood() {
    ASSERT_TRUE(status.ok()) << status.ToString();
    test::ExpectDownloaded(dest(), src, {"config.json", kShard1, kShard2});
    test::ExpectTokenNeverAtCdn(*sim);
  }

 private:
  std::mutex waits_mu_;
  std::vector<double> waits_;
};

}  // namespace k3::test
