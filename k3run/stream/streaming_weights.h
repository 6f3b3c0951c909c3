// StreamingWeights: a WeightSource that holds at most a StreamingPlan's bytes (DESIGN.md §7
// "Weight streaming"): pinned trunk layers (loaded at start-up) + a TrunkRing of ≥ 2 slots for
// the rest of the trunk and lm_head's chunks, an arena of whole-expert slots under LRU or
// S3-FIFO, embedding rows on demand. Same bytes, same views as RamWeights (k3run/weights/weight_views.h), so
// logits are identical at every budget.
//
// Overlap: the ring's reader thread runs ahead of the forward pass in walk order (unpinned layers,
// then lm_head chunks, cyclically), so upcoming trunk layers load while a layer computes. A MoE
// wave's missing experts are reserved serially in WillUse() and read as one batch (io_uring or a
// pread pool, O_DIRECT, file-offset order) on a background thread; the model computes the shared
// expert and the latent projection meanwhile. Each expert is published as soon as its own read
// is done (Expert() waits for that read only; ExpertReady() asks without waiting), so the model
// computes the first experts while the rest still load. Prefetch(L+1, guesses) queues up to
// `prefetch_experts` reads of the next layer's likely experts behind the batch; WillUse(L+1)
// claims those its routing picked (they count as guesses used, not as true hits) and settles the
// rest as unused.
//
// Invariants: a ring slot is not refilled while in use or before the walk consumed it
// (k3run/stream/trunk_ring.h). An expert slot is published (bound view, findable in the cache) only after its
// bytes arrived and passed BindExpert; slots of the current wave are pinned until ReleaseExperts.
// Guesses still loading stay pinned; at most prefetch_budget_ of them are in flight unclaimed, and
// waves hold ≤ slots − 1 − prefetch_budget_ experts, so Reserve always finds an unpinned slot. No
// arena slot is reused while its read is in flight (its slot stays pinned until it is bound), and
// the destructor stops the reader before the arena is freed.
// Thread safety: one model thread at a time (as WeightSource).
//
// Failures: a trunk/lm_head/embedding read failure is returned (exit 1, naming file and offset);
// an expert whose read fails (or whose hash mismatches with verify_reads) is never published: it
// is recorded in Failures(), Expert() returns nullptr for it for the rest of the run. A guess
// whose read fails before its layer claimed it is only dropped (counted in prefetch_failed): if
// the layer then picks that expert, it is read again like any miss.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/aligned_buffer.h"
#include "common/direct_reader.h"
#include "common/progress.h"
#include "k3run/stream/async_batch.h"
#include "k3run/stream/cache_trace.h"
#include "k3run/stream/expert_cache.h"
#include "k3run/stream/io_clock.h"
#include "k3run/stream/trunk_ring.h"
#include "k3run/stream/streaming_plan.h"
#include "k3run/weights/weight_views.h"
#include "k3run/weights/weights.h"

namespace k3::run {

// Guesses of the next MoE layer's experts read ahead per layer (docs/STREAMING.md "Reading
// ahead": chosen on the bench preset's budget ladder).
inline constexpr int kDefaultPrefetchExperts = 8;

struct StreamingOptions {
  bool verify_reads = false;
  bool force_pread = false;  // BatchReader without io_uring
  // Layers a forward pass walks (k3run --layers N); 0 = all. The ring reads ahead in this walk.
  int walk_layers = 0;
  // Read every routed expert into the cache at start-up (k3run --preload); requires a cache
  // that holds them all, so that "everything resident" means resident.
  bool preload_experts = false;
  // How start-up loading (pinned layers, --preload) is shown.
  ProgressMode progress = ProgressMode::kNone;
  // Records every wave (k3run --dump-cache-trace); not owned, may be null. Reading ahead is off
  // while tracing, so that the replay reproduces the engine's cache.
  CacheTraceWriter* trace = nullptr;
  // Guesses of the next layer's experts read ahead (k3run --prefetch-experts); 0 = none. Used
  // only when the cache has room for them beside a whole top-k wave, and not with
  // preload_experts (everything is resident).
  int prefetch_experts = 0;
};

struct StreamingStats {
  uint64_t expert_requests = 0;  // distinct (layer, expert) per wave
  uint64_t expert_hits = 0;      // resident before this wave's batch (true hits)
  uint64_t expert_reads = 0;     // experts read and published
  uint64_t expert_evictions = 0;
  uint64_t waves = 0;            // WillUse calls
  uint64_t ring_loads = 0;       // walk items (trunk runs, lm_head chunks) read into ring slots
  uint64_t ring_resyncs = 0;     // acquires out of walk order (aborted passes)
  uint64_t prefetches = 0;       // guesses read ahead (Prefetch)
  uint64_t prefetch_used = 0;    // requests that a guess had read or was reading
  uint64_t prefetch_failed = 0;  // guesses whose read failed before their layer's routing ran
};

class StreamingWeights final : public WeightSource {
 public:
  // `prepared` must outlive the source. Allocates the plan's buffers and loads the pinned layers.
  static Result<std::unique_ptr<StreamingWeights>> Open(Env* env, const prepared::PreparedDir* prepared,
                                                        const StreamingPlan& plan,
                                                        const StreamingOptions& options = {});
  ~StreamingWeights() override;

