// Direct reads and the batch reader (io_uring, or a pread thread pool).
//
// Every request is cut into pieces (bounded so that large reads spread over the queue and
// bounce buffers stay small). A piece of a direct file whose offset, length or destination is
// not aligned is read as the aligned window around it into a bounce buffer and the wanted bytes
// are copied out; anything else is read straight into the caller's memory.
#include "common/direct_reader.h"

#include <liburing.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/align.h"
#include "common/aligned_buffer.h"

namespace k3 {
namespace {

constexpr uint64_t kBouncePieceBytes = 1 << 20;  // bounced reads: bounds bounce memory

bool NeedsBounce(const File* file, uint32_t alignment, uint64_t offset, uint64_t length,
                 const void* dst) {
  if (!file->direct() || alignment <= 1) return false;
  return offset % alignment != 0 || length % alignment != 0 ||
         reinterpret_cast<uintptr_t>(dst) % alignment != 0;
}

// Reads [offset, offset+n) into buf, looping over short reads; data must be present up to
// need_end (the window of a bounced read may run past end of file, which is fine).
Status ReadWindow(File* file, bool direct, uint32_t alignment, uint64_t offset, uint64_t n,
                  uint8_t* buf, uint64_t need_end, uint64_t want_offset, uint64_t want_len) {
  uint64_t done = 0;
  while (done < n) {
    size_t got = 0;
    K3_RETURN_IF_ERROR(file->PRead(offset + done, static_cast<size_t>(n - done), buf + done, &got));
    if (got == 0) break;
    done += got;
    // O_DIRECT returns a partial block only at end of file; the next read would be unaligned.
    if (direct && alignment > 1 && done % alignment != 0) break;
  }
  if (offset + done < need_end) {
    return PrematureEofError(file->path(), offset + done, want_offset, want_len);
  }
  return Status::Ok();
}

// One bounce buffer per thread, grown on demand: pool threads and callers reuse it.
Result<uint8_t*> ThreadBounce(uint64_t size, uint32_t alignment) {
  thread_local AlignedBuffer buf;
  thread_local uint32_t buf_align = 0;
  if (buf.size() < size || buf_align < alignment) {
    K3_ASSIGN_OR_RETURN(buf, AlignedBuffer::Allocate(static_cast<size_t>(size), alignment));
    buf_align = alignment;
  }
  return buf.data();
}

// One piece of a request: [offset, offset+length) of the request's range.
struct Piece {
  size_t request;
  uint64_t offset;
  uint64_t length;
};

std::vector<Piece> CutPieces(std::span<ReadRequest> requests, uint32_t alignment,
                             uint64_t piece_bytes, bool (*want)(const ReadRequest&)) {
  std::vector<Piece> pieces;
  for (size_t i = 0; i < requests.size(); ++i) {
    const ReadRequest& r = requests[i];
    if (r.length == 0 || !want(r)) continue;
    const uint64_t step =
        NeedsBounce(r.file, alignment, r.offset, r.length, r.dst) ? kBouncePieceBytes : piece_bytes;
    for (uint64_t p = 0; p < r.length; p += step) {
      pieces.push_back(Piece{i, r.offset + p, std::min(step, r.length - p)});
    }
  }
  return pieces;
}

// Validates requests and resets their status; false entries are already failed.
void ResetStatuses(std::span<ReadRequest> requests) {
  for (ReadRequest& r : requests) {
    r.status = Status::Ok();
    if (r.file == nullptr || (r.dst == nullptr && r.length > 0)) {
      r.status = Status::Invalid("read request without file or destination (internal)");
    }
  }
}

Status FirstFailure(std::span<ReadRequest> requests) {
  for (const ReadRequest& r : requests) {
    if (!r.status.ok()) return r.status;
  }
  return Status::Ok();
}

// Tracks when each request is done (its status final) and tells the caller once per request:
// when its last piece finished, or through Done() for one read another way. Start() tells the
// requests without pieces (failed up front, zero length); Finish() tells whatever is left
// (pieces abandoned after a ring failure), after their statuses are final.
class Completions {
 public:
  Completions(std::span<ReadRequest> requests, const std::vector<Piece>& pieces,
              const BatchReader::RequestDone& on_done)
      : on_done_(on_done), left_(requests.size()), told_(requests.size()) {
    for (const Piece& p : pieces) left_[p.request].fetch_add(1, std::memory_order_relaxed);
  }
  void Start() {
    for (size_t i = 0; i < left_.size(); ++i) {
      if (left_[i].load(std::memory_order_relaxed) == 0) Done(i);
    }
  }
  // Thread-safe: pieces of one request may finish on different threads.
  void PieceDone(size_t request) {
    if (left_[request].fetch_sub(1, std::memory_order_acq_rel) == 1) Done(request);
  }
  void Done(size_t i) {
    if (!told_[i].exchange(true, std::memory_order_acq_rel) && on_done_) on_done_(i);
  }
  // Whether the request was told done (its status must not change any more).
  bool Told(size_t request) const { return told_[request].load(std::memory_order_acquire); }
  void Finish() {
    for (size_t i = 0; i < told_.size(); ++i) Done(i);
  }

