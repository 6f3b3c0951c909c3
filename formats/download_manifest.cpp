#include "formats/download_manifest.h"

#include <ctime>
#include <set>

#include "common/hex.h"
#include "formats/manifest_json.h"

namespace k3::dl {
namespace {

using nlohmann::json;

bool Digits(std::string_view s, size_t pos, size_t n, int* out) {
  if (pos + n > s.size()) return false;
  int v = 0;
  for (size_t i = pos; i < pos + n; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
  }
  *out = v;
  return true;
}

int DaysInMonth(int year, int month) {
  static constexpr int kDays[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  return month == 2 && leap ? 29 : kDays[month - 1];
}

// Download paths end up joined to a destination directory, so anything that could escape it
// (absolute, "..") or alias another entry ("a//b", "./a") is refused.
std::string PathProblem(std::string_view p) {
  if (p.empty()) return "is empty";
  if (p.front() == '/') return "is absolute (must be relative to the download directory)";
  if (p.find('\0') != std::string_view::npos) return "contains a NUL byte";
  if (p.find('\\') != std::string_view::npos) return "contains a backslash";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find('/', start);
    if (end == std::string_view::npos) end = p.size();
    std::string_view part = p.substr(start, end - start);
    if (part.empty()) return "has an empty component (\"//\" or a trailing '/')";
    if (part == "." || part == "..") return "has a \".\" or \"..\" component";
    start = end + 1;
  }
  return "";
}

}  // namespace

const DownloadFile* DownloadManifest::Find(std::string_view path) const {
  for (const DownloadFile& f : files) {
    if (f.path == path) return &f;
  }
  return nullptr;
}

bool IsRfc3339Utc(std::string_view s) {
  int year, month, day, hour, minute, second;
  if (s.size() < 20) return false;
  if (!Digits(s, 0, 4, &year) || s[4] != '-' || !Digits(s, 5, 2, &month) || s[7] != '-' ||
      !Digits(s, 8, 2, &day) || s[10] != 'T' || !Digits(s, 11, 2, &hour) || s[13] != ':' ||
      !Digits(s, 14, 2, &minute) || s[16] != ':' || !Digits(s, 17, 2, &second)) {
    return false;
  }
  size_t pos = 19;
  if (s[pos] == '.') {
    ++pos;
    const size_t first = pos;
    while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') ++pos;
    if (pos == first) return false;
  }
  if (pos + 1 != s.size() || s[pos] != 'Z') return false;
  if (month < 1 || month > 12 || day < 1 || day > DaysInMonth(year, month)) return false;
  return hour <= 23 && minute <= 59 && second <= 60;
}

std::string FormatRfc3339Utc(int64_t unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Status ValidateDownloadManifest(const DownloadManifest& m, const std::string& source) {
  if (m.repo.empty()) return Status::Invalid(source + ": repo: must not be empty");
  if (!IsLowerHex(m.commit, 40)) {
    return Status::Invalid(source + ": commit: \"" + m.commit +
                           "\" is not a commit hash (must be 40 lowercase hex digits: the "
                           "resolved revision, not a branch or tag name)");
  }
  if (m.endpoint.empty()) return Status::Invalid(source + ": endpoint: must not be empty");
  std::set<std::string_view> seen;
  for (size_t i = 0; i < m.files.size(); ++i) {
    const DownloadFile& f = m.files[i];
    const std::string where = source + ": " + mjson::ElementPath("files", i);
    if (std::string problem = PathProblem(f.path); !problem.empty()) {
      return Status::Invalid(where + ".path: \"" + f.path + "\" " + problem);
    }
    if (!seen.insert(f.path).second) {
      return Status::Invalid(where + ".path: \"" + f.path +
                             "\" is listed twice (each file may appear once)");
    }
    if (!IsLowerHex(f.sha256, 64)) {
      return Status::Invalid(where + ".sha256: \"" + f.sha256 + "\" (file \"" + f.path +
                             "\") is not a SHA-256 digest (must be 64 lowercase hex digits)");
    }
    if (!IsRfc3339Utc(f.verified_at)) {
      return Status::Invalid(where + ".verified_at: \"" + f.verified_at + "\" (file \"" +
                             f.path +
                             "\") is not an RFC 3339 UTC time like 2025-11-29T08:55:01Z");
    }
  }
  return Status::Ok();
}

Result<DownloadManifest> ParseDownloadManifest(std::string_view json_text,
                                               const std::string& source) {
  K3_ASSIGN_OR_RETURN(json doc, mjson::ParseStrict(json_text, source));
  K3_ASSIGN_OR_RETURN(mjson::ObjectReader root, mjson::ObjectReader::Make(doc, source));
  K3_ASSIGN_OR_RETURN(std::string format, root.String("format"));
  if (format != kFormatName) {
    return Status::Invalid(root.Path("format") + ": \"" + format + "\" is not \"" +
                           std::string(kFormatName) + "\" (is this a k3 download manifest?)");
  }
  K3_ASSIGN_OR_RETURN(uint64_t version, root.Unsigned("version"));
  if (version != kFormatVersion) {
    return Status::Invalid(root.Path("version") + ": " + std::to_string(version) +
                           " is not supported (this k3 reads version " +
                           std::to_string(kFormatVersion) + "; re-download or upgrade k3)");
  }
  DownloadManifest m;
  K3_ASSIGN_OR_RETURN(m.repo, root.String("repo"));
  K3_ASSIGN_OR_RETURN(m.commit, root.String("commit"));
  K3_ASSIGN_OR_RETURN(m.endpoint, root.String("endpoint"));
  K3_ASSIGN_OR_RETURN(const json* files, root.Array("files"));
  K3_RETURN_IF_ERROR(root.CheckNoUnknownKeys());
  for (size_t i = 0; i < files->size(); ++i) {
    K3_ASSIGN_OR_RETURN(
        mjson::ObjectReader entry,
        mjson::ObjectReader::Make((*files)[i], mjson::ElementPath(root.Path("files"), i)));
    DownloadFile f;
    K3_ASSIGN_OR_RETURN(f.path, entry.String("path"));
    K3_ASSIGN_OR_RETURN(f.size, entry.Unsigned("size"));
    K3_ASSIGN_OR_RETURN(f.sha256, entry.String("sha256"));
    K3_ASSIGN_OR_RETURN(f.verified_at, entry.String("verified_at"));
    K3_RETURN_IF_ERROR(entry.CheckNoUnknownKeys());
    m.files.push_back(std::move(f));
  }
  K3_RETURN_IF_ERROR(ValidateDownloadManifest(m, source));
  return m;
}

Result<DownloadManifest> LoadDownloadManifest(Env* env, const std::string& path) {
  // 64 MiB holds millions of entries; anything larger is not a download manifest.
  K3_ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, path, uint64_t{64} << 20));
  return ParseDownloadManifest(text, path);
}

Result<std::string> RenderDownloadManifest(const DownloadManifest& m) {
  K3_RETURN_IF_ERROR(ValidateDownloadManifest(m, "download manifest being written"));
  nlohmann::ordered_json doc;
  doc["format"] = kFormatName;
  doc["version"] = kFormatVersion;
  doc["repo"] = m.repo;
  doc["commit"] = m.commit;
  doc["endpoint"] = m.endpoint;
  doc["files"] = nlohmann::ordered_json::array();
  for (const DownloadFile& f : m.files) {
    nlohmann::ordered_json e;
    e["path"] = f.path;
    e["size"] = f.size;
    e["sha256"] = f.sha256;
    e["verified_at"] = f.verified_at;
    doc["files"].push_back(std::move(e));
  }
  return doc.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

Status WriteDownloadManifest(Env* env, const std::string& path, const DownloadManifest& m) {
  K3_ASSIGN_OR_RETURN(std::string text, RenderDownloadManifest(m));
  return WriteFileAtomic(env, path, text);
}

}  // namespace k3::dl
