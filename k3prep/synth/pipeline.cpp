#include "k3prep/synth/pipeline.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

namespace k3::synth {
namespace {

// A bounded hand-over between the producer thread and the consumer.
class ChunkQueue {
 public:
  // Blocks while full; returns false (dropping the chunk) once cancelled.
  bool Push(std::unique_ptr<Chunk> c) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return cancelled_ || ready_.size() < kChunksInFlight; });
    if (cancelled_) return false;
    ready_.push_back(std::move(c));
    cv_.notify_all();
    return true;
  }
  // Blocks until a chunk arrives; nullptr after Close() with nothing left.
  std::unique_ptr<Chunk> Pop() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return closed_ || !ready_.empty(); });
    if (ready_.empty()) return nullptr;
    auto c = std::move(ready_.front());
    ready_.pop_front();
    cv_.notify_all();
    return c;
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    cv_.notify_all();
  }
  void Cancel() {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    ready_.clear();
    cv_.notify_all();
  }
  bool cancelled() {
    std::lock_guard<std::mutex> lock(mu_);
    return cancelled_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Chunk>> ready_;
  bool closed_ = false;
  bool cancelled_ = false;
};

void Produce(const Layout& layout, const WeightGenerator& gen, size_t shard_begin,
             size_t shard_end, uint64_t chunk_bytes, ChunkQueue* q) {
  for (size_t s = shard_begin; s < shard_end; ++s) {
    const std::vector<Job> jobs = ShardJobs(layout, s, kMaxJobBytes);
    size_t i = 0;
    do {
      // Jobs [i, j) form the chunk: at least one, at most chunk_bytes unless one job is larger.
      size_t j = i;
      uint64_t bytes = 0;
      std::vector<uint64_t> offsets;
      // A chunk never spans two layers, so at most one layer's tensors are ever in flight.
      const int layer = layout.tensors[jobs.empty() ? 0 : jobs[i].tensor].layer;
      while (j < jobs.size() &&
             (j == i || (bytes + jobs[j].nbytes <= chunk_bytes &&
                         layout.tensors[jobs[j].tensor].layer == layer))) {
        offsets.push_back(bytes);
        bytes += jobs[j].nbytes;
        ++j;
      }
      auto chunk = std::make_unique<Chunk>();
      chunk->shard = s;
      chunk->last_in_shard = j == jobs.size();
      chunk->layer = layer;
      chunk->data.resize(bytes);
      const int64_t n = static_cast<int64_t>(j - i);
      uint8_t* base = chunk->data.data();
#pragma omp parallel for schedule(dynamic, 1)
      for (int64_t k = 0; k < n; ++k) {
        const size_t idx = static_cast<size_t>(k);
        gen.Fill(jobs[i + idx], base + offsets[idx]);
      }
      if (!q->Push(std::move(chunk))) return;
      i = j;
    } while (i < jobs.size());
  }
  q->Close();
}

}  // namespace

Status RunPipeline(const Layout& layout, const WeightGenerator& gen, size_t shard_begin,
                   size_t shard_end, uint64_t chunk_bytes,
                   const std::function<Status(const Chunk&)>& sink) {
  ChunkQueue q;
  std::thread producer(Produce, std::cref(layout), std::cref(gen), shard_begin, shard_end,
                       chunk_bytes, &q);
  Status status;
  while (auto chunk = q.Pop()) {
    status = sink(*chunk);
    if (!status.ok()) {
      q.Cancel();
      break;
    }
  }
  producer.join();
  return status;
}

}  // namespace k3::synth