 private:
  const BatchReader::RequestDone& on_done_;
  std::vector<std::atomic<uint32_t>> left_;
  std::vector<std::atomic<bool>> told_;
};

// ---------------------------------------------------------------------------------------------
// pread pool

// A fixed set of threads that run the tasks of one job at a time (plus the calling thread).
class ThreadPool {
 public:
  explicit ThreadPool(int threads) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  void Run(size_t n, const std::function<void(size_t)>& fn) {
    if (n == 0) return;
    auto job = std::make_shared<Job>();
    job->fn = &fn;
    job->n = n;
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = job;
      ++generation_;
    }
    cv_.notify_all();
    job->Work();
    std::unique_lock<std::mutex> lock(job->mu);
    job->cv.wait(lock, [&] { return job->done.load() == job->n; });
  }

 private:
  struct Job {
    const std::function<void(size_t)>* fn = nullptr;  // valid while done < n
    size_t n = 0;
    std::atomic<size_t> next{0};
    std::atomic<size_t> done{0};
    std::mutex mu;
    std::condition_variable cv;
    void Work() {
      for (size_t i; (i = next.fetch_add(1)) < n;) {
        (*fn)(i);
        if (done.fetch_add(1) + 1 == n) {
          std::lock_guard<std::mutex> lock(mu);
          cv.notify_all();
        }
      }
    }
  };

  void WorkerLoop() {
    uint64_t seen = 0;
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      job->Work();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t generation_ = 0;
  std::shared_ptr<Job> job_;
  std::vector<std::thread> workers_;
};

class PoolReader final : public BatchReader {
 public:
  PoolReader(int queue_depth, uint32_t alignment, uint64_t piece_bytes, std::string backend)
      : queue_depth_(queue_depth),
        alignment_(alignment),
        piece_bytes_(piece_bytes),
        backend_(std::move(backend)),
        // The caller is one of the readers, so queue_depth reads are in flight at once.
        pool_(std::max(0, queue_depth - 1)) {}

  std::string_view backend() const override { return backend_; }
  int queue_depth() const override { return queue_depth_; }

  Status ReadAll(std::span<ReadRequest> requests, const RequestDone& on_done) override {
    ResetStatuses(requests);
    const std::vector<Piece> pieces =
        CutPieces(requests, alignment_, piece_bytes_,
                  [](const ReadRequest& r) { return r.status.ok(); });
    Completions completions(requests, pieces, on_done);
    completions.Start();
    std::mutex status_mu;
    const std::function<void(size_t)> task = [&](size_t k) {
      const Piece& piece = pieces[k];
      ReadRequest& r = requests[piece.request];
      bool skip;
      {
        std::lock_guard<std::mutex> lock(status_mu);
        skip = !r.status.ok();  // an earlier piece failed: skip the rest
      }
      if (!skip) {
        Status s = DirectRead(r.file, alignment_, piece.offset, piece.length,
                              static_cast<uint8_t*>(r.dst) + (piece.offset - r.offset));
        if (!s.ok()) {
          std::lock_guard<std::mutex> lock(status_mu);
          if (r.status.ok()) r.status = std::move(s);
        }
      }
      completions.PieceDone(piece.request);
    };
    pool_.Run(pieces.size(), task);  // every piece reports PieceDone, so all are told
    return FirstFailure(requests);
  }

