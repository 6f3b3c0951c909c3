// The background batch queue (see k3run/stream/async_batch.h).
#include "k3run/stream/async_batch.h"

#include <chrono>
#include <span>
#include <utility>

namespace k3::run {

namespace {

void AddWaited(std::chrono::steady_clock::time_point t0, double* waited_seconds) {
  if (waited_seconds == nullptr) return;
  *waited_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

AsyncBatch::AsyncBatch(IoClock* clock, bool force_pread)
    : clock_(clock),
      reader_(BatchReader::Create(BatchReader::kDefaultQueueDepth, force_pread)),
      thread_([this] { Loop(); }) {}

AsyncBatch::~AsyncBatch() {
  {
    std::unique_lock<std::mutex> lk(mu_);
    // Batches in flight write into caller buffers: let them finish before anything is freed.
    cv_.wait(lk, [&] { return next_to_read_ == queue_.size(); });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t AsyncBatch::Submit(std::vector<ReadRequest> reqs) {
  uint64_t first;
  {
    std::lock_guard<std::mutex> lk(mu_);
    first = next_ticket_;
    next_ticket_ += reqs.size();
    Batch& b = queue_.emplace_back();
    b.first = first;
    b.arrived.assign(reqs.size(), 0);
    b.taken.assign(reqs.size(), 0);
    b.reqs = std::move(reqs);
  }
  cv_.notify_all();
  return first;
}

AsyncBatch::Batch* AsyncBatch::Find(uint64_t ticket) {
  for (Batch& b : queue_) {
    if (ticket >= b.first && ticket - b.first < b.reqs.size()) {
      return b.taken[ticket - b.first] ? nullptr : &b;
    }
  }
  return nullptr;
}

void AsyncBatch::DropTaken() {
  while (next_to_read_ > 0 && queue_.front().read && queue_.front().n_taken == queue_.front().reqs.size()) {
    queue_.pop_front();
    --next_to_read_;
  }
}

bool AsyncBatch::Arrived(uint64_t ticket) {
  std::lock_guard<std::mutex> lk(mu_);
  const Batch* b = Find(ticket);
  return b != nullptr && b->arrived[ticket - b->first] != 0;
}

Status AsyncBatch::Take(uint64_t ticket, double* waited_seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lk(mu_);
  Batch* b = Find(ticket);
  if (b == nullptr) return Status::Invalid("no such read request (internal)");
  // The batch holding the ticket cannot be popped while the ticket is not taken, and std::deque
  // keeps b valid while other batches are pushed or popped.
  const size_t i = ticket - b->first;
  cv_.wait(lk, [&] { return b->arrived[i] != 0; });
  AddWaited(t0, waited_seconds);
  Status s = b->reqs[i].status;
  b->taken[i] = 1;
  ++b->n_taken;
  DropTaken();
  return s;
}

bool AsyncBatch::pending() {
  std::lock_guard<std::mutex> lk(mu_);
  for (const Batch& b : queue_) {
    if (b.n_taken < b.reqs.size()) return true;
  }
  return false;
}

void AsyncBatch::Loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    cv_.wait(lk, [&] { return stop_ || next_to_read_ < queue_.size(); });
    if (stop_) return;
    Batch& b = queue_[next_to_read_];
    // b.reqs is neither moved nor resized while it is read: the engine reads the statuses of
    // arrived requests meanwhile.
    const std::span<ReadRequest> reqs(b.reqs);
    lk.unlock();
    if (!reqs.empty()) {
      if (clock_ != nullptr) clock_->Begin();
      // Per-request statuses are the result.
      (void)reader_->ReadAll(reqs, [this, &b](size_t i) {
        {
          std::lock_guard<std::mutex> g(mu_);
          b.arrived[i] = 1;
        }
        cv_.notify_all();
      });
      if (clock_ != nullptr) clock_->End();
    }
    lk.lock();
    b.read = true;
    ++next_to_read_;
    DropTaken();
    cv_.notify_all();
  }
}

}  // namespace k3::run
