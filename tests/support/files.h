// Whole-file reading and writing for tests (setup and inspection only; the code under test uses
// Env). One copy for every test folder instead of a Slurp/ReadAll/ReadBytes per file. Header-only
// so that the fuzz replay driver, which links no test library, can use it too.
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>

namespace k3::test {

// The file's bytes; false (and *out cleared) when it cannot be opened or read.
inline bool ReadWholeFile(const std::string& path, std::string* out) {
  out->clear();
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (in.bad()) {
    out->clear();
    return false;
  }
  return true;
}

// The file's bytes, or "" when it cannot be read (for tests that compare the result anyway).
inline std::string ReadWholeFile(const std::string& path) {
  std::string s;
  ReadWholeFile(path, &s);
  return s;
}

// Replaces (or creates) `path` with `bytes`, creating missing parent directories. On failure
// returns false and says why in *error (when not null).
inline bool WriteWholeFile(const std::string& path, const std::string& bytes,
                           std::string* error = nullptr) {
  const std::filesystem::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out.good()) {
    if (error != nullptr) *error = "writing " + path + " failed";
    return false;
  }
  return true;
}

}  // namespace k3::test
