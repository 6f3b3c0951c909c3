// TrunkRing (k3run/stream/trunk_ring.h) against in-memory and fault-injecting files: walk order and
// bytes over several passes, the read-ahead bound (invariant 1), resynchronisation on an
// out-of-walk acquire (invariant 3), failed / short / truncated reads, and shutdown with a read
// in flight. No timing assertions: the read-ahead bound is observed inside the reader's own PRead
// calls; where a test needs the readers to have done all they can, it waits until they are parked
// (TrunkRing::WaitReadersParked), and reads it holds in flight are released by gates.
#include "k3run/stream/trunk_ring.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/fault_env.h"
#include "tests/support/mem_file.h"
#include "tests/support/temp_dir.h"

namespace k3::run {
namespace {

// Byte i of the test file: distinct per position, so a slot holding the wrong item (or a stale
// half-overwritten one) never compares equal.
std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + i / 251 + 7) & 0xFF);
  return s;
}

using test::MemFile;

// W = 5 items of different lengths (one shorter than a block, one not a multiple of anything)
// at unaligned offsets with gaps, so a mixed-up offset or length shows in the bytes.
struct Layout {
  std::vector<uint64_t> offsets = {0, 4096 + 17, 20000, 31000, 31003};
  std::vector<uint64_t> lengths = {4096, 1000, 8192 + 5, 3, 5000};
  uint64_t file_size() const { return offsets.back() + lengths.back() + 123; }
  uint64_t max_length() const { return 8192 + 5; }
};

std::vector<RingItem> Walk(File* f, const Layout& l) {
  std::vector<RingItem> walk;
  for (size_t i = 0; i < l.offsets.size(); ++i) {
    walk.push_back(RingItem{f, l.offsets[i], l.lengths[i], "item " + std::to_string(i)});
  }
  return walk;
}

