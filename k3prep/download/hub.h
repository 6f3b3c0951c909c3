// The Hub's metadata API as `k3prep download` uses it (ECOSYSTEM-NOTES §1.1–§1.2):
// revision → commit, the recursive paged tree listing, file selection, and the per-file
// resolve HEAD.
//
// Everything the server says is untrusted input: commits must be 40 lowercase hex, LFS oids 64
// lowercase hex, sizes unsigned integers of at most kMaxListedFileBytes, paths relative without
// "." / ".." / empty components or control bytes (a path is used to name a file under --dest
// and is printed). Violations are kInvalid naming the URL, the entry and the rule. 401/403 on
// the API is kInvalid "token missing or without access to REPO". Transient failures (network,
// 408/429/5xx) are retried under the RetryPolicy.
//
// Paths that pass the listing's rules print as they are; other text from the Hub that reaches a
// message (the offending path itself, header values, URLs) goes through Printable()
// (common/printable.h) or RedactUrl(), so it cannot forge log lines or drive a terminal.
//
// Thread safety: functions are reentrant; each caller brings its own HttpClient.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "k3prep/download/http.h"
#include "k3prep/download/retry.h"

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

// The largest file size a listing may claim: 2^50 bytes, DESIGN.md's bound on tensor bytes
// (the Hub's own limit is 50 GB). Sums of selected sizes then cannot wrap 64 bits below 2^14
// files, and a hostile size cannot slip past the free-space check by wrapping.
inline constexpr uint64_t kMaxListedFileBytes = uint64_t{1} << 50;
// Tree listing pages followed at most: 10,000 pages of the Hub's 1,000 entries are 10 million
// entries, far beyond any model repo; more means the paging is broken.
inline constexpr int kMaxTreePages = 10000;

// True when `path` is safe to create under a directory and to print: relative, no "." / ".." /
// empty component, at most 1024 bytes, and Printable(path) == path (common/printable.h: no
// control byte 0x00-0x1F / 0x7F, no C1 control, no ill-formed UTF-8, no backslash).
bool IsSafeRelativePath(const std::string& path);
// Names k3prep writes in DIR itself: its manifest (k3-download.json and its temporary) and the
// .k3-partial directory (parts, lock). A listed file with such a name is never downloaded.
bool IsReservedName(const std::string& path);
// "org/name" or "name": letters, digits, '-', '_', '.'; no "..".
bool IsValidRepoId(const std::string& repo);

// GET /api/models/{repo}/revision/{rev} → the 40-hex commit.
Result<std::string> ResolveCommit(HttpClient& http, const HubContext& hub, const std::string& rev,
                                  std::mt19937_64& rng);
// GET /api/models/{repo}/tree/{commit}?recursive=true, following Link rel="next" (same origin
// only; a page already fetched is an error, not a loop; at most kMaxTreePages). Files only
// (directories skipped), sorted by path; duplicates are an error.
Result<std::vector<HubFile>> ListTree(HttpClient& http, const HubContext& hub,
                                      const std::string& commit, std::mt19937_64& rng);
// One page of the tree listing: a JSON array of {"type","path","size","oid","lfs"} objects,
// checked entry by entry against the rules above. Returns the page's files in listing order
// (directories skipped; a path listed twice on the page is refused). Messages start with
// "tree listing page PAGE (URL)". Pure; tests/fuzz/tree_listing_fuzz.cpp feeds it any bytes.
Result<std::vector<HubFile>> ParseTreePage(std::string_view body, int page,
                                           const std::string& url);

// The default selection (top-level *.safetensors, config and tokenizer files; DESIGN.md §4)
// plus every file matching an --include glob (fnmatch(3) without FNM_PATHNAME: '*' also
// matches '/'). An --include that matches nothing is kInvalid (a typo would otherwise
// silently download less), and so is one that selects a reserved name (IsReservedName). No
// shard at all is kInvalid too, and so are selected sizes whose sum does not fit in 64 bits.
Result<std::vector<HubFile>> SelectFiles(const std::vector<HubFile>& all,
                                         const std::vector<std::string>& includes,
                                         const std::string& repo, const std::string& commit);

// {endpoint}/{repo}/resolve/{commit}/{path}
std::string ResolveUrl(const HubContext& hub, const std::string& commit, const std::string& path);

}  // namespace k3::download
