// Direct reads: bytes from NVMe into memory without the page cache, one at a time or in batches.
//
// Goals: callers ask for arbitrary [offset, offset+length) ranges and get exactly those bytes,
// whatever the O_DIRECT rules are. With a File opened kReadDirect (direct() true), reads are
// widened to aligned windows (alignment from Env::DirectAlignment) through an aligned bounce
// buffer, or go straight into `dst` when offset, length and dst are already aligned. Short
// reads are looped; end of file before the range is complete is an error naming the file and
// the offset. Non-goals: caching, write support, request merging.
//
// Batches are submitted at once through io_uring (queue depth configurable, default 16). When
// io_uring_queue_init fails with EPERM/ENOSYS/ENOMEM (containers, old kernels, locked-memory
// limits), or when asked, a pread thread pool is used instead; a File whose fd() is -1
// (fault-injecting or in-memory) is always read with File::PRead. backend() names the choice
// so tools can report it.
//
// Thread safety: one BatchReader is used by one thread at a time (ReadAll is not reentrant);
// several BatchReaders may read the same File concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>

#include "common/env.h"
#include "common/status.h"

namespace k3 {

// Reads exactly [offset, offset+length) of `file` into dst, honouring O_DIRECT rules when
// file->direct(). `alignment` is Env::DirectAlignment of the file (0 or 1: no constraint).
Status DirectRead(File* file, uint32_t alignment, uint64_t offset, uint64_t length, void* dst);

struct ReadRequest {
  File* file = nullptr;
  uint64_t offset = 0;
  uint64_t length = 0;
  void* dst = nullptr;
  Status status;  // set by ReadAll
};

class BatchReader {
 public:
  static constexpr int kDefaultQueueDepth = 16;
  static constexpr uint64_t kDefaultPieceBytes = 4 << 20;  // big enough for NVMe

  // Never fails: falls back to the pread pool when io_uring is unavailable (or force_pread).
  // `alignment` applies to direct files (see DirectRead); 4096 suits every common device.
  // Requests are cut into pieces of `piece_bytes` (rounded up to 4 KiB) that are in flight
  // together: a reader of single large requests (the trunk ring) uses smaller pieces to keep
  // the queue full.
  static std::unique_ptr<BatchReader> Create(int queue_depth = kDefaultQueueDepth,
                                             bool force_pread = false,
                                             uint32_t alignment = 4096,
                                             uint64_t piece_bytes = kDefaultPieceBytes);
  virtual ~BatchReader() = default;

  // "io_uring" or "pread-pool"; when io_uring was tried and refused, "pread-pool (io_uring:
  // <reason>)".
  virtual std::string_view backend() const = 0;
  virtual int queue_depth() const = 0;

  // Called once per request as soon as its status is final (its bytes are in dst, or it
  // failed), so a caller can use early requests while later ones are still in flight. It runs on
  // a reading thread (several at once for the pread pool) and must be quick and thread-safe.
  using RequestDone = std::function<void(size_t request)>;

  // Reads every request, filling each request's status independently (one failing request
  // does not stop the others). Returns the first failure in request order, or OK. on_done, when
  // set, is called for every request before ReadAll returns.
  virtual Status ReadAll(std::span<ReadRequest> requests, const RequestDone& on_done) = 0;
  Status ReadAll(std::span<ReadRequest> requests) { return ReadAll(requests, RequestDone()); }
};

}  // namespace k3