std::unique_ptr<TrunkRing> StartRing(File* f, const Layout& l, int slots) {
  Result<std::unique_ptr<TrunkRing>> r =
      TrunkRing::Start(Walk(f, l), slots, l.max_length(), nullptr);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

// Acquires walk item `pos`, checks its bytes against the file, releases it.
void ExpectItem(TrunkRing* ring, size_t pos, const std::string& data, const Layout& l,
                bool release = true) {
  double waited = 0;
  Result<TrunkRing::Acquired> a = ring->Acquire(pos, &waited);
  ASSERT_TRUE(a.ok()) << "item " << pos << ": " << a.status().ToString();
  ASSERT_NE(a->data, nullptr);
  EXPECT_GE(a->slot, 0);
  EXPECT_LT(a->slot, ring->slots());
  EXPECT_GE(waited, 0.0);
  EXPECT_EQ(0, std::memcmp(a->data, data.data() + l.offsets[pos], l.lengths[pos]))
      << "item " << pos << " came back with the wrong bytes";
  if (release) ring->Release(pos);
}

// --- Start's rules ---------------------------------------------------------------------------

TEST(TrunkRingStart, RefusesFewerThanTwoSlots) {
  const Layout l;
  MemFile f("/mem/trunk.bin", Pattern(l.file_size()));
  Result<std::unique_ptr<TrunkRing>> r = TrunkRing::Start(Walk(&f, l), 1, l.max_length(), nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalid);
  EXPECT_NE(r.status().message().find("at least 2 slots"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("got 1 slots"), std::string::npos) << r.status().message();
}

TEST(TrunkRingStart, RefusesEmptyWalk) {
  Result<std::unique_ptr<TrunkRing>> r = TrunkRing::Start({}, 2, 4096, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalid);
  EXPECT_NE(r.status().message().find("0 items"), std::string::npos) << r.status().message();
}

TEST(TrunkRingStart, RefusesItemLargerThanSlotNamingIt) {
  const Layout l;
  MemFile f("/mem/trunk.bin", Pattern(l.file_size()));
  Result<std::unique_ptr<TrunkRing>> r =
      TrunkRing::Start(Walk(&f, l), 2, l.max_length() - 1, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalid);
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("item 2 (" + std::to_string(l.max_length()) + " bytes)"), std::string::npos)
      << m;
  EXPECT_NE(m.find(std::to_string(l.max_length() - 1) + " bytes"), std::string::npos) << m;
  EXPECT_EQ(f.reads.load(), 0) << "nothing may be read when the ring refuses to start";
}

// --- the walk ----------------------------------------------------------------------------------

class TrunkRingWalk : public ::testing::TestWithParam<int> {};

// Every acquire of a 4-pass walk gets the right bytes; the readers read the walk's items in
// sequence (a prefix of the walk, each item once per pass) and never start item s before the
// engine has begun acquiring item s − R + 1 (invariant 1). With R ≥ 3 two reader threads may
// load neighbouring items at once, so reads are matched to sequence numbers by item and pass,
// not by the order of PRead calls.
TEST_P(TrunkRingWalk, ItemsInWalkOrderWithRightBytesAndBoundedReadAhead) {
  const int R = GetParam();
  const Layout l;
  const size_t W = l.offsets.size();
  MemFile f("/mem/trunk.bin", Pattern(l.file_size()));
  std::atomic<uint64_t> acquires_started{0};
  std::mutex mu;
  std::vector<uint64_t> reads_of(W, 0);  // per item: how many times it was read
  std::vector<std::string> violations;
  f.on_read = [&](uint64_t offset, size_t) {
    const uint64_t started = acquires_started.load();
    std::lock_guard<std::mutex> lk(mu);
    size_t item = W;
    for (size_t i = 0; i < W; ++i) {
      if (l.offsets[i] == offset) item = i;
    }
    if (item == W) {
      violations.push_back("a read at offset " + std::to_string(offset) +
                           ", which starts no item (every item is one read here)");
      return Status::Ok();
    }
    const uint64_t seq = reads_of[item]++ * W + item;  // no resyncs: pass p reads seq p·W + i
    if (seq >= started + uint64_t(R)) {
      violations.push_back("item " + std::to_string(seq) + " read with only " +
                           std::to_string(started) + " acquires begun: more than R = " +
                           std::to_string(R) + " ahead");
    }
    return Status::Ok();
  };
  std::unique_ptr<TrunkRing> ring = StartRing(&f, l, R);
  ASSERT_NE(ring, nullptr);
  EXPECT_EQ(ring->slots(), R);
  EXPECT_EQ(ring->walk_size(), W);
  const int passes = 4;
  for (int p = 0; p < passes; ++p) {
    for (size_t pos = 0; pos < W; ++pos) {
      ++acquires_started;
      ExpectItem(ring.get(), pos, f.data(), l);
      // Now and then the engine lets the readers run ahead to their limit before going on.
      if (pos % 2 == 0) {
        ASSERT_TRUE(ring->WaitReadersParked(std::chrono::seconds(10))) << "a reader never parked";
      }
    }
  }
  EXPECT_EQ(ring->resyncs(), 0u);
  ring.reset();  // the readers are stopped: the counts below are final
  std::lock_guard<std::mutex> lk(mu);
  EXPECT_TRUE(violations.empty()) << violations.front();
  // What was read is a prefix of the walk's sequence: N reads cover seq 0 … N − 1, so item i
  // was read ⌈(N − i) / W⌉ times; N is at least every acquire and at most R beyond.
  uint64_t n = 0;
  for (uint64_t c : reads_of) n += c;
  EXPECT_GE(n, uint64_t(passes) * W);
  EXPECT_LE(n, uint64_t(passes) * W + uint64_t(R));
  for (size_t i = 0; i < W; ++i) {
    EXPECT_EQ(reads_of[i], n > i ? (n - i + W - 1) / W : 0)
        << "item " << i << " of " << n << " reads";
  }
}

INSTANTIATE_TEST_SUITE_P(Slots, TrunkRingWalk, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "R" + std::to_string(i.param);
                         });

// Items the engine holds are never refilled: with R = 2 and both slots held, the reader waits;
// the held bytes stay intact until released.
TEST(TrunkRingWalk, HeldItemsAreNeverOverwritten) {
  const Layout l;
  MemFile f("/mem/trunk.bin", Pattern(l.file_size()));
  std::unique_ptr<TrunkRing> ring = StartRing(&f, l, 2);
  ASSERT_NE(ring, nullptr);
  Result<TrunkRing::Acquired> a0 = ring->Acquire(0, nullptr);
  ASSERT_TRUE(a0.ok()) << a0.status().ToString();
  Result<TrunkRing::Acquired> a1 = ring->Acquire(1, nullptr);
  ASSERT_TRUE(a1.ok()) << a1.status().ToString();
  EXPECT_NE(a0->slot, a1->slot);
  // The reader has done all it will do while both slots are held.
  ASSERT_TRUE(ring->WaitReadersParked(std::chrono::seconds(10))) << "the reader never parked";
  EXPECT_EQ(ring->loads(), 2u) << "the reader loaded into a slot the engine holds";
  EXPECT_EQ(0, std::memcmp(a0->data, f.data().data() + l.offsets[0], l.lengths[0]));
  EXPECT_EQ(0, std::memcmp(a1->data, f.data().data() + l.offsets[1], l.lengths[1]));
  ring->Release(0);
  ExpectItem(ring.get(), 2, f.data(), l);
  EXPECT_EQ(0, std::memcmp(a1->data, f.data().data() + l.offsets[1], l.lengths[1]))
      << "item 1 is still held: its slot must not have been reused";
  ring->Release(1);
  ExpectItem(ring.get(), 3, f.data(), l);
  EXPECT_EQ(ring->resyncs(), 0u);
}

