#include "tests/support/temp_dir.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>

namespace k3::test {
namespace {

std::string MakeUnder(const std::string& parent) {
  std::string templ = (parent.empty() ? std::string("/tmp") : parent) + "/k3-test-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp under " << parent << " failed";
    return {};
  }
  return templ;
}

std::string DefaultParent() {
  const char* tmp = std::getenv("TMPDIR");
  return (tmp != nullptr && *tmp != '\0') ? std::string(tmp) : std::string("/tmp");
}

}  // namespace

TempDir::TempDir() : path_(MakeUnder(DefaultParent())) {}

TempDir::TempDir(const std::string& parent) : path_(MakeUnder(parent)) {}

TempDir::~TempDir() {
  if (path_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string TempDir::Join(const std::string& name) const { return path_ + "/" + name; }

std::string TempDir::WriteFile(const std::string& name, const std::string& content) const {
  const std::filesystem::path p = Join(name);
  std::filesystem::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
  out.close();
  EXPECT_TRUE(out.good()) << "writing test file " << p;
  return p.string();
}

std::vector<std::string> TempDir::List() const {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(path_)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace k3::test
