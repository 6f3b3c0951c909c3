// StreamingWeights: a WeightSource that holds at most a StreamingPlan's bytes (DESIGN.md §7
// "Weight streaming"): pinned trunk layers (loaded at start-up) + a ring of 2 slots for the rest,
// an arena of whole-expert slots under LRU or S3-FIFO, lm_head held or read in chunks, embedding
// rows on demand. Same bytes, same views as RamWeights (weight_views.h), so logits are identical.
//
// Phase 1 (this file): reads are synchronous on demand. A ring slot is filled when Layer() asks
// for it; a MoE wave's missing experts are read as one batch (BatchReader: io_uring or a pread
// pool, O_DIRECT where available, file-offset order) in WillUse(), the moment routing is known.
// Non-goals here: a reader thread running ahead of the walk and overlap accounting (phase 2).
//
// Invariants: a ring slot bound to a layer is not refilled while in use (Layer() → ReleaseLayer);
// a failed read leaves the slot empty, never half-bound. An expert slot is published (bound
// view, findable in the cache) only after its bytes arrived and passed BindExpert; slots of the
// current wave are pinned until ReleaseExperts. Waves hold ≤ slots − 1 experts, so Reserve
// always finds an unpinned slot.
// Thread safety: one model thread at a time (as WeightSource).
//
// Failures: a trunk/lm_head/embedding read failure is returned (exit 1, naming file and offset);
// an expert whose read fails (or whose hash mismatches with verify_reads) is never published: it
// is recorded in Failures(), Expert() returns nullptr for it for the rest of the run.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_set>
#include <vector>

#include "common/aligned_buffer.h"
#include "common/direct_reader.h"
#include "k3run/expert_cache.h"
#include "k3run/streaming_plan.h"
#include "k3run/weight_views.h"
#include "k3run/weights.h"

namespace k3::run {

struct StreamingOptions {
  bool verify_reads = false;
  bool force_pread = false;  // BatchReader without io_uring
};

struct StreamingStats {
  uint64_t expert_requests = 0;  // distinct (layer, expert) per wave
  uint64_t expert_hits = 0;      // resident before this wave's batch (true hits)
  uint64_t expert_reads = 0;     // experts read and published
  uint64_t expert_evictions = 0;
  uint64_t waves = 0;            // WillUse calls
  uint64_t ring_loads = 0;       // trunk runs read into a ring slot
};

class StreamingWeights final : public WeightSource {
 public:
  // `prepared` must outlive the source. Allocates the plan's buffers and loads the pinned layers.
  static Result<std::unique_ptr<StreamingWeights>> Open(Env* env, const prep::PreparedDir* prepared,
                                                        const StreamingPlan& plan,
                                                        const StreamingOptions& options = {});
  ~StreamingWeights() override;

  Result<const ops::LayerWeights*> Layer(int layer) override;
  void ReleaseLayer(int layer) override;
  const ops::GluWeights* Expert(int layer, int expert) override;
  void ReleaseExperts(int layer) override;
  void WillUse(int layer, std::span<const int32_t> experts) override;
  int64_t ExpertWaveSize() const override;
  Status EmbeddingRows(const int32_t* ids, int64_t n, float* out) override;
  int64_t LmHeadChunkRows() const override;
  Result<kernels::Matrix> LmHeadRows(int64_t begin, int64_t n) override;
  Result<const HeadWeights*> Head() override;
  ReadCounters Counters() const override { return counters_; }
  const std::vector<ExpertFailure>& Failures() const override { return failures_; }
  uint64_t PlannedResidentBytes() const override { return plan_.bytes(); }

  StreamingStats stats() const;
  const StreamingPlan& plan() const { return plan_; }
  // Whether the expert currently sits in the cache (tests pick a routed expert with it).
  bool Resident(int layer, int expert) const;

 private:
  struct Held;
  struct RingSlot;
  StreamingWeights(Env* env, const prep::PreparedDir* prepared, const StreamingPlan& plan,
                   const StreamingOptions& options);
  Status Init();
  Status ReadRun(const prep::TrunkRun& run, uint8_t* dst);
  Result<File*> ExpertFile(uint32_t file_id);
  void LoadExperts(int layer, const std::vector<int32_t>& missing);
  bool Valid(int layer, int expert) const;

  Env* env_;
  const prep::PreparedDir* prepared_;
  StreamingPlan plan_;
  StreamingOptions options_;
  ops::Dims dims_;
  std::unique_ptr<BatchReader> reader_;
  std::unique_ptr<File> trunk_, resident_;
  std::vector<std::unique_ptr<File>> expert_files_;
  std::vector<std::unique_ptr<Held>> pinned_;  // [n_layers], null when not pinned
  std::vector<std::unique_ptr<RingSlot>> ring_;
  uint64_t ring_clock_ = 0;
  ExpertCache cache_;
  AlignedBuffer arena_;
  std::vector<ops::GluWeights> slot_views_;
  std::unordered_set<uint64_t> failed_;  // record indices that could not be used
  AlignedBuffer lm_head_;
  kernels::Matrix lm_head_matrix_{};
  const prep::Region* lm_region_ = nullptr;
  HeadCache head_;
  ReadCounters counters_;
  StreamingStats stats_;
  std::vector<ExpertFailure> failures_;
};

}  // namespace k3::run
