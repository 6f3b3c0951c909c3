#include "common/parallel.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace k3 {

size_t ParallelWorkers(size_t n, int threads) {
  return std::min<size_t>(static_cast<size_t>(std::max(threads, 1)), n);
}

void ParallelFor(size_t n, int threads, const std::function<void(size_t item, size_t worker)>& fn) {
  std::atomic<size_t> next{0};
  auto work = [&](size_t worker) {
    for (size_t i = next++; i < n; i = next++) fn(i, worker);
  };
  const size_t workers = ParallelWorkers(n, threads);
  std::vector<std::thread> spawned;
  spawned.reserve(workers > 0 ? workers - 1 : 0);
  for (size_t w = 1; w < workers; ++w) spawned.emplace_back(work, w);
  if (workers > 0) work(0);
  for (std::thread& t : spawned) t.join();
}

}  // namespace k3
