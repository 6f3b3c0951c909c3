// Direct and batch reads: unaligned ranges through O_DIRECT, io_uring vs the pread pool,
// per-request errors.
#include "common/direct_reader.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "common/aligned_buffer.h"
#include "tests/support/fault_env.h"
#include "tests/support/temp_dir.h"

namespace k3 {
namespace {

using test::FaultEnv;
using test::FaultRule;
using test::TempDir;

std::string Pattern(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xFF);
  return s;
}

// Compares without dumping megabytes of binary on failure.
::testing::AssertionResult SameBytes(const std::string& got, const std::string& want) {
  if (got == want) return ::testing::AssertionSuccess();
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  }
  size_t i = 0;
  while (got[i] == want[i]) ++i;
  return ::testing::AssertionFailure() << "first difference at byte " << i << " of " << got.size();
}

// Ranges that start, end and sit on and off alignment boundaries, cross the bounce piece size,
// and end exactly at an unaligned end of file.
std::vector<std::pair<uint64_t, uint64_t>> Ranges(uint64_t size) {
  return {{0, 1},          {0, 4096},        {1, 4095},         {4095, 2},
          {4096, 4096},    {100, 10000},     {511, 513},        {0, size},
          {size - 1, 1},   {size - 5000, 5000}, {12345, (3u << 20) + 17}, {7, 0}};
}

// A file of a size that is not a multiple of any block size, in a directory under `parent`.
struct DirectFixture {
  explicit DirectFixture(const std::string& parent) : dir(parent) {}
  TempDir dir;
  std::string data = Pattern((5u << 20) + 333, 1);
  std::string path = dir.WriteFile("shard.bin", data);
};

void CheckDirectEqualsBuffered(const std::string& parent) {
  if (::access(parent.c_str(), W_OK) != 0) GTEST_SKIP() << parent << " is not writable";
  DirectFixture fx(parent);
  Env* env = Env::Default();
  const uint32_t align = env->DirectAlignment(fx.path);
  if (align == 0) GTEST_SKIP() << "the file system under " << parent << " has no O_DIRECT";
  auto f = env->Open(fx.path, OpenMode::kReadDirect);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  if (!(*f)->direct()) GTEST_SKIP() << "O_DIRECT open refused (EINVAL) under " << parent;
  for (auto [off, len] : Ranges(fx.data.size())) {
    std::string got(len + 1, '\0');
    // dst + 1: an unaligned destination must work too.
    Status s = DirectRead(f->get(), align, off, len, got.data() + 1);
    ASSERT_TRUE(s.ok()) << s.ToString() << " at " << off << "+" << len;
    EXPECT_TRUE(SameBytes(got.substr(1), fx.data.substr(off, len))) << "at " << off << "+" << len;
  }
  // The aligned fast path straight into an aligned buffer.
  auto buf = AlignedBuffer::Allocate(1u << 20, align);
  ASSERT_TRUE(buf.ok());
  ASSERT_TRUE(DirectRead(f->get(), align, 4096 * 3, 1u << 20, buf->data()).ok());
  EXPECT_TRUE(SameBytes(std::string(reinterpret_cast<const char*>(buf->data()), 1u << 20),
                        fx.data.substr(4096 * 3, 1u << 20)));
}

TEST(DirectRead, UnalignedRangesEqualBufferedReadsUnderTmp) { CheckDirectEqualsBuffered("/tmp"); }

TEST(DirectRead, UnalignedRangesEqualBufferedReadsUnderWork) {
  CheckDirectEqualsBuffered("/work");
}