  Result<const ops::LayerWeights*> Layer(int layer) override;
  void ReleaseLayer(int layer) override;
  const ops::GluWeights* Expert(int layer, int expert) override;
  bool ExpertReady(int layer, int expert) override;
  void ReleaseExperts(int layer) override;
  void WillUse(int layer, std::span<const int32_t> experts) override;
  int64_t ExpertWaveSize() const override;
  int64_t PrefetchBudget(int layer) override;
  const ops::LayerWeights* HeldLayer(int layer) const override;
  void Prefetch(int layer, std::span<const int32_t> guesses) override;
  Status EmbeddingRows(const int32_t* ids, int64_t n, float* out) override;
  int64_t LmHeadChunkRows() const override;
  Result<kernels::Matrix> LmHeadRows(int64_t begin, int64_t n) override;
  Result<const HeadWeights*> Head() override;
  void LmHeadDone() override;
  ReadCounters Counters() const override { return counters_; }
  SourceCounters Source() const override;
  const std::vector<ExpertFailure>& Failures() const override { return failures_; }
  uint64_t PlannedResidentBytes() const override { return plan_.bytes(); }
  void SetStep(int64_t step) override { step_ = step; }

  StreamingStats stats() const;
  std::string_view reader_backend() const { return batch_->backend(); }
  const StreamingPlan& plan() const { return plan_; }
  // Whether the expert currently sits in the cache (tests pick a routed expert with it).
  bool Resident(int layer, int expert) const;

 private:
  struct Held;
  // Why an expert's read was issued, which decides what its arrival counts as.
  enum class ReadKind {
    kRouted,  // its layer's routing picked it (a miss, or a guess the routing claimed)
    kGuess,   // read ahead on a guess; its layer's routing has not run yet
    kUnused,  // read ahead on a guess that its layer's routing did not pick
  };
  // An expert read submitted and not yet bound. Its slot is reserved and pinned.
  struct InFlightRead {
    int layer;
    int32_t expert;
    int slot;
    const prepared::ExpertRecord* rec;
    uint64_t ticket;  // in batch_
    ReadKind kind;
  };
  StreamingWeights(Env* env, const prepared::PreparedDir* prepared, const StreamingPlan& plan,
                   const StreamingOptions& options);
  Status Init();
  Status StartRing();
  Status PreloadExperts();
  Status ReadRun(const prepared::TrunkRun& run, uint8_t* dst);
  Result<File*> ExpertFile(uint32_t file_id);
  // Reserves slots and submits one batch (file-offset order).
  void LoadExperts(int layer, const std::vector<int32_t>& experts, ReadKind kind);
  void Reap();     // binds every read in flight that has arrived; never waits
  void Bind(uint64_t key, Status read_status);
  void SettleGuesses();  // the current guesses not claimed by their layer count as unused
  void Fail(int layer, int32_t expert, const std::string& why);
  bool Valid(int layer, int expert) const;
  uint64_t Key(int layer, int expert) const;  // the expert's record index (the cache key)

  Env* env_;
  const prepared::PreparedDir* prepared_;
  StreamingPlan plan_;
  StreamingOptions options_;
  ops::Dims dims_;
  std::unique_ptr<BatchReader> reader_;
  std::unique_ptr<File> trunk_, resident_;
  std::vector<std::unique_ptr<File>> expert_files_;
  std::unique_ptr<File> resident_direct_;  // lm_head chunks through the ring
  std::vector<std::unique_ptr<Held>> pinned_;  // [n_layers], null when not pinned
  IoClock io_clock_;
  double io_wait_ = 0;  // seconds the engine thread spent blocked on reads
  std::unique_ptr<TrunkRing> ring_;
  std::vector<int> ring_pos_;               // [n_layers]: walk position, −1 when pinned/unwalked
  std::vector<LayerView> ring_views_;       // [ring slots]
  int64_t lm_first_pos_ = -1;               // walk position of lm_head chunk 0
  int64_t lm_held_chunk_ = -1;              // chunk in use (acquired), −1 none
  std::unique_ptr<AsyncBatch> batch_;
  std::unordered_map<uint64_t, InFlightRead> in_flight_;  // by key
  int prefetch_budget_ = 0;  // guesses that may be in flight unclaimed at once
  // The current guesses: their layer, and the keys read for it (in flight or bound) that its
  // routing has not claimed or settled yet.
  int guess_layer_ = -1;
  std::unordered_set<uint64_t> guessed_;
  // Guess rounds in a row whose every guess was resident or loading already: the cache holds
  // what routing wants (e.g. a budget that fits every expert, warmed up), so ranking guesses
  // would cost a router product per layer for nothing. From kQuietRounds on, PrefetchBudget
  // answers 0 except to every kProbeEvery-th ask, which checks whether that is still so.
  static constexpr int kQuietRounds = 64;
  static constexpr uint64_t kProbeEvery = 16;
  int quiet_rounds_ = 0;
  uint64_t quiet_asks_ = 0;
  int64_t step_ = 0;
  ExpertCache cache_;
  AlignedBuffer pinned_arena_;  // the pinned layers' runs, each at a kRunAlign offset
  AlignedBuffer arena_;
  std::vector<ops::GluWeights> slot_views_;
  std::unordered_set<uint64_t> failed_;  // record indices that could not be used
  AlignedBuffer lm_head_;
  kernels::Matrix lm_head_matrix_{};
  const prepared::Region* lm_region_ = nullptr;
  HeadCache head_;
  ReadCounters counters_;
  StreamingStats stats_;
  std::vector<ExpertFailure> failures_;
};

}  // namespace k3::run