 private:
  int queue_depth_;
  uint32_t alignment_;
  uint64_t piece_bytes_;
  std::string backend_;
  ThreadPool pool_;
};

// ---------------------------------------------------------------------------------------------
// io_uring

class UringReader final : public BatchReader {
 public:
  UringReader(int queue_depth, uint32_t alignment, uint64_t piece_bytes)
      : queue_depth_(queue_depth), alignment_(alignment), piece_bytes_(piece_bytes),
        slots_(static_cast<size_t>(queue_depth)) {}
  ~UringReader() override {
    if (initialized_) io_uring_queue_exit(&ring_);
  }
  // 0, or the negated errno of io_uring_queue_init. The ring is set up in place: liburing's
  // struct holds pointers into the kernel-shared rings and is not meant to be copied.
  int Init() {
    const int ret = io_uring_queue_init(static_cast<unsigned>(queue_depth_), &ring_, 0);
    initialized_ = ret == 0;
    return ret;
  }

  std::string_view backend() const override { return "io_uring"; }
  int queue_depth() const override { return queue_depth_; }

  Status ReadAll(std::span<ReadRequest> requests, const RequestDone& on_done) override;

 private:
  // A piece in flight. For a bounced piece the window [offset, offset+length) is aligned and
  // the wanted bytes start at copy_from inside it.
  struct Slot {
    size_t request = 0;
    uint64_t offset = 0;  // file offset of the window
    uint64_t length = 0;
    uint64_t done = 0;
    uint64_t need_end = 0;  // the piece's data must reach this file offset
    uint8_t* buf = nullptr;
    bool bounced = false;
    uint64_t copy_from = 0;
    uint64_t copy_len = 0;
    uint8_t* copy_dst = nullptr;
    AlignedBuffer bounce;
  };

  Status Prepare(Slot* slot, std::span<ReadRequest> requests, const Piece& piece);
  bool Queue(size_t slot_index, std::span<ReadRequest> requests);
  // Handles one completion; returns true when the slot is free again.
  bool Complete(size_t slot_index, int res, std::span<ReadRequest> requests);

