// AsyncBatch (k3run/stream/async_batch.h): Submit/Take hands back every request with its own status, a
// failing request does not stop the others, batches queue behind one another (tickets count on,
// a taken request is forgotten), and the destructor waits for every batch in flight (they write
// into caller memory).
#include "k3run/stream/async_batch.h"

#include <gmock/gmock.h>
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

std::string Pattern(size_t n, int salt) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 29 + size_t(salt) * 101 + 3) & 0xFF);
  return s;
}

using test::MemFile;

ReadRequest Req(File* f, uint64_t offset, uint64_t length, std::string* dst) {
  dst->assign(length, '\0');
  ReadRequest r;
  r.file = f;
  r.offset = offset;
  r.length = length;
  r.dst = dst->data();
  return r;
}

class AsyncBatchTest : public ::testing::TestWithParam<bool> {};  // force_pread

// Takes tickets first … first + n − 1 in order; their statuses.
std::vector<Status> TakeAll(AsyncBatch* batch, uint64_t first, size_t n, double* waited = nullptr) {
  std::vector<Status> out;
  for (uint64_t t = first; t < first + n; ++t) out.push_back(batch->Take(t, waited));
  return out;
}

TEST_P(AsyncBatchTest, TakeReturnsEveryRequestWithItsOwnStatus) {
  MemFile a("/mem/a.bin", Pattern(50000, 1)), b("/mem/b.bin", Pattern(9000, 2));
  AsyncBatch batch(nullptr, GetParam());
  EXPECT_FALSE(batch.pending());
  std::string d0, d1, d2;
  std::vector<ReadRequest> reqs = {Req(&a, 100, 4096, &d0), Req(&b, 7, 1234, &d1),
                                   Req(&a, 40000, 10000, &d2)};
  const uint64_t first = batch.Submit(std::move(reqs));
  EXPECT_TRUE(batch.pending());
  double waited = 1000.0;
  const std::vector<Status> done = TakeAll(&batch, first, 3, &waited);
  EXPECT_FALSE(batch.pending());
  EXPECT_GE(waited, 1000.0) << "Take adds its wait to *waited; it must not reset it";
  for (const Status& st : done) EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(d0, a.data().substr(100, 4096));
  EXPECT_EQ(d1, b.data().substr(7, 1234));
  EXPECT_EQ(d2, a.data().substr(40000, 10000));
}

// One request hits EIO and one runs past the end of its file: both fail with a status naming
// the file and offset; the requests around them still arrive intact.
TEST_P(AsyncBatchTest, FailingRequestsDoNotStopTheOthers) {
  test::TempDir dir;
  const std::string data = Pattern(30000, 3);
  const std::string path = dir.WriteFile("experts.bin", data);
  test::FaultEnv env;
  env.SetRule(path, test::FaultRule::EioAt(10000 + 5));
  Result<std::unique_ptr<File>> f = env.Open(path, OpenMode::kRead);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  AsyncBatch batch(nullptr, GetParam());
  std::string d0, d1, d2, d3;
  const uint64_t first =
      batch.Submit({Req(f->get(), 0, 5000, &d0), Req(f->get(), 10000, 5000, &d1),
                    Req(f->get(), 20000, 5000, &d2), Req(f->get(), 28000, 5000, &d3)});
  const std::vector<Status> done = TakeAll(&batch, first, 4);
  EXPECT_TRUE(done[0].ok()) << done[0].ToString();
  EXPECT_TRUE(done[2].ok()) << done[2].ToString();
  EXPECT_EQ(d0, data.substr(0, 5000));
  EXPECT_EQ(d2, data.substr(20000, 5000));
  ASSERT_FALSE(done[1].ok()) << "the EIO request must fail";
  EXPECT_EQ(done[1].code(), Code::kIo);
  EXPECT_NE(done[1].message().find(path), std::string::npos) << done[1].message();
  EXPECT_NE(done[1].message().find("byte offset 10005"), std::string::npos)
      << done[1].message();
  ASSERT_FALSE(done[3].ok()) << "a request past the end of the file must fail";
  EXPECT_NE(done[3].message().find("premature end of file at byte offset 30000"),
            std::string::npos)
      << done[3].message();
}

