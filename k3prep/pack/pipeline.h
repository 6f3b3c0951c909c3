// The pack pipeline (internal to `k3prep pack`): a reader fills window buffers with batched
// reads (BatchReader: io_uring, pread fallback), the consumer hashes in destination order and
// writes the temporary outputs, and finished units are journaled once their bytes are fsynced.
//
// Invariants: everything that decides a hash runs on the consumer (the calling thread), in
// window order, so no result depends on --jobs. A journal line is appended only after the
// output holding its unit has been fsynced.
// Use: OpenSources, StartJournal, OpenOutputs, Run, FinishOutputs; then backend().
// Thread safety: one Packer per pack, driven from one thread; it runs its own reader thread
// (--jobs ≥ 2) and a background fsync thread internally.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/aligned_buffer.h"
#include "common/direct_reader.h"
#include "common/env.h"
#include "common/hash.h"
#include "common/progress.h"
#include "common/status.h"
#include "k3prep/pack/pack.h"
#include "k3prep/pack/plan.h"

namespace k3::prep::pack_internal {

// Windows [first, first + count), filled by one batched read.
struct Batch {
  size_t first = 0;
  size_t count = 0;
};

class Packer {
 public:
  // plan is filled in (region/expert/unit hashes) by Run; stats counts bytes read and written.
  Packer(Env* env, Plan* plan, const PackOptions& o, PackStats* stats)
      : env_(env), plan_(plan), o_(o), stats_(stats) {}
  ~Packer() { StopSyncer(); }

  Status OpenSources();
  // Writes `initial` as the journal (atomically) and appends to it from then on.
  Status StartJournal(const std::string& path, const std::string& initial);
  // Opens every written stream's temporary file: kept (read-write) when resume reuses part of
  // it, else created empty.
  Status OpenOutputs();
  // Reads, hashes and writes every window; on failure the journal is still brought up to date
  // (best effort) so --resume keeps what was finished.
  Status Run(const std::vector<Window>& windows, Progress* progress);
  // Truncates each temporary output to its planned size, fsyncs and closes it.
  Status FinishOutputs();

  const std::string& backend() const { return backend_; }

 private:
  static constexpr size_t kBuffers = 3;
  static constexpr uint64_t kBlock = 4096;
  // Reading a gap this small costs less than splitting one large read into two.
  static constexpr uint64_t kBridgeBytes = 256 << 10;

  Status Fill(const Batch& batch, uint8_t* buf, BatchReader* reader);
  Status Consume(const Window& w, const uint8_t* buf);
  Status FlushJournal(bool best_effort = false);
  Status ConsumeBatch(const Batch& batch, const uint8_t* buf);
  std::vector<Batch> MakeBatches() const;
  std::unique_ptr<BatchReader> CreateReader();
  Status RunSerial();
  Status RunOverlapped();
  void StartSyncer();
  void QueueSync(size_t stream);
  void StopSyncer();
  void InitCursors();
  Status WriteOut(size_t stream, uint64_t offset, const uint8_t* data, uint64_t len);

  Env* env_;
  Plan* plan_;
  const PackOptions& o_;
  PackStats* stats_;
  Progress* progress_ = nullptr;
  std::string backend_;
  const std::vector<Window>* windows_ = nullptr;
  std::vector<std::unique_ptr<File>> sources_;
  AlignedBuffer staging_;  // used by Fill only (one reader thread)
  std::vector<std::unique_ptr<File>> outputs_;
  // Per output: the O_DIRECT alignment its file system reports (0: write through the page
  // cache only), and whether its descriptor is in O_DIRECT mode now (see WriteOut).
  std::vector<uint32_t> out_align_;
  std::vector<bool> out_direct_;
  std::unique_ptr<File> journal_;
  uint64_t journal_size_ = 0;
  std::vector<size_t> pending_;
  std::map<size_t, bool> dirty_;
  uint64_t unflushed_ = 0;
  std::vector<size_t> unit_cursor_;
  size_t cur_unit_ = SIZE_MAX;
  int32_t cur_region_ = -1, cur_expert_ = -1;
  uint64_t region_left_ = 0, expert_left_ = 0;
  std::unique_ptr<Xxh3_128Stream> unit_hash_, region_hash_;
  std::unique_ptr<Xxh3_64Stream> expert_hash_;
  std::mutex sync_mu_;
  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<size_t> sync_queue_;
  bool queue_done_ = false;
  std::set<size_t> early_sync_failed_;
  Status early_sync_status_;
  std::thread syncer_;
};

}  // namespace k3::prep::pack_internal