// --- resynchronisation (invariant 3) -----------------------------------------------------------

TEST(TrunkRingResync, OutOfOrderAcquireResyncsAndBytesStayRight) {
  const Layout l;
  MemFile f("/mem/trunk.bin", Pattern(l.file_size()));
  std::unique_ptr<TrunkRing> ring = StartRing(&f, l, 3);
  ASSERT_NE(ring, nullptr);
  ExpectItem(ring.get(), 0, f.data(), l);
  ExpectItem(ring.get(), 1, f.data(), l);
  EXPECT_EQ(ring->resyncs(), 0u);
  ExpectItem(ring.get(), 3, f.data(), l);  // skips 2 (an aborted pass)
  EXPECT_EQ(ring->resyncs(), 1u);
  for (size_t pos : {4, 0, 1, 2, 3}) ExpectItem(ring.get(), pos, f.data(), l);
  EXPECT_EQ(ring->resyncs(), 1u) << "the walk continued in order after the resync";
  ExpectItem(ring.get(), 3, f.data(), l);  // the same item again: backwards
  EXPECT_EQ(ring->resyncs(), 2u);
  ExpectItem(ring.get(), 4, f.data(), l);
  EXPECT_EQ(ring->resyncs(), 2u);
}

TEST(TrunkRingResync, FirstAcquireOutOfWalkResyncs) {
  const Layout l;
  MemFile f("/mem/trunk.bin", Pattern(l.file_size()));
  std::unique_ptr<TrunkRing> ring = StartRing(&f, l, 2);
  ASSERT_NE(ring, nullptr);
  ExpectItem(ring.get(), 2, f.data(), l);
  EXPECT_EQ(ring->resyncs(), 1u);
  for (size_t pos : {3, 4, 0, 1, 2}) ExpectItem(ring.get(), pos, f.data(), l);
  EXPECT_EQ(ring->resyncs(), 1u);
}

TEST(TrunkRingResync, AcquireOutsideWalkIsInvalid) {
  const Layout l;
  MemFile f("/mem/trunk.bin", Pattern(l.file_size()));
  std::unique_ptr<TrunkRing> ring = StartRing(&f, l, 2);
  ASSERT_NE(ring, nullptr);
  Result<TrunkRing::Acquired> a = ring->Acquire(5, nullptr);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), Code::kInvalid);
  EXPECT_NE(a.status().message().find("item 5 outside the walk of 5"), std::string::npos)
      << a.status().message();
  ExpectItem(ring.get(), 0, f.data(), l);  // the ring still works
}

// --- failures ----------------------------------------------------------------------------------