// A request without a destination is refused on its own; the batch still reads the rest.
TEST_P(AsyncBatchTest, MalformedRequestFailsAlone) {
  MemFile a("/mem/a.bin", Pattern(8192, 4));
  AsyncBatch batch(nullptr, GetParam());
  std::string d0, d2;
  ReadRequest bad;
  bad.file = &a;
  bad.offset = 0;
  bad.length = 16;
  const uint64_t first = batch.Submit({Req(&a, 0, 100, &d0), bad, Req(&a, 5000, 100, &d2)});
  const std::vector<Status> done = TakeAll(&batch, first, 3);
  EXPECT_TRUE(done[0].ok());
  EXPECT_EQ(done[1].code(), Code::kInvalid) << done[1].ToString();
  EXPECT_TRUE(done[2].ok());
  EXPECT_EQ(d2, a.data().substr(5000, 100));
}

// Batches follow one another, tickets counting on; an empty batch leaves nothing pending.
TEST_P(AsyncBatchTest, SuccessiveBatchesAndEmptyBatch) {
  MemFile a("/mem/a.bin", Pattern(20000, 5));
  AsyncBatch batch(nullptr, GetParam());
  for (int i = 0; i < 5; ++i) {
    std::string d;
    EXPECT_EQ(batch.Submit({Req(&a, uint64_t(i) * 1000, 3000, &d)}), uint64_t(i));
    const Status st = batch.Take(uint64_t(i), nullptr);
    EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(d, a.data().substr(uint64_t(i) * 1000, 3000)) << "batch " << i;
  }
  EXPECT_EQ(batch.Submit({}), 5u);
  EXPECT_FALSE(batch.pending());
  std::string d;
  EXPECT_EQ(batch.Submit({Req(&a, 0, 10, &d)}), 5u) << "an empty batch takes no ticket";
  EXPECT_TRUE(batch.Take(5, nullptr).ok());
  EXPECT_FALSE(batch.pending());
}

// A batch submitted while another is still reading queues behind it: its tickets follow on, its
// requests are read only after the first batch's (FIFO, so a guess queued behind a layer's batch
// never delays it), each is handed over by its own ticket, and a taken ticket is forgotten.
TEST_P(AsyncBatchTest, BatchesQueueBehindOneStillReading) {
  MemFile a("/mem/a.bin", Pattern(40000, 11));
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, open = false;
  std::vector<uint64_t> order;  // offsets in the order their reads started
  a.on_read = [&](uint64_t offset, size_t) {
    std::unique_lock<std::mutex> lk(mu);
    order.push_back(offset);
    if (offset == 0) {  // the first batch's first request waits for the gate (10 s at most)
      entered = true;
      cv.notify_all();
      if (!cv.wait_for(lk, std::chrono::seconds(10), [&] { return open; })) {
        return Status::Io("gate never opened");
      }
    }
    return Status::Ok();
  };
  AsyncBatch batch(nullptr, GetParam());
  std::string d0, d1, d2, d3;
  EXPECT_EQ(batch.Submit({Req(&a, 0, 1000, &d0), Req(&a, 5000, 1000, &d1)}), 0u);
  EXPECT_EQ(batch.Submit({Req(&a, 20000, 1000, &d2), Req(&a, 30000, 1000, &d3)}), 2u);
  EXPECT_TRUE(batch.pending());
  {
    // Both batches are queued and the first one's first read is held at the gate: whatever
    // the second batch could do before the first finishes, it has had every chance to start.
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(10), [&] { return entered; }))
        << "the first batch's read never started";
  }
  EXPECT_FALSE(batch.Arrived(2)) << "the second batch ran ahead of the first";
  EXPECT_FALSE(batch.Arrived(3));
  {
    std::lock_guard<std::mutex> lk(mu);
    open = true;
  }
  cv.notify_all();
  EXPECT_TRUE(batch.Take(3, nullptr).ok());
  EXPECT_EQ(d3, a.data().substr(30000, 1000));
  EXPECT_FALSE(batch.Arrived(3)) << "a taken request is forgotten";
  EXPECT_EQ(batch.Take(3, nullptr).code(), Code::kInvalid) << "a ticket is taken once";
  EXPECT_TRUE(batch.Take(0, nullptr).ok());
  EXPECT_EQ(d0, a.data().substr(0, 1000));
  EXPECT_TRUE(batch.pending()) << "tickets 1 and 2 are not taken yet";
  const std::vector<Status> rest = TakeAll(&batch, 1, 2);
  EXPECT_TRUE(rest[0].ok() && rest[1].ok());
  EXPECT_EQ(d1, a.data().substr(5000, 1000));
  EXPECT_EQ(d2, a.data().substr(20000, 1000));
  EXPECT_FALSE(batch.pending());
  {
    std::lock_guard<std::mutex> lk(mu);
    ASSERT_EQ(order.size(), 4u) << "every request is taken: every read has started";
    // Within a batch the pread pool reads requests concurrently (in either order); the second
    // batch's reads all start after the first batch's.
    const std::vector<uint64_t> first(order.begin(), order.begin() + 2);
    const std::vector<uint64_t> second(order.begin() + 2, order.end());
    EXPECT_THAT(first, ::testing::UnorderedElementsAre(0u, 5000u))
        << "the second batch started before the first finished";
    EXPECT_THAT(second, ::testing::UnorderedElementsAre(20000u, 30000u));
  }
  EXPECT_EQ(batch.Submit({Req(&a, 100, 10, &d0)}), 4u) << "tickets count on";
  EXPECT_TRUE(batch.Take(4, nullptr).ok());
}