TEST(DirectRead, PastEndOfFileNamesFileAndOffset) {
  DirectFixture fx("/tmp");
  Env* env = Env::Default();
  const uint32_t align = std::max<uint32_t>(env->DirectAlignment(fx.path), 1);
  auto f = env->Open(fx.path, OpenMode::kReadDirect);
  ASSERT_TRUE(f.ok());
  const uint64_t size = fx.data.size();
  std::string got(200, '\0');
  Status s = DirectRead(f->get(), align, size - 100, 200, got.data());
  EXPECT_EQ(s.code(), Code::kIo);
  EXPECT_NE(s.message().find(fx.path + ": premature end of file at byte offset " +
                             std::to_string(size)),
            std::string::npos)
      << s.message();
}

TEST(DirectRead, BufferedFileIgnoresAlignment) {
  DirectFixture fx("/tmp");
  auto f = Env::Default()->Open(fx.path, OpenMode::kRead);
  ASSERT_TRUE(f.ok());
  std::string got(999, '\0');
  ASSERT_TRUE(DirectRead(f->get(), 4096, 3, 999, got.data()).ok());
  EXPECT_EQ(got, fx.data.substr(3, 999));
}

// Many requests over two files, mixed direct/buffered, random offsets and lengths.
struct BatchFixture {
  TempDir dir;
  std::string a = Pattern((3u << 20) + 1, 2);
  std::string b = Pattern(777777, 3);
  std::string path_a = dir.WriteFile("a.bin", a);
  std::string path_b = dir.WriteFile("b.bin", b);
};

std::vector<std::string> RunBatch(BatchReader* reader, File* fa, File* fb, const BatchFixture& fx,
                                  std::vector<ReadRequest>* reqs_out) {
  std::mt19937_64 rng(42);
  std::vector<ReadRequest> reqs;
  std::vector<std::string> bufs(64);
  for (size_t i = 0; i < bufs.size(); ++i) {
    const bool use_a = (i % 3) != 0;
    const uint64_t size = use_a ? fx.a.size() : fx.b.size();
    const uint64_t len =
        (i == 5) ? size : std::min<uint64_t>(size, rng() % (i % 4 == 0 ? (2u << 20) : 9000));
    const uint64_t off = rng() % (size - len + 1);
    bufs[i].assign(len, '\0');
    reqs.push_back(ReadRequest{use_a ? fa : fb, off, len, bufs[i].data(), Status()});
  }
  Status s = reader->ReadAll(reqs);
  EXPECT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::string& src = reqs[i].file == fa ? fx.a : fx.b;
    EXPECT_TRUE(reqs[i].status.ok()) << i << ": " << reqs[i].status.ToString();
    EXPECT_TRUE(SameBytes(bufs[i], src.substr(reqs[i].offset, reqs[i].length))) << "request " << i;
  }
  if (reqs_out) *reqs_out = reqs;
  return bufs;
}

std::unique_ptr<BatchReader> UringOrSkip(int depth) {
  auto reader = BatchReader::Create(depth);
  if (reader->backend() != "io_uring") return nullptr;
  return reader;
}

TEST(BatchReader, IoUringAndPreadPoolGiveIdenticalBytes) {
  BatchFixture fx;
  Env* env = Env::Default();
  auto uring = UringOrSkip(16);
  if (!uring) GTEST_SKIP() << "io_uring unavailable: " << BatchReader::Create(16)->backend();
  auto pool = BatchReader::Create(16, /*force_pread=*/true);
  EXPECT_EQ(pool->backend(), "pread-pool");
  EXPECT_EQ(uring->queue_depth(), 16);
  for (OpenMode mode : {OpenMode::kRead, OpenMode::kReadDirect}) {
    auto fa = env->Open(fx.path_a, mode);
    auto fb = env->Open(fx.path_b, mode);
    ASSERT_TRUE(fa.ok() && fb.ok());
    ASSERT_GE((*fa)->fd(), 0);
    auto from_uring = RunBatch(uring.get(), fa->get(), fb->get(), fx, nullptr);
    auto from_pool = RunBatch(pool.get(), fa->get(), fb->get(), fx, nullptr);
    ASSERT_EQ(from_uring.size(), from_pool.size());
    for (size_t i = 0; i < from_uring.size(); ++i) {
      EXPECT_TRUE(SameBytes(from_uring[i], from_pool[i])) << "request " << i;
    }
  }
}