// The message of a failed item read names the file, the item, its offset and length.
void ExpectNamesItem(const Status& s, const std::string& path, const Layout& l, size_t pos) {
  EXPECT_EQ(s.code(), Code::kIo) << s.ToString();
  const std::string& m = s.message();
  EXPECT_NE(m.find(path), std::string::npos) << m;
  EXPECT_NE(m.find("item " + std::to_string(pos)), std::string::npos) << m;
  EXPECT_NE(m.find("byte offset " + std::to_string(l.offsets[pos])), std::string::npos) << m;
  EXPECT_NE(m.find("+" + std::to_string(l.lengths[pos]) + " bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("k3verify prepared"), std::string::npos) << "says what to do: " << m;
}

// A one-shot EIO on item 2: only the Acquire of item 2 fails (not 0 or 1, although the reader
// may have read 2 ahead of them); acquiring item 2 again re-reads it and succeeds.
TEST(TrunkRingFaults, OneShotEioFailsOnlyThatItemAndRetrySucceeds) {
  const Layout l;
  MemFile f("/mem/trunk.bin", Pattern(l.file_size()));
  std::atomic<int> failures_left{1};
  f.on_read = [&](uint64_t offset, size_t n) {
    const uint64_t bad = l.offsets[2] + 100;
    if (bad >= offset && bad < offset + n && failures_left.fetch_sub(1) > 0) {
      return Status::IoErrno("read", "/mem/trunk.bin", EIO, bad);
    }
    return Status::Ok();
  };
  std::unique_ptr<TrunkRing> ring = StartRing(&f, l, 3);
  ASSERT_NE(ring, nullptr);
  ExpectItem(ring.get(), 0, f.data(), l);
  ExpectItem(ring.get(), 1, f.data(), l);
  Result<TrunkRing::Acquired> a = ring->Acquire(2, nullptr);
  ASSERT_FALSE(a.ok()) << "the failed read of item 2 must reach its Acquire";
  ExpectNamesItem(a.status(), "/mem/trunk.bin", l, 2);
  EXPECT_NE(a.status().message().find("Input/output error"), std::string::npos)
      << "the OS error is kept: " << a.status().message();
  ExpectItem(ring.get(), 2, f.data(), l);  // the retry
  for (size_t pos : {3, 4, 0, 1, 2}) ExpectItem(ring.get(), pos, f.data(), l);
}

// A persistent EIO (a bad sector): every Acquire of that item fails, never hangs, and the other
// items keep coming back right.
TEST(TrunkRingFaults, PersistentEioFailsEveryAcquireOfThatItem) {
  test::TempDir dir;
  const Layout l;
  const std::string data = Pattern(l.file_size());
  const std::string path = dir.WriteFile("trunk.bin", data);
  test::FaultEnv env;
  env.SetRule(path, test::FaultRule::EioAt(l.offsets[1] + 10));
  Result<std::unique_ptr<File>> f = env.Open(path, OpenMode::kRead);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::unique_ptr<TrunkRing> ring = StartRing(f->get(), l, 2);
  ASSERT_NE(ring, nullptr);
  for (int pass = 0; pass < 2; ++pass) {
    ExpectItem(ring.get(), 0, data, l);
    Result<TrunkRing::Acquired> a = ring->Acquire(1, nullptr);
    ASSERT_FALSE(a.ok());
    ExpectNamesItem(a.status(), path, l, 1);
    a = ring->Acquire(1, nullptr);
    ASSERT_FALSE(a.ok()) << "a bad sector stays bad";
    for (size_t pos : {2, 3, 4}) ExpectItem(ring.get(), pos, data, l);
  }
}

// Short reads (the OS returning 7 bytes at a time) are looped: the bytes are right.
TEST(TrunkRingFaults, ShortReadsAreLoopedToTheRightBytes) {
  test::TempDir dir;
  const Layout l;
  const std::string data = Pattern(l.file_size());
  const std::string path = dir.WriteFile("trunk.bin", data);
  test::FaultEnv env;
  env.SetRule(path, test::FaultRule::ShortReads(7));
  Result<std::unique_ptr<File>> f = env.Open(path, OpenMode::kRead);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::unique_ptr<TrunkRing> ring = StartRing(f->get(), l, 3);
  ASSERT_NE(ring, nullptr);
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t pos = 0; pos < l.offsets.size(); ++pos) ExpectItem(ring.get(), pos, data, l);
  }
}

// The same through O_DIRECT (when the file system has it): short reads come in whole blocks and
// the unaligned items go through the bounce buffer.
TEST(TrunkRingFaults, ShortDirectReadsAreLoopedToTheRightBytes) {
  test::TempDir dir;
  const Layout l;
  const std::string data = Pattern(l.file_size());
  const std::string path = dir.WriteFile("trunk.bin", data);
  test::FaultEnv env;
  env.SetRule(path, test::FaultRule::ShortReads(4096));
  Result<std::unique_ptr<File>> f = env.Open(path, OpenMode::kReadDirect);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::unique_ptr<TrunkRing> ring = StartRing(f->get(), l, 2);
  ASSERT_NE(ring, nullptr);
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t pos = 0; pos < l.offsets.size(); ++pos) ExpectItem(ring.get(), pos, data, l);
  }
}

