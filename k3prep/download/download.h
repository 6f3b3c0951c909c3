// `k3prep download REPO --dest DIR`: fetch a checkpoint from the Hugging Face Hub (or anything
// speaking its protocol, via HF_ENDPOINT), resumably and in parallel, proving every byte.
//
// Flow: resolve --revision to a 40-hex commit once; list the tree at that commit (recursive,
// paged) with sizes and LFS sha256; select shards, config, tokenizer files and --include
// globs; skip files recorded in DIR/k3-download.json for this commit; hash and adopt files
// already in DIR that match; check free space for what is missing; download the rest with
// --jobs worker threads (k3prep/download/transfer.h); each verified file is fsynced, renamed
// into DIR and recorded in the manifest (on a finisher pool; the manifest is rewritten
// atomically at most once a second and at the end). A kill loses at most the files in flight,
// whose .part files resume next time; a renamed but unrecorded file is hashed and adopted.
//
// Never under a final name: bytes that are not verified. A file already in DIR with wrong
// bytes is moved to DIR/.k3-partial/NAME.replaced before its download starts.
//
// Exit categories (DESIGN.md §6): kOk all selected files present and verified; kIo gave up
// (network, disk) — the message lists what remains and the command to resume; kInvalid usage,
// token/access, malformed Hub answers or manifest; kIntegrity some file's bytes did not match
// the published hash after a full download (kept as .part.bad). kIntegrity wins over kIo.
//
// The token is never printed, logged, written to the manifest or sent to another origin.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/progress.h"
#include "common/status.h"

namespace k3::download {

inline constexpr const char* kPartialDir = ".k3-partial";
inline constexpr const char* kDefaultEndpoint = "https://huggingface.co";

struct DownloadOptions {
  std::string repo;                   // "org/name"
  std::string dest;                   // DIR
  std::string revision = "main";
  std::string endpoint = kDefaultEndpoint;
  std::string token;                  // may be empty
  std::vector<std::string> includes;  // extra globs
  int jobs = 4;
  long stall_bytes_per_s = 65536;
  long stall_seconds = 60;
  long connect_timeout_s = 30;
  int retry_max = 5;
  int backoff_base_ms = 1000;
  // Spends each wait before a retry (seconds, any thread); null sleeps. For tests, which record
  // the waits chosen (RetryPolicy::wait).
  std::function<void(double seconds)> wait_before_retry;
  ProgressMode progress = ProgressMode::kNone;
  std::string resume_command;  // printed when giving up (never contains the token)
};

struct FileOutcome {
  std::string path;
  uint64_t size = 0;
  enum class Kind { kRecorded, kAdopted, kDownloaded, kFailed } kind = Kind::kFailed;
  int retries = 0;
  int stalls = 0;
  int restarts = 0;
  uint64_t resumed_from = 0;
  std::string error;  // kFailed: the message
  Code error_code = Code::kOk;
};

struct DownloadResult {
  std::string commit;
  std::vector<FileOutcome> files;  // selection order
  uint64_t bytes_fetched = 0;      // body bytes over the network
  uint64_t bytes_read_local = 0;   // bytes read back from disk (resume prefixes, adoption)
  double seconds = 0;
};

// Runs a download. The Status is the overall outcome (see above); `result` (optional) is
// filled as far as the run got, also on failure.
Status RunDownload(Env* env, const DownloadOptions& opts, DownloadResult* result);

// One line per file plus totals (the final table).
std::string FormatDownloadTable(const DownloadResult& r);

}  // namespace k3::download
