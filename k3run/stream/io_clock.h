// IoClock: how long at least one weight read was in flight (the union of the read intervals of
// every I/O thread), so the report can say what share of the wall clock was I/O and how much of
// it the engine did not wait for (DESIGN.md §6 k3run report: "I/O share and overlap").
//
// Thread safety: Begin/End/BusySeconds may be called from any thread. Begin and End pair up per
// read; reads may overlap (several threads, or io_uring batches counted as one read).
#pragma once

#include <chrono>
#include <mutex>

namespace k3::run {

class IoClock {
 public:
  using clock = std::chrono::steady_clock;
  using NowFn = clock::time_point (*)();

  // `now` reads the time (tests pass a fake clock they advance themselves).
  explicit IoClock(NowFn now = &clock::now) : now_(now) {}

  void Begin() {
    std::lock_guard<std::mutex> lk(mu_);
    if (active_++ == 0) since_ = now_();
  }
  void End() {
    std::lock_guard<std::mutex> lk(mu_);
    if (--active_ == 0) busy_ += now_() - since_;
  }
  // Busy time so far, counting a read still in flight up to now.
  double BusySeconds() const {
    std::lock_guard<std::mutex> lk(mu_);
    clock::duration b = busy_;
    if (active_ > 0) b += now_() - since_;
    return std::chrono::duration<double>(b).count();
  }

 private:
  NowFn now_;
  mutable std::mutex mu_;
  int active_ = 0;
  clock::time_point since_{};
  clock::duration busy_{};
};

// Scope guard: one read in flight while it lives.
class IoScope {
 public:
  explicit IoScope(IoClock* c) : c_(c) { c_->Begin(); }
  ~IoScope() { c_->End(); }
  IoScope(const IoScope&) = delete;
  IoScope& operator=(const IoScope&) = delete;

 private:
  IoClock* c_;
};

}  // namespace k3::run
