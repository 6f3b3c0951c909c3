#include "tests/support/synth_fixture.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <system_error>

#include "common/hash.h"
#include "k3prep/pack/pack.h"
#include "k3prep/synth/checkpoint.h"
#include "tests/support/files.h"

namespace k3::test {
namespace {

namespace fs = std::filesystem;

constexpr char kComplete[] = "complete";
constexpr char kSums[] = "fixture.sum";

std::string Describe(const FixtureSpec& s) {
  // Everything that determines the fixture's bytes. The synth options not listed are at their
  // defaults (SmallDType::kMixed, shards 0, no --set); pack runs with --jobs 1.
  std::ostringstream d;
  d << "k3-test-fixture v" << kFixtureVersion << "; prepared manifest v"
    << prepared::kManifestVersion << "; synth preset=" << s.preset << " seed=" << s.seed
    << " small=mixed shards=0; pack experts=" << prepared::ExpertsModeName(s.experts)
    << " jobs=1";
  return d.str();
}

// An exclusive flock held while it lives (released by close on every exit path).
class FileLock {
 public:
  explicit FileLock(const std::string& path) : fd_(::open(path.c_str(), O_RDWR | O_CREAT, 0644)) {
    if (fd_ >= 0 && ::flock(fd_, LOCK_EX) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_;
};

// Every regular file under `dir` (relative paths, sorted), except the stamp and the sums.
std::vector<std::string> FilesUnder(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file()) continue;
    const std::string rel = fs::relative(it->path(), dir).string();
    if (rel != kComplete && rel != kSums) out.push_back(rel);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// "<xxh3-128 hex> <relative path>\n" per file.
std::string SumLines(const std::string& dir) {
  std::string lines;
  for (const std::string& rel : FilesUnder(dir)) {
    Result<Hash128> h = Xxh3_128File(Env::Default(), dir + "/" + rel);
    lines += (h.ok() ? h->Hex() : "unreadable:" + h.status().ToString()) + " " + rel + "\n";
  }
  return lines;
}

// Writes `content` under a temporary name and renames it to `path`.
bool WriteRenamed(const std::string& path, const std::string& content, std::string* error) {
  const std::string tmp = path + ".tmp";
  if (!WriteWholeFile(tmp, content, error)) return false;
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) *error = "rename " + tmp + ": " + ec.message();
  return !ec;
}

int ReadCount(const std::string& path) {
  std::string text;
  if (!ReadWholeFile(path, &text)) return 0;
  try {
    return std::stoi(text);
  } catch (...) {
    return -1;
  }
}

// Builds `dir` (which holds no `complete` stamp) from scratch. Called under the fixture's lock.
bool Build(const FixtureSpec& spec, const std::string& dir, std::string* error) {
  std::error_code ec;
  fs::remove_all(dir, ec);  // a build that died half-way
  fs::create_directories(dir, ec);
  if (ec) {
    *error = "create " + dir + ": " + ec.message();
    return false;
  }
  synth::SynthOptions s;
  s.preset = spec.preset;
  s.seed = spec.seed;
  s.out = dir + "/ck.tmp";
  s.progress = ProgressMode::kNone;
  Result<synth::SynthResult> sr = synth::RunSynth(Env::Default(), s);
  if (!sr.ok()) {
    *error = "synth: " + sr.status().ToString();
    return false;
  }
  // The checkpoint takes its final name before pack: a link-mode manifest records its path.
  fs::rename(dir + "/ck.tmp", dir + "/ck", ec);
  if (ec) {
    *error = "rename ck.tmp: " + ec.message();
    return false;
  }
  prep::PackOptions p;
  p.model_dir = dir + "/ck";
  p.out = dir + "/prep.tmp";
  p.experts = spec.experts;
  p.jobs = 1;
  p.progress = ProgressMode::kNone;
  Result<prep::PackResult> pr = prep::RunPack(Env::Default(), p);
  if (!pr.ok()) {
    *error = "pack: " + pr.status().ToString();
    return false;
  }
  fs::rename(dir + "/prep.tmp", dir + "/prep", ec);
  if (ec) {
    *error = "rename prep.tmp: " + ec.message();
    return false;
  }
  return WriteRenamed(dir + "/" + kSums, SumLines(dir), error) &&
         WriteRenamed(dir + "/" + kComplete, Describe(spec) + "\n", error);
}

// Makes sure the fixture exists; builds it (and counts the build) when it does not.
bool Ensure(const FixtureSpec& spec, const std::string& dir, std::string* error) {
  if (fs::exists(dir + "/" + kComplete)) return true;  // renamed into place last
  std::error_code ec;
  fs::create_directories(FixturesRoot(), ec);
  const std::string key = FixtureKey(spec);
  FileLock lock(FixturesRoot() + "/" + key + ".lock");
  if (!lock.ok()) {
    *error = "cannot lock " + FixturesRoot() + "/" + key + ".lock";
    return false;
  }
  if (fs::exists(dir + "/" + kComplete)) return true;  // another process built it meanwhile
  if (!Build(spec, dir, error)) return false;
  const std::string counter = FixturesRoot() + "/" + key + ".builds";
  return WriteRenamed(counter, std::to_string(std::max(ReadCount(counter), 0) + 1) + "\n", error);
}

}  // namespace

std::string FixturesRoot() { return std::string(K3_BINARY_DIR) + "/fixtures"; }

std::string FixtureKey(const FixtureSpec& spec) {
  const std::string d = Describe(spec);
  return spec.preset + "-s" + std::to_string(spec.seed) + "-" +
         prepared::ExpertsModeName(spec.experts) + "-" +
         Xxh3_128(d.data(), d.size()).Hex().substr(0, 16);
}

const FixtureDirs& SynthFixture(const FixtureSpec& spec) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<FixtureDirs>> made;
  std::lock_guard<std::mutex> lk(mu);
  const std::string key = FixtureKey(spec);
  std::unique_ptr<FixtureDirs>& slot = made[key];
  if (slot == nullptr) {
    const std::string dir = FixturesRoot() + "/" + key;
    slot = std::make_unique<FixtureDirs>();
    if (const char* trace = std::getenv("K3_FIXTURE_TRACE"); trace != nullptr && *trace != '\0') {
      std::ofstream(trace, std::ios::app) << key << "\n";  // one line per process and fixture
    }
    std::string error;
    if (Ensure(spec, dir, &error)) {
      slot->checkpoint = dir + "/ck";
      slot->prepared = dir + "/prep";
    } else {
      ADD_FAILURE() << "building the test fixture " << dir << ": " << error;
    }
  }
  return *slot;
}

const std::vector<NamedFixture>& CtestFixtures() {
  static const std::vector<NamedFixture> all = {
      {"tiny", {"tiny", 0, prepared::ExpertsMode::kCopy}},
      {"small", {"small", 0, prepared::ExpertsMode::kCopy}},
      {"tiny-ref", {"tiny", 1, prepared::ExpertsMode::kLink}},
      {"small-ref", {"small", 1, prepared::ExpertsMode::kLink}},
  };
  return all;
}

bool ResetFixtures(std::string* error) {
  std::error_code ec;
  fs::remove_all(FixturesRoot(), ec);
  if (!ec) fs::create_directories(FixturesRoot(), ec);
  if (ec) *error = FixturesRoot() + ": " + ec.message();
  return !ec;
}

std::vector<std::string> CheckFixtures(std::string* report) {
  std::vector<std::string> problems;
  std::error_code ec;
  std::vector<fs::path> counters;
  for (const fs::directory_entry& e : fs::directory_iterator(FixturesRoot(), ec)) {
    if (e.path().extension() == ".builds") counters.push_back(e.path());
  }
  std::sort(counters.begin(), counters.end());
  for (const fs::path& c : counters) {
    const std::string key = c.stem().string();
    const int n = ReadCount(c.string());
    *report += key + ": built " + std::to_string(n) + " time(s)\n";
    if (n != 1) {
      problems.push_back(key + " was built " + std::to_string(n) +
                         " times in this run (want once: does a test reading it lack "
                         "FIXTURES_REQUIRED, or does its key change between processes?)");
    }
    const std::string dir = FixturesRoot() + "/" + key;
    std::string want;
    if (!ReadWholeFile(dir + "/" + kSums, &want)) {
      problems.push_back(key + ": no " + kSums + " (incomplete build)");
      continue;
    }
    if (SumLines(dir) != want) {
      problems.push_back(key + ": the shared fixture's files changed during the run (a test "
                         "wrote into it: copy it first)");
    }
  }
  if (counters.empty()) *report += "no fixture was built in this run\n";
  return problems;
}

}  // namespace k3::test