// A file that ends inside the last item: that item's Acquire is an I/O error naming the file and
// where the data ran out; it never hands out a slot with stale or partial bytes.
TEST(TrunkRingFaults, TruncatedFileFailsTheCutItemNeverGarbage) {
  test::TempDir dir;
  const Layout l;
  const std::string data = Pattern(l.file_size());
  const std::string path = dir.WriteFile("trunk.bin", data);
  const uint64_t cut = l.offsets[4] + l.lengths[4] / 2;
  test::FaultEnv env;
  env.SetRule(path, test::FaultRule::Truncated(cut));
  Result<std::unique_ptr<File>> f = env.Open(path, OpenMode::kRead);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::unique_ptr<TrunkRing> ring = StartRing(f->get(), l, 2);
  ASSERT_NE(ring, nullptr);
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t pos = 0; pos < 4; ++pos) ExpectItem(ring.get(), pos, data, l);
    Result<TrunkRing::Acquired> a = ring->Acquire(4, nullptr);
    ASSERT_FALSE(a.ok()) << "a truncated item must not be handed out";
    ExpectNamesItem(a.status(), path, l, 4);
    EXPECT_NE(a.status().message().find(std::to_string(cut)), std::string::npos)
        << "names where the data ran out: " << a.status().message();
  }
}

// An item entirely past the end of an in-memory file: the same error, not a zero-filled slot.
TEST(TrunkRingFaults, ItemPastEndOfFileFails) {
  const Layout l;
  MemFile f("/mem/short.bin", Pattern(l.offsets[3]));  // items 3 and 4 lie past the end
  std::unique_ptr<TrunkRing> ring = StartRing(&f, l, 2);
  ASSERT_NE(ring, nullptr);
  for (size_t pos = 0; pos < 3; ++pos) ExpectItem(ring.get(), pos, f.data(), l);
  Result<TrunkRing::Acquired> a = ring->Acquire(3, nullptr);
  ASSERT_FALSE(a.ok());
  ExpectNamesItem(a.status(), "/mem/short.bin", l, 3);
}

// --- shutdown ----------------------------------------------------------------------------------

// A read the test holds inside PRead until it says go.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, open = false;
  Status Enter() {
    std::unique_lock<std::mutex> lk(mu);
    entered = true;
    cv.notify_all();
    cv.wait(lk, [&] { return open; });
    return Status::Ok();
  }
  bool WaitEntered() {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, std::chrono::seconds(10), [&] { return entered; });
  }
  void Open() {
    std::lock_guard<std::mutex> lk(mu);
    open = true;
    cv.notify_all();
  }
};

// The destructor stops the reader after its current read: with a read blocked in PRead it
// waits for that read (no use-after-free of the slot buffers) and returns.
TEST(TrunkRingShutdown, DestructorWithReadInFlightWaitsForIt) {
  const Layout l;
  MemFile f("/mem/trunk.bin", Pattern(l.file_size()));
  Gate gate;
  std::atomic<int> finished{0};
  f.on_read = [&](uint64_t, size_t) {
    Status s = gate.Enter();
    ++finished;
    return s;
  };
  std::unique_ptr<TrunkRing> ring = StartRing(&f, l, 3);
  ASSERT_NE(ring, nullptr);
  ASSERT_TRUE(gate.WaitEntered()) << "the reader never started reading walk[0]";
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gate.Open();
  });
  ring.reset();
  opener.join();
  EXPECT_GE(finished.load(), 1);
  EXPECT_EQ(finished.load(), f.reads.load()) << "a read was abandoned half-way";
}

// Destroying the ring while the engine holds a slot, or right after a failed read, is clean.
TEST(TrunkRingShutdown, DestructorWhileHoldingSlotAndAfterFailure) {
  const Layout l;
  MemFile f("/mem/trunk.bin", Pattern(l.file_size()));
  f.on_read = [&](uint64_t offset, size_t) {
    return offset == l.offsets[1] ? Status::IoErrno("read", "/mem/trunk.bin", EIO, offset)
                                  : Status::Ok();
  };
  {
    std::unique_ptr<TrunkRing> ring = StartRing(&f, l, 2);
    ASSERT_NE(ring, nullptr);
    ExpectItem(ring.get(), 0, f.data(), l, /*release=*/false);
  }
  {
    std::unique_ptr<TrunkRing> ring = StartRing(&f, l, 2);
    ASSERT_NE(ring, nullptr);
    ExpectItem(ring.get(), 0, f.data(), l);
    EXPECT_FALSE(ring->Acquire(1, nullptr).ok());
  }
  {
    // Straight after Start: the reader is mid-way through its first reads.
    std::unique_ptr<TrunkRing> ring = StartRing(&f, l, 3);
    ASSERT_NE(ring, nullptr);
  }
}

}  // namespace
}  // namespace k3::run
