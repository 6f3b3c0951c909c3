// The Hub's metadata API as `k3prep download` uses it (ECOSYSTEM-NOTES §1.1–§1.2):
// revision → commit, the recursive paged tree listing, file selection, and the per-file
// resolve HEAD.
//
// Everything the server says is untrusted input: commits must be 40 lowercase hex, LFS oids 64
// lowercase hex, sizes unsigned integers, paths relative without "." / ".." / empty components
// (a path is used to name a file under --dest). Violations are kInvalid naming the URL, the
// entry and the rule. 401/403 on the API is kInvalid "token missing or without access to REPO".
// Transient failures (network, 408/429/5xx) are retried under the RetryPolicy.
//
// Thread safety: functions are reentrant; each caller brings its own HttpClient.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/status.h"
#include "k3prep/download_http.h"
#include "k3prep/download_retry.h"

namespace k3::download {

struct HubContext {
  std::string endpoint;  // e.g. "https://huggingface.co", no trailing slash
  std::string repo;      // "org/name"
  std::string token;     // may be empty; sent only to the endpoint's origin
  long connect_timeout_s = 30;
  RetryPolicy retry;
};

struct HubFile {
  std::string path;     // relative, '/'-separated
  uint64_t size = 0;
  std::string sha256;   // LFS oid (64 hex); empty for files stored in git
  std::string git_oid;  // git blob sha1 (40 hex): the integrity reference for non-LFS files
  bool lfs() const { return !sha256.empty(); }
};

// True when `path` is safe to create under a directory: relative, no "." / ".." / empty
// component, no backslash or NUL, at most 1024 bytes.
bool IsSafeRelativePath(const std::string& path);
// "org/name" or "name": letters, digits, '-', '_', '.'; no "..".
bool IsValidRepoId(const std::string& repo);

// GET /api/models/{repo}/revision/{rev} → the 40-hex commit.
Result<std::string> ResolveCommit(HttpClient& http, const HubContext& hub, const std::string& rev,
                                  std::mt19937_64& rng);
// GET /api/models/{repo}/tree/{commit}?recursive=true, following Link rel="next" (same origin
// only). Files only (directories skipped), sorted by path; duplicates are an error.
Result<std::vector<HubFile>> ListTree(HttpClient& http, const HubContext& hub,
                                      const std::string& commit, std::mt19937_64& rng);

// The default selection (top-level *.safetensors, config and tokenizer files; DESIGN.md §4)
// plus every file matching an --include glob (fnmatch(3) without FNM_PATHNAME: '*' also
// matches '/'). An --include that matches nothing is kInvalid (a typo would otherwise
// silently download less). No shard at all is kInvalid too.
Result<std::vector<HubFile>> SelectFiles(const std::vector<HubFile>& all,
                                         const std::vector<std::string>& includes,
                                         const std::string& repo, const std::string& commit);

// {endpoint}/{repo}/resolve/{commit}/{path}
std::string ResolveUrl(const HubContext& hub, const std::string& commit, const std::string& path);

}  // namespace k3::download
