// The trunk ring's reader thread and hand-over protocol (see k3run/stream/trunk_ring.h).
#include "k3run/stream/trunk_ring.h"

#include <algorithm>
#include <chrono>
#include <span>
#include <utility>

namespace k3::run {

uint64_t RingPieceBytes(uint64_t slot_bytes) {
  return std::clamp<uint64_t>(slot_bytes / 16, uint64_t{512} << 10, uint64_t{4} << 20);
}

TrunkRing::TrunkRing(std::vector<RingItem> walk, IoClock* clock)
    : walk_(std::move(walk)), clock_(clock) {}

Result<std::unique_ptr<TrunkRing>> TrunkRing::Start(std::vector<RingItem> walk, int slots,
                                                    uint64_t slot_bytes, IoClock* clock,
                                                    bool force_pread) {
  if (slots < 2 || walk.empty()) {
    return Status::Invalid("trunk ring: needs at least 2 slots and a non-empty walk (got " +
                           std::to_string(slots) + " slots, " + std::to_string(walk.size()) +
                           " items)");
  }
  for (const RingItem& it : walk) {
    if (it.length > slot_bytes) {
      return Status::Invalid("trunk ring: " + it.what + " (" + std::to_string(it.length) +
                             " bytes) exceeds the ring slot of " + std::to_string(slot_bytes) +
                             " bytes: the plan does not match the prepared directory");
    }
  }
  std::unique_ptr<TrunkRing> r(new TrunkRing(std::move(walk), clock));
  r->slots_.resize(static_cast<size_t>(slots));
  for (Slot& s : r->slots_) {
    // Large slots on huge pages: fewer page pins per O_DIRECT read.
    K3_ASSIGN_OR_RETURN(s.buf, AlignedBuffer::AllocateLarge(slot_bytes));
  }
  // QD 16 per reader: an item is cut into pieces (direct_reader.cpp) that are in flight together.
  const int readers = slots >= 3 ? 2 : 1;
  for (int i = 0; i < readers; ++i) {
    r->readers_.push_back(BatchReader::Create(BatchReader::kDefaultQueueDepth, force_pread, 4096,
                                              RingPieceBytes(slot_bytes)));
  }
  for (int i = 0; i < readers; ++i) {
    r->threads_.emplace_back([p = r.get(), i] { p->ReaderLoop(p->readers_[size_t(i)].get()); });
  }
  return r;
}

TrunkRing::~TrunkRing() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

TrunkRing::Slot* TrunkRing::SlotForSeq(uint64_t seq) {
  for (Slot& s : slots_) {
    if (s.state != State::kEmpty && s.state != State::kConsumed && s.seq == seq) return &s;
  }
  return nullptr;
}

TrunkRing::Slot* TrunkRing::FreeSlot() {
  for (Slot& s : slots_) {
    if (s.state == State::kEmpty || s.state == State::kConsumed) return &s;
  }
  return nullptr;
}

void TrunkRing::ReaderLoop(BatchReader* reader) {
  std::unique_lock<std::mutex> lk(mu_);
  const uint64_t reach = slots_.size();
  while (true) {
    // Invariant (1): only free slots are filled, and never more than `reach` items ahead.
    const auto may_load = [&] {
      return stop_ || (next_ < expected_ + reach && FreeSlot() != nullptr);
    };
    if (!may_load()) {
      ++parked_;
      cv_.notify_all();  // WaitReadersParked
      cv_.wait(lk, may_load);
      --parked_;
    }
    if (stop_) return;
    Slot* s = FreeSlot();
    s->seq = next_++;
    s->state = State::kLoading;
    const RingItem& item = walk_[s->seq % walk_.size()];
    ReadRequest req;
    req.file = item.file;
    req.offset = item.offset;
    req.length = item.length;
    req.dst = s->buf.data();
    lk.unlock();
    Status st;
    {
      if (clock_ != nullptr) clock_->Begin();
      st = reader->ReadAll(std::span<ReadRequest>(&req, 1));
      if (clock_ != nullptr) clock_->End();
    }
    lk.lock();
    ++loads_;
    if (st.ok()) {
      s->state = State::kReady;  // invariant (2): published under the mutex
    } else {
      s->state = State::kFailed;
      s->status = Status::Io(item.file->path() + ": reading " + item.what + " at byte offset " +
                             std::to_string(item.offset) + " (+" + std::to_string(item.length) +
                             " bytes) failed: " + st.ToString() +
                             "; check the disk (k3verify prepared) or re-run k3prep pack");
    }
    cv_.notify_all();
  }
}

// Invariant (3): the walk restarts at `pos`; nothing in flight is abandoned mid-read.
void TrunkRing::ResyncLocked(size_t pos, std::unique_lock<std::mutex>& lk) {
  ++resyncs_;
  cv_.wait(lk, [&] {
    for (const Slot& s : slots_) {
      if (s.state == State::kLoading) return false;
    }
    return true;
  });
  for (Slot& s : slots_) {
    if (s.state != State::kInUse) s.state = State::kEmpty;
  }
  const uint64_t W = walk_.size();
  const uint64_t base = next_ + (pos + W - next_ % W) % W;  // ≥ next_, ≡ pos (mod W)
  next_ = expected_ = base;
  cv_.notify_all();
}

Result<TrunkRing::Acquired> TrunkRing::Acquire(size_t pos, double* waited_seconds) {
  if (pos >= walk_.size()) {
    return Status::Invalid("trunk ring: item " + std::to_string(pos) + " outside the walk of " +
                           std::to_string(walk_.size()));
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lk(mu_);
  if (expected_ % walk_.size() != pos) ResyncLocked(pos, lk);
  const uint64_t seq = expected_;
  Slot* s = nullptr;
  cv_.wait(lk, [&] {
    s = SlotForSeq(seq);
    return s != nullptr && (s->state == State::kReady || s->state == State::kFailed);
  });
  if (waited_seconds != nullptr) {
    *waited_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (s->state == State::kFailed) {
    Status st = std::move(s->status);
    s->state = State::kEmpty;
    // The item is wanted again next: re-read it rather than skipping ahead.
    ResyncLocked(pos, lk);
    return st;
  }
  s->state = State::kInUse;
  ++expected_;
  cv_.notify_all();
  return Acquired{static_cast<int>(s - slots_.data()), s->buf.data()};
}

void TrunkRing::Release(size_t pos) {
  std::lock_guard<std::mutex> lk(mu_);
  for (Slot& s : slots_) {
    if (s.state == State::kInUse && s.seq % walk_.size() == pos) s.state = State::kConsumed;
  }
  cv_.notify_all();
}

bool TrunkRing::WaitReadersParked(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  return cv_.wait_for(lk, timeout, [&] { return parked_ == threads_.size(); });
}

uint64_t TrunkRing::loads() const {
  std::lock_guard<std::mutex> lk(mu_);
  return loads_;
}

uint64_t TrunkRing::resyncs() const {
  std::lock_guard<std::mutex> lk(mu_);
  return resyncs_;
}

}  // namespace k3::run
