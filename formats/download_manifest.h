// k3-download.json: what `k3prep download` fetched and verified (DESIGN.md §6).
//
// Goals: one fixed schema that download (writer) and `k3verify shards --manifest` / pack
// (readers) can be built against independently:
//   {"format":"k3-download","version":1,"repo":STR,"commit":40 lowercase hex,"endpoint":STR,
//    "files":[{"path":STR,"size":UINT,"sha256":64 lowercase hex,
//              "verified_at":"YYYY-MM-DDTHH:MM:SS[.frac]Z"}]}
// The reader is strict: duplicate or unknown keys, a missing field, a wrong type, malformed hex
// or time, an unsafe path (absolute, "..", empty component) or a path listed twice is
// Code::kInvalid naming the file, the JSON path of the field and the rule. The writer validates
// the same rules before writing, and writes atomically (temporary name, fsync, rename).
// Non-goals: the Hub protocol (k3prep/), hashing files (common/hash.h).
// Evolution: any schema change bumps "version"; a reader refuses versions it does not know.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/env.h"
#include "common/status.h"

namespace k3::dl {

inline constexpr std::string_view kFormatName = "k3-download";
inline constexpr uint64_t kFormatVersion = 1;
inline constexpr std::string_view kFileName = "k3-download.json";

struct DownloadFile {
  std::string path;         // relative to the download directory, '/'-separated
  uint64_t size = 0;        // bytes
  std::string sha256;       // 64 lowercase hex (the Hub's LFS oid for LFS files)
  std::string verified_at;  // RFC 3339 UTC, e.g. "2025-11-29T08:55:01Z"
};

struct DownloadManifest {
  std::string repo;      // e.g. "moonshotai/Kimi-K3"
  std::string commit;    // 40 lowercase hex: the resolved revision
  std::string endpoint;  // e.g. "https://huggingface.co"
  std::vector<DownloadFile> files;

  // nullptr when `path` is not listed.
  const DownloadFile* Find(std::string_view path) const;
};

// Every rule of the schema; `source` names the file in messages.
Status ValidateDownloadManifest(const DownloadManifest& m, const std::string& source);
Result<DownloadManifest> ParseDownloadManifest(std::string_view json_text,
                                               const std::string& source);
Result<DownloadManifest> LoadDownloadManifest(Env* env, const std::string& path);
// Validated, pretty-printed JSON (indent 2, files in the given order), ending in '\n'.
Result<std::string> RenderDownloadManifest(const DownloadManifest& m);
// Validate + render + atomic write.
Status WriteDownloadManifest(Env* env, const std::string& path, const DownloadManifest& m);

// RFC 3339 with a 'Z' offset (UTC only): "YYYY-MM-DDTHH:MM:SS" + optional ".digits" + "Z";
// calendar-checked (month lengths, leap years; second 60 allowed for leap seconds).
bool IsRfc3339Utc(std::string_view s);
// Seconds since the Unix epoch → "YYYY-MM-DDTHH:MM:SSZ".
std::string FormatRfc3339Utc(int64_t unix_seconds);

}  // namespace k3::dl