  io_uring ring_{};
  bool initialized_ = false;
  int queue_depth_;
  uint32_t alignment_;
  uint64_t piece_bytes_;
  std::vector<Slot> slots_;
};

Status UringReader::Prepare(Slot* slot, std::span<ReadRequest> requests, const Piece& piece) {
  const ReadRequest& r = requests[piece.request];
  uint8_t* dst = static_cast<uint8_t*>(r.dst) + (piece.offset - r.offset);
  slot->request = piece.request;
  slot->done = 0;
  slot->need_end = piece.offset + piece.length;
  slot->bounced = NeedsBounce(r.file, alignment_, r.offset, r.length, r.dst);
  if (!slot->bounced) {
    slot->offset = piece.offset;
    slot->length = piece.length;
    slot->buf = dst;
    return Status::Ok();
  }
  slot->offset = AlignDown(piece.offset, alignment_);
  slot->length = AlignUp(piece.offset + piece.length, alignment_) - slot->offset;
  slot->copy_from = piece.offset - slot->offset;
  slot->copy_len = piece.length;
  slot->copy_dst = dst;
  if (slot->bounce.size() < slot->length) {
    K3_ASSIGN_OR_RETURN(slot->bounce,
                        AlignedBuffer::Allocate(static_cast<size_t>(kBouncePieceBytes +
                                                                    2 * alignment_),
                                                alignment_));
  }
  slot->buf = slot->bounce.data();
  return Status::Ok();
}

bool UringReader::Queue(size_t slot_index, std::span<ReadRequest> requests) {
  Slot& slot = slots_[slot_index];
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) return false;  // cannot happen: at most queue_depth slots in flight
  const uint64_t left = slot.length - slot.done;
  // A single read returns at most 0x7ffff000 bytes anyway; pieces are far smaller.
  io_uring_prep_read(sqe, requests[slot.request].file->fd(), slot.buf + slot.done,
                     static_cast<unsigned>(left), slot.offset + slot.done);
  io_uring_sqe_set_data64(sqe, slot_index);
  return true;
}

bool UringReader::Complete(size_t slot_index, int res, std::span<ReadRequest> requests) {
  Slot& slot = slots_[slot_index];
  ReadRequest& r = requests[slot.request];
  // Re-queues the rest of the piece; the slot stays busy unless that is impossible.
  auto requeue = [&] {
    if (Queue(slot_index, requests)) return false;
    if (r.status.ok()) r.status = Status::Io("io_uring: submission queue full (internal)");
    return true;
  };
  if (res == -EINTR || res == -EAGAIN) return requeue();
  if (res < 0) {
    if (r.status.ok()) {
      r.status = Status::IoErrno("read", r.file->path(), -res, slot.offset + slot.done);
    }
    return true;
  }
  slot.done += static_cast<uint64_t>(res);
  const bool direct = r.file->direct() && alignment_ > 1;
  const bool at_eof = res == 0 || (direct && slot.done % alignment_ != 0);
  if (slot.done < slot.length && !at_eof) return requeue();  // short read: read the rest
  if (slot.offset + slot.done < slot.need_end) {
    if (r.status.ok()) {
      r.status = PrematureEofError(r.file->path(), slot.offset + slot.done, r.offset, r.length);
    }
    return true;
  }
  if (slot.bounced && r.status.ok()) {
    std::memcpy(slot.copy_dst, slot.buf + slot.copy_from, static_cast<size_t>(slot.copy_len));
  }
  return true;
}

Status UringReader::ReadAll(std::span<ReadRequest> requests, const RequestDone& on_done) {
  ResetStatuses(requests);
  const std::vector<Piece> pieces = CutPieces(
      requests, alignment_, piece_bytes_, [](const ReadRequest& r) { return r.status.ok() && r.file->fd() >= 0; });
  Completions completions(requests, pieces, on_done);
  // Files without a descriptor (fault injection, in-memory) cannot go to the kernel: read them
  // here, synchronously, through File::PRead, each told done as it is read.
  for (size_t i = 0; i < requests.size(); ++i) {
    ReadRequest& r = requests[i];
    if (r.status.ok() && r.file->fd() < 0) {
      r.status = DirectRead(r.file, alignment_, r.offset, r.length, r.dst);
      completions.Done(i);
    }
  }
  completions.Start();

  std::vector<size_t> free_slots;
  for (size_t i = slots_.size(); i > 0; --i) free_slots.push_back(i - 1);
  size_t next = 0;
  size_t in_flight = 0;
  Status ring_failure;
  while (ring_failure.ok() && (next < pieces.size() || in_flight > 0)) {
    while (!free_slots.empty() && next < pieces.size()) {
      const Piece& piece = pieces[next++];
      ReadRequest& r = requests[piece.request];
      if (!r.status.ok()) {  // an earlier piece failed: skip the rest
        completions.PieceDone(piece.request);
        continue;
      }
      const size_t s = free_slots.back();
      Status prep = Prepare(&slots_[s], requests, piece);
      if (!prep.ok()) {
        r.status = std::move(prep);
        completions.PieceDone(piece.request);
        continue;
      }
      if (!Queue(s, requests)) {
        ring_failure = Status::Io("io_uring: submission queue full (internal)");
        break;
      }
      free_slots.pop_back();
      ++in_flight;
    }
    if (in_flight == 0) break;
    int ret = io_uring_submit(&ring_);
    if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) {
      ring_failure = Status::IoErrno("io_uring_submit", "(batch read)", -ret);
    }
    // Reap at least one completion, then everything else that is ready.
    io_uring_cqe* cqe = nullptr;
    ret = io_uring_wait_cqe(&ring_, &cqe);
    if (ret == -EINTR) continue;
    if (ret < 0) {
      ring_failure = Status::IoErrno("io_uring_wait_cqe", "(batch read)", -ret);
      break;
    }
    do {
      const auto slot_index = static_cast<size_t>(io_uring_cqe_get_data64(cqe));
      const int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      if (Complete(slot_index, res, requests)) {
        free_slots.push_back(slot_index);
        --in_flight;
        completions.PieceDone(slots_[slot_index].request);
      }
    } while (io_uring_peek_cqe(&ring_, &cqe) == 0);
  }
  if (!ring_failure.ok()) {
    // Wait out what the kernel still owns (it writes into caller memory), then fail the rest.
    while (in_flight > 0) {
      io_uring_cqe* cqe = nullptr;
      if (io_uring_wait_cqe(&ring_, &cqe) != 0) break;
      io_uring_cqe_seen(&ring_, cqe);
      --in_flight;
    }
    // Requests already done keep their status: the caller may have used them.
    for (size_t i = 0; i < requests.size(); ++i) {
      ReadRequest& r = requests[i];
      if (!completions.Told(i) && r.status.ok() && r.length > 0 && r.file->fd() >= 0) {
        r.status = ring_failure;
      }
    }
  }
  completions.Finish();
  return FirstFailure(requests);
}

}  // namespace

