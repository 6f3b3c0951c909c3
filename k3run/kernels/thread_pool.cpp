// Chunk-claiming fork/join with spin-then-sleep workers (see thread_pool.h).
//
// Protocol. A run first CLOSES the claim word under a new run number, (run − 1) << 32 | kClosed,
// then publishes fn and chunk count n, then opens it: claim_ = (run << 32) | 0. Anyone claims
// chunk i by CAS-ing claim_ from (run << 32) | i to (run << 32) | (i + 1) with i < n, runs it and
// increments done_. The caller claims until none are left, then waits for done_ == n.
// A worker that wakes late holds a stale claim value: its CAS fails, it touches nothing.
// Why the closing step: without it, a worker holding the previous run's last value
// (old run | old n) could read the NEW n_ (larger than the old one) before the new run number
// was stored, pass the bound check, win its CAS on the still-unchanged word and run a chunk of
// the new run with a stale index: that chunk ran twice, done_ stepped past n and the caller
// spun forever (a hang first seen in CI once chunk counts varied from run to run).
#include "k3run/kernels/thread_pool.h"

#include <immintrin.h>

#include <atomic>
#include <thread>
#include <vector>

namespace k3::kernels {
namespace {

constexpr int kWorkerSpins = 2048;  // ~a few µs of pause: bridges back-to-back MatMuls
constexpr uint64_t kClosed = 0xffffffffu;  // an index no run reaches (n < 2^32)

class Pool {
 public:
  void Run(int threads, int64_t n, const std::function<void(int64_t)>& fn) {
    Grow(threads - 1);
    const uint64_t closing = (claim_.load(std::memory_order_relaxed) >> 32) + 1;
    // An RMW, ordered before the n_ store (release) that a worker's bound check reads with
    // acquire: a worker that sees the new n_ can no longer win a CAS on the old word.
    claim_.exchange((closing << 32) | kClosed, std::memory_order_acq_rel);
    fn_.store(&fn, std::memory_order_relaxed);
    n_.store(n, std::memory_order_release);
    done_.store(0, std::memory_order_relaxed);
    const uint64_t run = closing + 1;
    claim_.store(run << 32, std::memory_order_release);
    if (sleepers_.load(std::memory_order_acquire) > 0) claim_.notify_all();
    Work(run);
    while (done_.load(std::memory_order_acquire) != n) _mm_pause();
  }

 private:
  void Grow(int workers) {
    while (static_cast<int>(threads_.size()) < workers) {
      threads_.emplace_back([this] { Worker(); });
      threads_.back().detach();  // lives for the process; never joined
    }
  }

  // Claims and runs chunks of `run` until none are left (or the run is over).
  void Work(uint64_t run) {
    uint64_t c = claim_.load(std::memory_order_acquire);
    while ((c >> 32) == run) {
      const int64_t i = static_cast<int64_t>(c & 0xffffffffu);
      if (i >= n_.load(std::memory_order_acquire)) return;
      if (claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel)) {
        (*fn_.load(std::memory_order_relaxed))(i);
        done_.fetch_add(1, std::memory_order_release);
        c = claim_.load(std::memory_order_acquire);
      }
    }
  }

  void Worker() {
    uint64_t seen = claim_.load(std::memory_order_acquire) >> 32;
    while (true) {
      uint64_t c = claim_.load(std::memory_order_acquire);
      for (int i = 0; i < kWorkerSpins && (c >> 32) == seen; ++i) {
        _mm_pause();
        c = claim_.load(std::memory_order_acquire);
      }
      if ((c >> 32) == seen) {
        sleepers_.fetch_add(1, std::memory_order_acq_rel);
        // Re-check after announcing: a run published before the announcement is seen here.
        c = claim_.load(std::memory_order_acquire);
        while ((c >> 32) == seen) {
          claim_.wait(c, std::memory_order_acquire);
          c = claim_.load(std::memory_order_acquire);
        }
        sleepers_.fetch_sub(1, std::memory_order_acq_rel);
      }
      seen = c >> 32;
      Work(seen);
    }
  }

  std::vector<std::thread> threads_;
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<int> sleepers_{0};
  // Stored before the claim word (release); a successful claim (acquire) sees this run's values.
  std::atomic<const std::function<void(int64_t)>*> fn_{nullptr};
  std::atomic<int64_t> n_{0};
};

Pool& ThePool() {
  static Pool* pool = new Pool();  // never destroyed: detached workers use it until exit
  return *pool;
}

}  // namespace

void ParallelChunks(int threads, int64_t n, const std::function<void(int64_t chunk)>& fn) {
  // n ≥ kClosed cannot be indexed in the claim word: inline, in order (no caller comes close).
  if (threads <= 1 || n <= 1 || static_cast<uint64_t>(n) >= kClosed) {
    for (int64_t c = 0; c < n; ++c) fn(c);
    return;
  }
  ThePool().Run(threads, n, fn);
}

}  // namespace k3::kernels
