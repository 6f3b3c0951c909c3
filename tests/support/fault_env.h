// FaultEnv: an Env that forwards to a real one and injects failures on chosen paths, so tests
// can prove every I/O failure ends in a clear Status and never in a half-written final file.
//
// Rules are keyed by path prefix: a rule for "/d/x" applies to "/d/x", to its temporary
// "/d/x.k3tmp" and, for a directory key, to every file below it. The longest matching key wins.
// Files opened through FaultEnv report fd() == -1, so readers use File::PRead (and the faults).
//
// Thread safety: rules are set before the code under test runs; counters are atomic.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/env.h"

namespace k3::test {

struct FaultRule {
  // Short reads: PRead returns at most this many bytes per call (for a file opened with
  // O_DIRECT: rounded down to whole 4 KiB blocks, at least one).
  std::optional<size_t> max_read_chunk;
  // A PRead whose range covers this byte offset fails with EIO (naming the offset).
  std::optional<uint64_t> eio_read_offset;
  // Writes fail with ENOSPC once this many bytes have been written to matching files (summed
  // over all of them); a write crossing the limit is short, the next one fails.
  std::optional<uint64_t> enospc_after_bytes;
  // The file appears truncated to this size: Size/FileSize report it and reads stop there.
  std::optional<uint64_t> truncated_size;
  // Rename from or to a matching path fails with EIO and does nothing (a crash before rename).
  bool fail_rename = false;
  // Sync fails with EIO.
  bool fail_sync = false;
  // Remove of a matching path fails with EIO and does nothing (a crash before the unlink).
  bool fail_remove = false;
  // Called before every PRead of a matching file with its range (may block: tests use it to
  // hold one read back while others complete).
  std::function<void(uint64_t offset, size_t n)> before_read;

  // One-fault rules (designated initialisers trip -Wmissing-field-initializers on GCC 12).
  // Combine by setting further fields on the result.
  static FaultRule ShortReads(size_t max_chunk) { FaultRule r; r.max_read_chunk = max_chunk; return r; }
  static FaultRule EioAt(uint64_t offset) { FaultRule r; r.eio_read_offset = offset; return r; }
  static FaultRule EnospcAfter(uint64_t bytes) { FaultRule r; r.enospc_after_bytes = bytes; return r; }
  static FaultRule Truncated(uint64_t size) { FaultRule r; r.truncated_size = size; return r; }
  static FaultRule RenameFails() { FaultRule r; r.fail_rename = true; return r; }
  static FaultRule SyncFails() { FaultRule r; r.fail_sync = true; return r; }
  static FaultRule RemoveFails() { FaultRule r; r.fail_remove = true; return r; }
};

class FaultEnv : public EnvWrapper {
 public:
  explicit FaultEnv(Env* target = Env::Default()) : EnvWrapper(target) {}

  void SetRule(const std::string& path_prefix, FaultRule rule);
  void ClearRules();
  // FreeSpace reports this many bytes for every path (nullopt: the real value).
  void SetFreeSpace(std::optional<uint64_t> bytes);

  // Bytes written through files matching `path_prefix`'s rule so far.
  uint64_t BytesWritten(const std::string& path_prefix) const;

  Result<std::unique_ptr<File>> Open(const std::string& path, OpenMode mode) override;
  Result<uint64_t> FileSize(const std::string& path) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status Remove(const std::string& path) override;
  Result<uint64_t> FreeSpace(const std::string& path) override;

  struct RuleState {
    FaultRule rule;
    std::atomic<uint64_t> written{0};
  };

 private:
  std::shared_ptr<RuleState> Find(const std::string& path) const;

  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<RuleState>> rules_;
  std::optional<uint64_t> free_space_;
};

}  // namespace k3::test
