// ParallelChunks: every chunk runs exactly once, whatever the chunk counts of consecutive runs.
// Back-to-back runs whose chunk counts grow used to let a worker still holding the previous run's
// last claim value run a chunk of the next run a second time, after which the caller waited
// forever (CI hung in a k3run test); the first test would then fail a count or hang (CTest's
// timeout reports it).
#include "k3run/kernels/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <vector>

namespace k3::kernels {
namespace {

TEST(ParallelChunks, EveryChunkOnceAcrossRunsOfVaryingSize) {
  constexpr int kRuns = 200000;
  std::vector<std::atomic<int>> count(64);
  int64_t bad_run = -1, bad_chunk = -1, bad_count = 0;
  for (int run = 0; run < kRuns && bad_run < 0; ++run) {
    // Sizes that rise and fall from run to run: 2, 9, 16, 23, 30, 37, 44, 51, 58, 1, 8, ...
    const int64_t n = 1 + (run * 7 + 1) % 60;
    for (int64_t c = 0; c < n; ++c) count[static_cast<size_t>(c)].store(0);
    ParallelChunks(2, n, [&](int64_t c) { count[static_cast<size_t>(c)].fetch_add(1); });
    for (int64_t c = 0; c < n; ++c) {
      const int got = count[static_cast<size_t>(c)].load();
      if (got != 1) {
        bad_run = run;
        bad_chunk = c;
        bad_count = got;
        break;
      }
    }
  }
  EXPECT_EQ(bad_run, -1) << "chunk " << bad_chunk << " ran " << bad_count << " times";
}

TEST(ParallelChunks, ThreeThreadsAndSingleChunkRuns) {
  std::vector<std::atomic<int>> count(40);
  for (int run = 0; run < 20000; ++run) {
    const int64_t n = run % 3 == 0 ? 1 : 1 + run % 40;
    for (int64_t c = 0; c < n; ++c) count[static_cast<size_t>(c)].store(0);
    ParallelChunks(3, n, [&](int64_t c) { count[static_cast<size_t>(c)].fetch_add(1); });
    for (int64_t c = 0; c < n; ++c) {
      ASSERT_EQ(count[static_cast<size_t>(c)].load(), 1) << "run " << run << " chunk " << c;
    }
  }
}

TEST(ParallelChunks, NoChunksRunsNothing) {
  int calls = 0;
  ParallelChunks(2, 0, [&](int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace k3::kernels
