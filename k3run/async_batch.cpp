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
    arrived_.assign(batch_.size(), 0);
    submitted_ = true;
    done_ = false;
  }
  pending_ = true;
  cv_.notify_all();
}

bool AsyncBatch::Arrived(size_t i) {
  std::lock_guard<std::mutex> lk(mu_);
  return i < arrived_.size() && arrived_[i] != 0;
}

Status AsyncBatch::WaitFor(size_t i, double* waited_seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return done_ || (i < arrived_.size() && arrived_[i] != 0); });
  if (waited_seconds != nullptr) {
    *waited_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return i < batch_.size() ? batch_[i].status : Status::Invalid("no such request (internal)");
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
  arrived_.clear();
  return std::move(batch_);
}

void AsyncBatch::Loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    cv_.wait(lk, [&] { return stop_ || (submitted_ && !done_); });
    if (stop_) return;
    // batch_ is not moved: the engine reads the statuses of arrived requests meanwhile.
    const std::span<ReadRequest> reqs(batch_);
    lk.unlock();
    if (!reqs.empty()) {
      if (clock_ != nullptr) clock_->Begin();
      // Per-request statuses are the result.
      (void)reader_->ReadAll(reqs, [this](size_t i) {
        {
          std::lock_guard<std::mutex> g(mu_);
          arrived_[i] = 1;
        }
        cv_.notify_all();
      });
      if (clock_ != nullptr) clock_->End();
    }
    lk.lock();
    done_ = true;
    cv_.notify_all();
  }
}

}  // namespace k3::run