TEST(BatchReader, QueueDepthOneStillReadsEverything) {
  BatchFixture fx;
  auto reader = BatchReader::Create(1);
  auto fa = Env::Default()->Open(fx.path_a, OpenMode::kReadDirect);
  auto fb = Env::Default()->Open(fx.path_b, OpenMode::kRead);
  ASSERT_TRUE(fa.ok() && fb.ok());
  RunBatch(reader.get(), fa->get(), fb->get(), fx, nullptr);
}

TEST(BatchReader, FilesWithoutDescriptorUsePRead) {
  BatchFixture fx;
  FaultEnv env;
  env.SetRule(fx.dir.path(), FaultRule::ShortReads(1000));  // short reads too
  for (bool force : {false, true}) {
    auto reader = BatchReader::Create(8, force);
    auto fa = env.Open(fx.path_a, OpenMode::kReadDirect);
    auto fb = env.Open(fx.path_b, OpenMode::kRead);
    ASSERT_TRUE(fa.ok() && fb.ok());
    ASSERT_EQ((*fa)->fd(), -1);
    RunBatch(reader.get(), fa->get(), fb->get(), fx, nullptr);
  }
}

// One request hits EIO: it reports the error (path and offset), every other request succeeds.
void CheckEioIsolated(bool force_pread) {
  BatchFixture fx;
  FaultEnv faulty;
  faulty.SetRule(fx.path_b, FaultRule::EioAt(500000));
  auto reader = BatchReader::Create(4, force_pread);
  auto fa = Env::Default()->Open(fx.path_a, OpenMode::kReadDirect);  // real descriptor
  auto fb = faulty.Open(fx.path_b, OpenMode::kRead);
  ASSERT_TRUE(fa.ok() && fb.ok());
  std::string x(100000, '\0'), y(1000, '\0'), z(3000, '\0'), w(5000, '\0');
  std::vector<ReadRequest> reqs = {
      {fa->get(), 10, x.size(), x.data(), Status()},
      {fb->get(), 499500, y.size(), y.data(), Status()},  // covers 500000
      {fb->get(), 0, z.size(), z.data(), Status()},
      {fa->get(), (3u << 20) - 4999, w.size(), w.data(), Status()},
  };
  Status s = reader->ReadAll(reqs);
  EXPECT_EQ(s.code(), Code::kIo);
  EXPECT_TRUE(reqs[0].status.ok()) << reqs[0].status.ToString();
  EXPECT_EQ(reqs[1].status.message(),
            fx.path_b + ": read at byte offset 500000 failed: Input/output error");
  EXPECT_TRUE(reqs[2].status.ok());
  EXPECT_TRUE(reqs[3].status.ok());
  EXPECT_TRUE(SameBytes(x, fx.a.substr(10, x.size())));
  EXPECT_TRUE(SameBytes(z, fx.b.substr(0, z.size())));
  EXPECT_TRUE(SameBytes(w, fx.a.substr((3u << 20) - 4999, w.size())));
}

TEST(BatchReader, EioRequestFailsAloneThroughIoUring) { CheckEioIsolated(false); }
TEST(BatchReader, EioRequestFailsAloneThroughPreadPool) { CheckEioIsolated(true); }

