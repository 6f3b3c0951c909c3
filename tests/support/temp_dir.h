// TempDir: a fresh directory for one test, removed (recursively) when it goes out of scope.
// Test-only: uses std::filesystem and aborts the test on setup failures.
#pragma once

#include <string>
#include <vector>

namespace k3::test {

class TempDir {
 public:
  // Under $TMPDIR (or /tmp when unset).
  TempDir();
  // Under `parent` (e.g. a directory on another file system for O_DIRECT tests).
  explicit TempDir(const std::string& parent);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path()/name
  std::string Join(const std::string& name) const;
  // Writes `content` to path()/name (creating parent directories) and returns the full path.
  std::string WriteFile(const std::string& name, const std::string& content) const;
  // Names in path() (not recursive), sorted.
  std::vector<std::string> List() const;

 private:
  std::string path_;
};

}  // namespace k3::test
