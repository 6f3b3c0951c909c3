#include "common/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <latch>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace k3 {
namespace {

TEST(ParallelFor, WorkerCountIsThreadsCappedByItemsAndAtLeastOne) {
  EXPECT_EQ(ParallelWorkers(10, 4), 4u);
  EXPECT_EQ(ParallelWorkers(3, 8), 3u);
  EXPECT_EQ(ParallelWorkers(10, 0), 1u);
  EXPECT_EQ(ParallelWorkers(10, -2), 1u);
  EXPECT_EQ(ParallelWorkers(0, 4), 0u);
}

TEST(ParallelFor, EveryItemRunsExactlyOnce) {
  constexpr size_t kItems = 1000;
  std::vector<std::atomic<int>> runs(kItems);
  ParallelFor(kItems, 4, [&](size_t i, size_t) { ++runs[i]; });
  for (size_t i = 0; i < kItems; ++i) EXPECT_EQ(runs[i].load(), 1) << i;
}

TEST(ParallelFor, NoItemsMeansNoCalls) {
  bool called = false;
  ParallelFor(0, 4, [&](size_t, size_t) { called = true; });
  EXPECT_FALSE(called);
}

TEST(ParallelFor, OneWorkerRunsItemsInOrderOnTheCallingThread) {
  std::vector<size_t> order;
  const std::thread::id caller = std::this_thread::get_id();
  bool all_on_caller = true;
  ParallelFor(5, 1, [&](size_t i, size_t worker) {
    order.push_back(i);
    all_on_caller = all_on_caller && std::this_thread::get_id() == caller && worker == 0;
  });
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(all_on_caller);
}

// Both items wait for each other: this returns only if two workers run them at the same time.
TEST(ParallelFor, WorkersRunConcurrentlyWithDistinctIds) {
  std::latch both_running(2);
  std::mutex mu;
  std::set<size_t> workers;
  std::set<std::thread::id> threads;
  ParallelFor(2, 2, [&](size_t, size_t worker) {
    both_running.arrive_and_wait();
    std::lock_guard<std::mutex> lock(mu);
    workers.insert(worker);
    threads.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(workers, (std::set<size_t>{0, 1}));
  EXPECT_EQ(threads.size(), 2u);
}

// Per-worker state indexed by the worker id needs no lock: one worker runs one item at a time.
TEST(ParallelFor, PerWorkerSlotsSumToTheTotal) {
  constexpr size_t kItems = 5000;
  const size_t workers = ParallelWorkers(kItems, 3);
  std::vector<uint64_t> sums(workers, 0);
  ParallelFor(kItems, 3, [&](size_t i, size_t worker) {
    ASSERT_LT(worker, workers);
    sums[worker] += i;
  });
  uint64_t total = 0;
  for (uint64_t s : sums) total += s;
  EXPECT_EQ(total, uint64_t{kItems} * (kItems - 1) / 2);
}

}  // namespace
}  // namespace k3