// A request past end of file on a real descriptor: the kernel path must report premature EOF.
void CheckEofIsolated(bool force_pread) {
  BatchFixture fx;
  auto reader = BatchReader::Create(4, force_pread);
  for (OpenMode mode : {OpenMode::kRead, OpenMode::kReadDirect}) {
    auto fb = Env::Default()->Open(fx.path_b, mode);
    ASSERT_TRUE(fb.ok());
    std::string ok(4096, '\0'), bad(5000, '\0');
    std::vector<ReadRequest> reqs = {
        {fb->get(), 0, ok.size(), ok.data(), Status()},
        {fb->get(), fx.b.size() - 1000, bad.size(), bad.data(), Status()},
    };
    EXPECT_FALSE(reader->ReadAll(reqs).ok());
    EXPECT_TRUE(reqs[0].status.ok());
    EXPECT_TRUE(SameBytes(ok, fx.b.substr(0, ok.size())));
    EXPECT_NE(reqs[1].status.message().find(fx.path_b + ": premature end of file at byte offset " +
                                            std::to_string(fx.b.size())),
              std::string::npos)
        << reqs[1].status.message();
  }
}

TEST(BatchReader, PrematureEofReportedThroughIoUring) {
  if (!UringOrSkip(4)) GTEST_SKIP() << "io_uring unavailable";
  CheckEofIsolated(false);
}
TEST(BatchReader, PrematureEofReportedThroughPreadPool) { CheckEofIsolated(true); }

// on_done: each request is told exactly once, before ReadAll returns, and at that moment its
// status is final and (when ok) its bytes are all in place. Requests cut into many pieces, a
// failing request, a zero-length one, an invalid one and files without a descriptor included.
void CheckRequestDone(bool force_pread, bool fault_files) {
  BatchFixture fx;
  FaultEnv faulty;
  faulty.SetRule(fx.path_b, FaultRule::EioAt(500000));
  // 64 KiB pieces: the 300 KB requests finish piece by piece, possibly on different threads.
  auto reader = BatchReader::Create(4, force_pread, 4096, 64 << 10);
  auto fa = fault_files ? faulty.Open(fx.path_a, OpenMode::kReadDirect)
                        : Env::Default()->Open(fx.path_a, OpenMode::kReadDirect);
  auto fb = faulty.Open(fx.path_b, OpenMode::kRead);
  ASSERT_TRUE(fa.ok() && fb.ok());
  std::vector<std::string> bufs = {std::string(300000, '\0'), std::string(1000, '\0'),
                                   std::string(300001, '\0'), std::string(0, '\0'),
                                   std::string(4096, '\0'), std::string(8, '\0')};
  std::vector<ReadRequest> reqs = {
      {fa->get(), 10, bufs[0].size(), bufs[0].data(), Status()},
      {fb->get(), 499500, bufs[1].size(), bufs[1].data(), Status()},  // EIO at 500000
      {fa->get(), 4096, bufs[2].size(), bufs[2].data(), Status()},
      {fa->get(), 7, 0, nullptr, Status()},                            // zero length
      {fb->get(), 0, bufs[4].size(), bufs[4].data(), Status()},
      {fa->get(), 0, bufs[5].size(), nullptr, Status()},               // no destination
  };
  std::mutex mu;
  std::vector<int> told(reqs.size(), 0);
  std::vector<std::string> status_then(reqs.size());
  std::vector<char> bytes_then(reqs.size(), 0);
  const Status s = reader->ReadAll(reqs, [&](size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    ++told[i];
    status_then[i] = reqs[i].status.ToString();
    const std::string& src = reqs[i].file == fa->get() ? fx.a : fx.b;
    bytes_then[i] = reqs[i].dst != nullptr &&
                    std::string(static_cast<const char*>(reqs[i].dst), reqs[i].length) ==
                        src.substr(reqs[i].offset, reqs[i].length);
  });
  EXPECT_EQ(s.code(), Code::kIo) << s.ToString();  // the first failure in request order
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(told[i], 1) << "request " << i;
    EXPECT_EQ(status_then[i], reqs[i].status.ToString()) << "request " << i;
    EXPECT_EQ(bytes_then[i] != 0, reqs[i].status.ok() && reqs[i].length > 0) << "request " << i;
  }
  EXPECT_EQ(reqs[1].status.code(), Code::kIo);
  EXPECT_EQ(reqs[5].status.code(), Code::kInvalid);
  EXPECT_TRUE(reqs[0].status.ok() && reqs[2].status.ok() && reqs[3].status.ok() &&
              reqs[4].status.ok());
}

