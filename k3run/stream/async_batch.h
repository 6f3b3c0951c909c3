// AsyncBatch: a queue of read batches served in order by one background thread, so the engine can
// issue a MoE layer's expert reads the moment routing is known (and a guess of the next layer's
// experts right behind them) and compute while they load (DESIGN.md §7 "Overlap").
//
// Protocol: Submit(batch) queues the batch behind every batch submitted before and returns the
// ticket of its first request; the batch's later requests have the next tickets. Tickets count up
// from 0 for the object's lifetime. Arrived(t) says whether request t is done (its status final,
// its bytes in place); Take(t) waits for it if need be, returns its status and forgets it, so the
// engine uses each request as soon as it is done while the rest still load. A batch is dropped
// once it is read and every one of its requests was taken, so a queue that never drains (each
// layer's batch submitted before the previous guess finished) stays small. Destination buffers
// must stay valid until their request is done.
// Thread safety: every public method from one engine thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "common/direct_reader.h"
#include "k3run/stream/io_clock.h"

namespace k3::run {

class AsyncBatch {
 public:
  AsyncBatch(IoClock* clock, bool force_pread);
  ~AsyncBatch();  // waits for every batch submitted, then stops the thread

  // Queues `reqs` (read in the given order, after every earlier batch: callers sort by file
  // offset) and returns the ticket of reqs[0].
  uint64_t Submit(std::vector<ReadRequest> reqs);
  // Whether a submitted request has not been taken yet.
  bool pending();
  // Whether request `ticket` is done. False for a ticket never submitted or already taken.
  bool Arrived(uint64_t ticket);
  // Blocks until request `ticket` is done (adding the time blocked to *waited_seconds, may be
  // null), forgets it and returns its status. kInvalid for a ticket never submitted or already
  // taken.
  Status Take(uint64_t ticket, double* waited_seconds);

  std::string_view backend() const { return reader_->backend(); }

 private:
  struct Batch {
    uint64_t first = 0;  // ticket of reqs[0]
    std::vector<ReadRequest> reqs;
    std::vector<char> arrived, taken;
    size_t n_taken = 0;
    bool read = false;  // the reading thread is done with it
  };
  void Loop();
  Batch* Find(uint64_t ticket);  // under mu_; null when not queued
  void DropTaken();              // under mu_: pops leading batches that are read and all taken

  IoClock* clock_;
  std::unique_ptr<BatchReader> reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  // Batches in ticket order. std::deque keeps references to its elements valid when others are
  // pushed at the back or popped at the front: the reading thread uses its batch unlocked, and
  // only batches it is done with are popped. A request's status is read only after its arrived
  // flag is seen (both under mu_).
  std::deque<Batch> queue_;
  size_t next_to_read_ = 0;  // index in queue_ of the first batch not yet read
  uint64_t next_ticket_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace k3::run
