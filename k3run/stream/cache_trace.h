// CacheTraceWriter: the routing trace behind `k3run --dump-cache-trace DIR` so
// `scripts/cache-replay` can replay the expert cache offline and compare LRU, S3-FIFO and Belady
// (optimal) hit rates at any capacity. Format: docs/CACHE-TRACE.md.
//
// Goals: record exactly what the expert cache saw (every StreamingWeights::WillUse wave: step,
// layer, ascending expert ids) plus what is needed to replay it faithfully (shape of the model,
// the engine's slot count and policy) and the engine's own counters, so the replay can prove it
// reproduces the engine before its other numbers are believed. Recording is an append to memory
// (no I/O during generation); the file is written once, atomically, at Finish: an interrupted or
// failed run leaves no trace file that looks complete.
// Non-goals: timing, bytes, which reads failed (a run with failed expert reads cannot be
// cross-checked; the replay says so), streaming the trace to disk while running (a real-model
// run of 1,000 tokens is ~92k waves, a few MB).
// Evolution: the header carries "format" and "version"; readers reject versions they do not
// know. New header keys may be added without a version bump; readers ignore unknown keys.
// Thread safety: one thread (the model thread, like StreamingWeights).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <span>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/status.h"
#include "k3run/stream/expert_cache.h"
#include "k3run/stream/streaming_plan.h"

namespace k3::run {

inline constexpr char kCacheTraceFile[] = "cache-trace.jsonl";
inline constexpr char kCacheTraceFormat[] = "k3-cache-trace";
inline constexpr int kCacheTraceVersion = 1;

// What the replay needs besides the waves. Keys are record indices of experts.idx:
// (layer − first_dense) · n_experts + expert (DESIGN.md §5).
struct CacheTraceHeader {
  int n_layers = 0;
  int first_dense = 0;  // first MoE layer (first_k_dense_replace)
  int n_experts = 0;
  int topk = 0;
  int expert_slots = 0;  // the engine's cache capacity; its waves hold ≤ max(1, slots − 1) ids
  uint64_t expert_slot_bytes = 0;
  CachePolicy policy = CachePolicy::kS3Fifo;
  std::string prepared_dir;
};

// The header of a run of model `c` under streaming plan `plan` on `prepared_dir`.
CacheTraceHeader TraceHeaderFor(const ModelConfig& c, const StreamingPlan& plan,
                                std::string prepared_dir);

// The engine's StreamingStats at the end of the run (same meanings).
struct CacheTraceCounters {
  uint64_t requests = 0;   // distinct (layer, expert) per wave
  uint64_t true_hits = 0;  // resident before the wave's batch
  uint64_t reads = 0;      // experts read and published
  uint64_t evictions = 0;
};

class CacheTraceWriter {
 public:
  // Validates the header, creates `dir` (mkdir -p through `env`) and checks that a file can be
  // created there, so a bad --dump-cache-trace fails before generation, not after it.
  static Result<std::unique_ptr<CacheTraceWriter>> Create(Env* env, const std::string& dir,
                                                          const CacheTraceHeader& header);

  // One WillUse wave as the engine received it (ids ascending; step 0 = prefill). Appends to
  // memory only.
  void Wave(int64_t step, int layer, std::span<const int32_t> experts);
  // The engine's counters, written into the header at Finish (absent: the replay skips its
  // cross-check). Call before Finish.
  void SetEngineCounters(const CacheTraceCounters& counters);
  // Writes DIR/cache-trace.jsonl atomically (temporary name, fsync, rename). May be called again
  // after more waves; each call replaces the file with the complete trace so far.
  Status Finish();

  // DIR/cache-trace.jsonl.
  const std::string& path() const { return path_; }
  size_t waves() const { return waves_.size(); }
  // The file's bytes as Finish writes them.
  std::string Serialize() const;

 private:
  struct WaveRec {
    int64_t step;
    int32_t layer;
    size_t begin, count;  // range of ids_
  };
  CacheTraceWriter(Env* env, std::string path, const CacheTraceHeader& header)
      : env_(env), path_(std::move(path)), header_(header) {}

  Env* env_;
  std::string path_;
  CacheTraceHeader header_;
  bool have_counters_ = false;
  CacheTraceCounters counters_;
  std::vector<WaveRec> waves_;
  std::vector<int32_t> ids_;
};

}  // namespace k3::run