// Many batches, each taken request by request as the engine does, while later ones are
// submitted: every byte arrives and the queue drains (nothing pending at the end).
TEST_P(AsyncBatchTest, TakingEveryRequestDrainsAQueueThatNeverEmpties) {
  MemFile a("/mem/a.bin", Pattern(64 * 512, 12));
  AsyncBatch batch(nullptr, GetParam());
  std::vector<std::string> dst(64);
  std::vector<uint64_t> tickets;
  for (int b = 0; b < 16; ++b) {
    std::vector<ReadRequest> reqs;
    for (int i = 0; i < 4; ++i) {
      const int k = b * 4 + i;
      reqs.push_back(Req(&a, uint64_t(k) * 512, 512, &dst[size_t(k)]));
    }
    const uint64_t first = batch.Submit(std::move(reqs));
    for (uint64_t t = first; t < first + 4; ++t) tickets.push_back(t);
    if (b >= 1) {  // take the previous batch while this one is queued
      for (int i = 0; i < 4; ++i) {
        ASSERT_TRUE(batch.Take(tickets[size_t((b - 1) * 4 + i)], nullptr).ok());
      }
    }
  }
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(batch.Take(tickets[size_t(60 + i)], nullptr).ok());
  EXPECT_FALSE(batch.pending());
  for (int k = 0; k < 64; ++k) {
    EXPECT_EQ(dst[size_t(k)], a.data().substr(size_t(k) * 512, 512)) << "request " << k;
  }
}

// A fake steady clock for IoClock: it moves only when a test advances it.
std::atomic<int64_t> fake_now_us{0};
IoClock::clock::time_point FakeNow() {
  return IoClock::clock::time_point(std::chrono::microseconds(fake_now_us.load()));
}

// The I/O clock is busy while a batch reads (the report's I/O share comes from it): exactly the
// time that passes inside the read, none of the time before or after it.
TEST_P(AsyncBatchTest, ClockCountsTheBatch) {
  fake_now_us = 1000000;
  MemFile a("/mem/a.bin", Pattern(4096, 6));
  a.on_read = [](uint64_t, size_t) {
    fake_now_us += 5000;  // the read takes 5 ms of fake time
    return Status::Ok();
  };
  IoClock clock(&FakeNow);
  std::string d;
  {
    AsyncBatch batch(&clock, GetParam());
    fake_now_us += 7000;  // before the batch: not I/O
    EXPECT_EQ(clock.BusySeconds(), 0.0);
    EXPECT_TRUE(batch.Take(batch.Submit({Req(&a, 0, 4096, &d)}), nullptr).ok());
  }  // the destructor waits until the batch thread is done with the batch (clock stopped)
  fake_now_us += 3000;  // after it: not I/O either
  EXPECT_DOUBLE_EQ(clock.BusySeconds(), 0.005);
  EXPECT_EQ(d, a.data());
}

