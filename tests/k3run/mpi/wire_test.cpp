// The scale-out messages (k3run/mpi/wire.h): round trips, and every malformed message refused
// with what is wrong, never read past its end.
#include "k3run/mpi/wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace k3::run::mpi {
namespace {

constexpr int64_t kLatent = 3;

Work TwoJobs() {
  Work w;
  w.layer = 7;
  w.pass = 42;
  w.jobs = {Job{5, 2}, Job{9, 1}};
  return w;
}

const std::vector<float> kRows = {1, 2, 3, 4, 5, 6, 7, 8, 9.5f};

TEST(MpiWire, WorkRoundTrip) {
  const std::vector<uint64_t> msg = EncodeWork(TwoJobs(), kRows.data(), kLatent);
  Result<Work> w = DecodeWork(msg, kLatent, "test");
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(w->layer, 7u);
  EXPECT_EQ(w->pass, 42u);
  ASSERT_EQ(w->jobs.size(), 2u);
  EXPECT_EQ(w->jobs[1].expert, 9u);
  EXPECT_EQ(w->n_rows, 3u);
  EXPECT_EQ(std::memcmp(w->rows, kRows.data(), kRows.size() * 4), 0);
  EXPECT_FALSE(w->shutdown());
}

TEST(MpiWire, ShutdownIsAWorkWithoutJobs) {
  Result<Work> w = DecodeWork(EncodeShutdown(), kLatent, "test");
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_TRUE(w->shutdown());
  EXPECT_TRUE(w->jobs.empty());
}

TEST(MpiWire, ReplyRoundTripWithFailures) {
  Reply r;
  r.layer = 3;
  r.pass = 9;
  r.n_jobs = 2;
  r.n_rows = 3;
  r.failures = {Failure{1, "layer 3 expert 9: hash mismatch"}};
  const std::vector<uint64_t> msg = EncodeReply(r, kRows.data(), kLatent);
  Result<Reply> d = DecodeReply(msg, kLatent, "test");
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->layer, 3u);
  EXPECT_EQ(d->pass, 9u);
  ASSERT_EQ(d->failures.size(), 1u);
  EXPECT_EQ(d->failures[0].job, 1u);
  EXPECT_EQ(d->failures[0].reason, "layer 3 expert 9: hash mismatch");
  EXPECT_EQ(std::memcmp(d->rows, kRows.data(), kRows.size() * 4), 0);
}

// Overwrites the byte at `at` of an encoded message.
std::vector<uint64_t> Poke(std::vector<uint64_t> msg, size_t at, unsigned char v) {
  reinterpret_cast<unsigned char*>(msg.data())[at] = v;
  return msg;
}

void ExpectWorkError(const std::vector<uint64_t>& msg, const std::string& needle) {
  Result<Work> w = DecodeWork(msg, kLatent, "rank 0");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), Code::kInvalid);
  EXPECT_NE(w.status().message().find(needle), std::string::npos) << w.status().message();
  EXPECT_NE(w.status().message().find("rank 0"), std::string::npos);
}

TEST(MpiWire, MalformedWorkIsRefused) {
  const std::vector<uint64_t> good = EncodeWork(TwoJobs(), kRows.data(), kLatent);
  ExpectWorkError({}, "ends inside magic");
  ExpectWorkError(Poke(good, 0, 'X'), "magic");
  ExpectWorkError(Poke(good, 20, 1), "reserved");
  ExpectWorkError(Poke(good, 36, 0), "job 0 has no rows");      // job 0 rows: 2 → 0
  ExpectWorkError(Poke(good, 24, 4), "jobs hold 3 rows, header says 4");
  std::vector<uint64_t> short_msg(good.begin(), good.end() - 1);
  ExpectWorkError(short_msg, "does not hold 3 rows");
  std::vector<uint64_t> long_msg = good;
  long_msg.push_back(0);
  ExpectWorkError(long_msg, "does not hold 3 rows");
  ExpectWorkError(Poke(good, 16, 200), "jobs do not fit");      // n_jobs 2 → 200
  // A work message of the other kind is not taken for one.
  Reply r;
  ExpectWorkError(EncodeReply(r, nullptr, kLatent), "not a work message");
}

TEST(MpiWire, MalformedReplyIsRefused) {
  Reply r;
  r.layer = 1;
  r.n_jobs = 1;
  r.n_rows = 1;
  r.failures = {Failure{0, "x"}};
  const std::vector<float> row = {1, 2, 3};
  const std::vector<uint64_t> good = EncodeReply(r, row.data(), kLatent);
  auto expect = [](const std::vector<uint64_t>& msg, const std::string& needle) {
    Result<Reply> d = DecodeReply(msg, kLatent, "rank 2, layer 1");
    ASSERT_FALSE(d.ok());
    EXPECT_NE(d.status().message().find(needle), std::string::npos) << d.status().message();
  };
  expect(Poke(good, 0, 'Y'), "not a reply message");
  expect(Poke(good, 20, 2), "2 failures for 1 jobs");
  expect(Poke(good, 32, 5), "names job 5");
  expect(Poke(good, 37, 0x20), "-byte reason");                 // reason length 1 → 8193
  std::vector<uint64_t> short_msg(good.begin(), good.end() - 1);
  expect(short_msg, "does not hold 1 rows");
}

}  // namespace
}  // namespace k3::run::mpi