TEST(BatchReader, RequestDoneOncePerRequestWithFinalStatusThroughIoUring) {
  if (!UringOrSkip(4)) GTEST_SKIP() << "io_uring unavailable";
  CheckRequestDone(false, false);
}
TEST(BatchReader, RequestDoneOncePerRequestWithFinalStatusThroughPreadPool) {
  CheckRequestDone(true, false);
}
TEST(BatchReader, RequestDoneOncePerRequestWithFinalStatusWithoutDescriptors) {
  CheckRequestDone(false, true);
  CheckRequestDone(true, true);
}

// The point of on_done: an early request is told while later ones are still to be read. With
// one read in flight, pieces finish in request order, so requests must be told in order, each
// before the next one's first piece completes (a reader that told everything at the end would
// still tell them in order, so the bytes of the NEXT request are checked to be unread then).
void CheckToldEarly(bool force_pread) {
  BatchFixture fx;
  auto reader = BatchReader::Create(1, force_pread, 4096, 64 << 10);
  auto fa = Env::Default()->Open(fx.path_a, OpenMode::kReadDirect);
  ASSERT_TRUE(fa.ok());
  std::vector<std::string> bufs(6, std::string(200000, '\0'));
  std::vector<ReadRequest> reqs;
  for (size_t i = 0; i < bufs.size(); ++i) {
    reqs.push_back({fa->get(), 4096 * (1 + 60 * i), bufs[i].size(), bufs[i].data(), Status()});
  }
  std::vector<size_t> order;
  std::vector<char> next_untouched;
  ASSERT_TRUE(reader
                  ->ReadAll(reqs,
                            [&](size_t i) {
                              order.push_back(i);
                              if (i + 1 < bufs.size()) {
                                next_untouched.push_back(bufs[i + 1] ==
                                                         std::string(200000, '\0'));
                              }
                            })
                  .ok());
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(next_untouched, std::vector<char>(5, 1));
}

TEST(BatchReader, RequestToldBeforeLaterRequestsAreReadThroughIoUring) {
  if (!UringOrSkip(1)) GTEST_SKIP() << "io_uring unavailable";
  CheckToldEarly(false);
}
TEST(BatchReader, RequestToldBeforeLaterRequestsAreReadThroughPreadPool) { CheckToldEarly(true); }

TEST(BatchReader, EmptyBatchAndZeroLengthRequests) {
  auto reader = BatchReader::Create();
  EXPECT_TRUE(reader->ReadAll({}).ok());
  BatchFixture fx;
  auto fa = Env::Default()->Open(fx.path_a, OpenMode::kRead);
  ASSERT_TRUE(fa.ok());
  std::vector<ReadRequest> reqs = {{fa->get(), 5, 0, nullptr, Status()}};
  EXPECT_TRUE(reader->ReadAll(reqs).ok());
}

TEST(BatchReader, BackendIsNamed) {
  auto reader = BatchReader::Create();
  const std::string name(reader->backend());
  EXPECT_TRUE(name == "io_uring" || name.rfind("pread-pool", 0) == 0) << name;
  EXPECT_EQ(BatchReader::Create(3, true)->backend(), "pread-pool");
}

TEST(AlignedBuffer, IsAlignedAndRejectsNonPowerOfTwo) {
  auto b = AlignedBuffer::Allocate(10000, 4096);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 4096, 0u);
  EXPECT_EQ(b->size(), 10000u);
  EXPECT_FALSE(AlignedBuffer::Allocate(10, 48).ok());
  auto empty = AlignedBuffer::Allocate(0, 64);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->data(), nullptr);
}

}  // namespace
}  // namespace k3