// Take/Arrived hand the engine each request as soon as it is done, while a later request of the
// same batch is still blocked in its read; a failing request's status comes back the same way.
TEST_P(AsyncBatchTest, EarlyRequestsArriveWhileALaterOneIsStillReading) {
  MemFile a("/mem/a.bin", Pattern(40000, 9));
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  a.on_read = [&](uint64_t offset, size_t) {
    if (offset >= 30000) return Status::Io("/mem/a.bin: injected EIO at byte offset 30000");
    if (offset < 20000) return Status::Ok();
    std::unique_lock<std::mutex> lk(mu);  // request 2 waits for the gate (10 s at most)
    if (!cv.wait_for(lk, std::chrono::seconds(10), [&] { return open; })) {
      return Status::Io("gate never opened");
    }
    return Status::Ok();
  };
  AsyncBatch batch(nullptr, GetParam());
  std::string d0, d1, d2, d3;
  batch.Submit({Req(&a, 0, 5000, &d0), Req(&a, 30000, 100, &d3), Req(&a, 10000, 5000, &d1),
                Req(&a, 20000, 5000, &d2)});
  double waited = 0;
  EXPECT_TRUE(batch.Take(0, &waited).ok());
  EXPECT_EQ(d0, a.data().substr(0, 5000));
  const Status failed = batch.Take(1, nullptr);
  EXPECT_EQ(failed.code(), Code::kIo) << failed.ToString();
  EXPECT_NE(failed.message().find("byte offset 30000"), std::string::npos) << failed.message();
  EXPECT_TRUE(batch.Take(2, nullptr).ok());
  EXPECT_EQ(d1, a.data().substr(10000, 5000));
  EXPECT_FALSE(batch.Arrived(3)) << "request 3 is still blocked in its read";
  EXPECT_TRUE(batch.pending());
  {
    std::lock_guard<std::mutex> lk(mu);
    open = true;
  }
  cv.notify_all();
  EXPECT_TRUE(batch.Take(3, nullptr).ok());
  EXPECT_EQ(d2, a.data().substr(20000, 5000));
  EXPECT_FALSE(batch.pending());
  EXPECT_FALSE(batch.Arrived(0)) << "a taken batch has nothing in flight";
}

// Destroyed with a batch pending (never taken): the destructor lets the batch finish
// writing into the caller's buffer before it returns, whether or not the batch thread had picked
// it up yet.
TEST_P(AsyncBatchTest, DestructorWaitsForPendingBatch) {
  MemFile a("/mem/a.bin", Pattern(20000, 7));
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, open = false;
  std::atomic<int> reads_done{0};
  a.on_read = [&](uint64_t, size_t) {
    std::unique_lock<std::mutex> lk(mu);
    entered = true;
    cv.notify_all();
    cv.wait(lk, [&] { return open; });
    ++reads_done;
    return Status::Ok();
  };
  std::string d;
  std::thread opener;
  {
    AsyncBatch batch(nullptr, GetParam());
    batch.Submit({Req(&a, 1000, 8000, &d)});
    opener = std::thread([&] {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait_for(lk, std::chrono::seconds(10), [&] { return entered; });
      lk.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      lk.lock();
      open = true;
      cv.notify_all();
    });
  }  // ~AsyncBatch blocks here until the opener lets the read finish
  opener.join();
  EXPECT_GE(reads_done.load(), 1);
  EXPECT_EQ(d, a.data().substr(1000, 8000)) << "the destructor returned before the batch finished";
}

// Submit then destroy at once, many times: a batch the thread had not yet picked up is still
// read (the destructor waits for it rather than stopping first).
TEST_P(AsyncBatchTest, DestructorRightAfterSubmitStillReads) {
  MemFile a("/mem/a.bin", Pattern(4096, 8));
  for (int i = 0; i < 50; ++i) {
    std::string d;
    {
      AsyncBatch batch(nullptr, GetParam());
      batch.Submit({Req(&a, 0, 4096, &d)});
    }
    ASSERT_EQ(d, a.data()) << "iteration " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, AsyncBatchTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "pread_pool" : "default";
                         });

}  // namespace
}  // namespace k3::run
