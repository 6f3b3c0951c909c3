// One file of `k3prep download`: resolve, resumable GET into DIR/.k3-partial/NAME.part, hash
// while streaming, verify. The caller renames a verified .part into place and records it.
//
// Invariants:
//  - Bytes enter the .part only from a 200 answer to a request from offset 0, or a 206 whose
//    Content-Range starts exactly at the .part's length and whose total is the listed size. A
//    200 to a Range request truncates the .part and starts again from 0 (never appends).
//  - The hash state always covers exactly the bytes in the .part: a resumed .part's prefix is
//    read and hashed once when the transfer starts; after that, bytes are hashed as they arrive
//    and never read back.
//  - A .part is returned as complete only when its size and hash equal the listing's (sha256
//    for LFS files, the git blob sha1 for files stored in git).
//  - A full download from byte 0 whose hash is wrong is renamed to NAME.part.bad (kIntegrity).
//    If the transfer had resumed from an older .part (whose bytes a crash may have left stale),
//    it first starts once more from byte 0 before calling the file bad.
//
// Thread safety: one transfer per HttpClient; different files may transfer in parallel.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>

#include "common/env.h"
#include "common/hash.h"
#include "common/status.h"
#include "k3prep/download/hub.h"

namespace k3::download {

// SHA-256 and, for files stored in git, the git blob sha1 ("blob <size>\0" + bytes).
class ContentHasher {
 public:
  ContentHasher(uint64_t size, bool git_sha1);
  void Update(const void* data, size_t n);
  std::string Sha256Hex();
  std::string GitSha1Hex();  // empty when not requested

 private:
  Sha256Stream sha256_;
  std::unique_ptr<Sha1Stream> sha1_;  // null unless the git blob sha1 was requested
};

// True when (size, sha256, git sha1) of local bytes match the listing.
bool DigestsMatch(const HubFile& f, uint64_t size, const std::string& sha256,
                  const std::string& git_sha1);
// Hashes a local file through `env` (for adopting files already in DIR). Counts bytes read.
Result<std::string> HashLocalFile(Env* env, const std::string& path, const HubFile& f,
                                  bool* matches, uint64_t* bytes_read);

struct TransferSettings {
  HubContext hub;
  std::string commit;
  long stall_bytes_per_s = 65536;
  long stall_seconds = 60;
};

struct TransferStats {
  uint64_t bytes_fetched = 0;      // body bytes accepted over the network
  uint64_t prefix_bytes_read = 0;  // bytes of an existing .part re-read to resume the hash
  uint64_t resumed_from = 0;       // .part length when the transfer started
  int retries = 0;
  int stalls = 0;
  int restarts = 0;    // .part truncated to 0 (200 to a Range, bad Content-Range, bad resume)
  int reresolves = 0;  // signed URL refreshed after 401/403
};

struct TransferObserver {
  std::function<void(uint64_t)> on_bytes;           // body bytes arrived (any thread)
  std::function<void(const std::string&)> on_note;  // "retry", "stall", … for progress
};

// Returns the sha256 of the verified .part (closed, NOT yet fsynced: the caller fsyncs it before
// renaming it into place, on another thread so the next transfer can start meanwhile). kIo: gave up (the .part keeps
// what arrived, for the next run); kIntegrity: bad bytes (.part.bad); kInvalid: the Hub refused
// access or its answers are malformed.
Result<std::string> TransferFile(Env* env, HttpClient& http, const TransferSettings& settings,
                                 const HubFile& file, const std::string& part_path,
                                 const TransferObserver& observer, std::mt19937_64& rng,
                                 TransferStats* stats);

}  // namespace k3::download