Status DirectRead(File* file, uint32_t alignment, uint64_t offset, uint64_t length, void* dst) {
  if (length == 0) return Status::Ok();
  auto* out = static_cast<uint8_t*>(dst);
  const bool direct = file->direct() && alignment > 1;
  if (!NeedsBounce(file, alignment, offset, length, dst)) {
    return ReadWindow(file, direct, alignment, offset, length, out, offset + length, offset,
                      length);
  }
  K3_ASSIGN_OR_RETURN(uint8_t* bounce, ThreadBounce(kBouncePieceBytes + 2 * alignment, alignment));
  for (uint64_t pos = offset; pos < offset + length;) {
    const uint64_t piece = std::min(kBouncePieceBytes, offset + length - pos);
    const uint64_t ws = AlignDown(pos, alignment);
    const uint64_t we = AlignUp(pos + piece, alignment);
    K3_RETURN_IF_ERROR(
        ReadWindow(file, true, alignment, ws, we - ws, bounce, pos + piece, offset, length));
    std::memcpy(out + (pos - offset), bounce + (pos - ws), static_cast<size_t>(piece));
    pos += piece;
  }
  return Status::Ok();
}

std::unique_ptr<BatchReader> BatchReader::Create(int queue_depth, bool force_pread,
                                                 uint32_t alignment, uint64_t piece_bytes) {
  queue_depth = std::clamp(queue_depth, 1, 4096);
  if (alignment == 0) alignment = 1;
  piece_bytes = std::max<uint64_t>(AlignUp(std::max<uint64_t>(piece_bytes, 1), 4096), 4096);
  if (force_pread) {
    return std::make_unique<PoolReader>(queue_depth, alignment, piece_bytes, "pread-pool");
  }
  auto uring = std::make_unique<UringReader>(queue_depth, alignment, piece_bytes);
  const int ret = uring->Init();
  if (ret < 0) {
    // EPERM (seccomp, io_uring_disabled), ENOSYS (old kernel), ENOMEM (locked-memory limit):
    // all mean "use threads instead"; so does anything else the kernel says.
    return std::make_unique<PoolReader>(
        queue_depth, alignment, piece_bytes,
        std::string("pread-pool (io_uring unavailable: ") + std::strerror(-ret) + ")");
  }
  return uring;
}

}  // namespace k3
