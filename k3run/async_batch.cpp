// The background batch reader (see async_batch.h).
#include "k3run/async_batch.h"

#include <chrono>
#include <span>
#include <utility>

namespace k3::run {

AsyncBatch::AsyncBatch(IoClock* clock, bool force_pread)
    : clock_(clock),
      reader_(BatchReader::Create(BatchReader::kDefaultQueueDepth, force_pread)),
      thread_([this] { Loop(); }) {}

AsyncBatch::~AsyncBatch() {
  {
    std::unique_lock<std::mutex> lk(mu_);
    // A batch in flight writes into caller buffers: let it finish before anything is freed.
    cv_.wait(lk, [&] { return !submitted_ || done_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void AsyncBatch::Submit(std::vector<ReadRequest> reqs) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    batch_ = std::move(reqs);
    submitted_ = true;
    done_ = false;
  }
  pending_ = true;
  cv_.notify_all();
}

std::vector<ReadRequest> AsyncBatch::Wait(double* waited_seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return done_; });
  if (waited_seconds != nullptr) {
    *waited_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  submitted_ = done_ = false;
  pending_ = false;
  return std::move(batch_);
}

void AsyncBatch::Loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    cv_.wait(lk, [&] { return stop_ || (submitted_ && !done_); });
    if (stop_) return;
    std::vector<ReadRequest> reqs = std::move(batch_);
    lk.unlock();
    if (!reqs.empty()) {
      if (clock_ != nullptr) clock_->Begin();
      (void)reader_->ReadAll(reqs);  // per-request statuses are the result
      if (clock_ != nullptr) clock_->End();
    }
    lk.lock();
    batch_ = std::move(reqs);
    done_ = true;
    cv_.notify_all();
  }
}

}  // namespace k3::run
