// TrunkRing: the part of the trunk that is not pinned, read through a ring of slots by a reader
// thread that runs ahead of the forward pass in walk order (DESIGN.md §7 "Weight streaming").
//
// The walk is the fixed cyclic sequence of items the engine consumes every forward pass: the
// unpinned trunk runs in layer order, then (when lm_head is not held) lm_head's chunks. Item
// number s of the whole run (its sequence number) is walk[s mod W]. The reader loads sequence
// numbers in increasing order into free slots; the engine acquires them in the same order and
// releases each when the layer (or chunk) is done. With R ≥ 3 slots two reader threads load
// consecutive items at once (one item's pieces alone do not keep a disk busy); items may then
// complete out of order, and each Acquire waits for its own.
//
// Invariants:
//  (1) a slot is refilled only after the engine released it (kConsumed) or it never held
//      anything the engine still expects: the readers never evict an item the walk needs within
//      the ring's reach, so with R slots they run at most R items ahead;
//  (2) a slot's bytes are visible to the engine only after the read completed without error
//      (kReady, published under the mutex);
//  (3) an acquire that is not the next item of the walk (an aborted forward pass, a caller that
//      skips) resynchronises: in-flight reads finish, unused read-ahead is dropped, the walk
//      restarts at the requested item. Correct, only slower.
// Failures: a failed read is returned by the Acquire that wanted it (naming file, offset,
// length); the slot is emptied and the next Acquire of the item re-reads it.
// Thread safety: Acquire/Release from one engine thread; the reader thread is internal.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/aligned_buffer.h"
#include "common/direct_reader.h"
#include "common/env.h"
#include "common/status.h"
#include "k3run/stream/io_clock.h"

namespace k3::run {

// The piece size the ring's reads are cut into (direct_reader.h): about 16 pieces per slot, so a
// single item keeps a queue of 16 busy, between 512 KiB and 4 MiB.
uint64_t RingPieceBytes(uint64_t slot_bytes);

// One item of the walk: a byte range of a file and what it is, for messages.
struct RingItem {
  File* file = nullptr;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::string what;  // "layer 7's trunk run", "lm_head rows [0, 4096)"
};

class TrunkRing {
 public:
  // Allocates `slots` buffers of `slot_bytes` (every item must fit) and starts the reader, which
  // begins loading walk[0] at once. `clock` may be null. Requires slots ≥ 2 and a non-empty walk.
  static Result<std::unique_ptr<TrunkRing>> Start(std::vector<RingItem> walk, int slots,
                                                  uint64_t slot_bytes, IoClock* clock,
                                                  bool force_pread = false);
  ~TrunkRing();  // stops the reader after its current read

  struct Acquired {
    int slot = -1;
    const uint8_t* data = nullptr;
  };
  // Blocks until walk item `pos` is loaded; its bytes stay valid until Release(pos). Adds the
  // time spent blocked to *waited_seconds.
  Result<Acquired> Acquire(size_t pos, double* waited_seconds);
  void Release(size_t pos);

  size_t walk_size() const { return walk_.size(); }
  int slots() const { return static_cast<int>(slots_.size()); }
  // Blocks until every reader is parked: it may load nothing more (no free slot, or `slots`
  // items ahead of the engine) until the engine acquires or releases. False after `timeout`.
  // For tests: what a reader does without the engine acting is then all done, no sleeping.
  bool WaitReadersParked(std::chrono::milliseconds timeout);
  uint64_t loads() const;     // items read (including read-ahead not yet consumed)
  uint64_t resyncs() const;   // out-of-walk acquires

 private:
  enum class State { kEmpty, kLoading, kReady, kFailed, kInUse, kConsumed };
  struct Slot {
    State state = State::kEmpty;
    uint64_t seq = 0;  // sequence number held (meaningful unless kEmpty)
    Status status;     // kFailed
    AlignedBuffer buf;
  };

  TrunkRing(std::vector<RingItem> walk, IoClock* clock);
  std::vector<std::unique_ptr<BatchReader>> readers_;
  void ReaderLoop(BatchReader* reader);
  Slot* SlotForSeq(uint64_t seq);
  Slot* FreeSlot();
  void ResyncLocked(size_t pos, std::unique_lock<std::mutex>& lk);

  std::vector<RingItem> walk_;
  IoClock* clock_;
  std::vector<Slot> slots_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_ = 0;      // next sequence number the reader loads
  uint64_t expected_ = 0;  // next sequence number the engine acquires
  uint64_t loads_ = 0, resyncs_ = 0;
  size_t parked_ = 0;  // readers waiting in ReaderLoop for a slot or for the engine
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace k3::run
