// AsyncBatch: one batch of reads in flight on a background thread, so the engine can issue a MoE
// layer's expert reads the moment routing is known and compute (the shared expert, the latent
// projection) while they load (DESIGN.md §7 "Overlap").
//
// Protocol: Submit(batch) → the engine computes → Wait() returns the batch with each request's
// status. Before that, Arrived(i)/WaitFor(i) let the engine use request i as soon as it is done
// (its status final, its bytes in place) while the rest still load. At most one batch is in
// flight: callers Wait for (and publish) a pending batch before they Submit the next. The
// destination buffers must stay valid until Wait returns.
// Thread safety: Submit/Wait/Arrived/WaitFor/pending from one engine thread.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "common/direct_reader.h"
#include "k3run/io_clock.h"

namespace k3::run {

class AsyncBatch {
 public:
  AsyncBatch(IoClock* clock, bool force_pread);
  ~AsyncBatch();  // waits for a batch in flight, then stops the thread

  // Starts reading `reqs` (in the given order: callers sort by file offset). Requires
  // !pending().
  void Submit(std::vector<ReadRequest> reqs);
  // Whether a submitted batch has not been collected by Wait yet.
  bool pending() const { return pending_; }
  // Blocks until the submitted batch is done and hands it back (statuses filled); adds the time
  // blocked to *waited_seconds.
  std::vector<ReadRequest> Wait(double* waited_seconds);
  // Whether request i of the pending batch is done; its status, once it is.
  bool Arrived(size_t i);
  // Blocks until request i of the pending batch is done (adding the time blocked to
  // *waited_seconds) and returns its status.
  Status WaitFor(size_t i, double* waited_seconds);

  std::string_view backend() const { return reader_->backend(); }

 private:
  void Loop();

  IoClock* clock_;
  std::unique_ptr<BatchReader> reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  // The batch in flight. The reading thread writes request i's status before arrived_[i]; the
  // engine reads a status only after seeing its flag (both under mu_), and never resizes batch_
  // while it is submitted.
  std::vector<ReadRequest> batch_;
  std::vector<char> arrived_;
  bool submitted_ = false, done_ = false, stop_ = false;
  bool pending_ = false;  // engine-side view
  std::thread thread_;
};

}  // namespace k3::run
