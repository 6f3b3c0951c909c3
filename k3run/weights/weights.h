// WeightSource: the ONE interface through which the model obtains every weight of a prepared
// directory (DESIGN.md §5, §7 "Weight streaming").
//
// Goals: k3run/engine/model.cpp never knows where bytes live. It asks for a trunk layer view
// (ops::LayerWeights), a routed expert (ops::GluWeights by layer and expert), embedding rows,
// lm_head rows in chunks and the head vectors, and says when it is done with a layer. RamWeights
// (here) holds what it reads; StreamingWeights (k3run/stream/) streams within a budget through a
// ring and an expert cache behind the same interface.
// Non-goals: memory planning beyond reporting what an implementation holds; prefetch policy.
//
// Lifetimes: a LayerWeights view is valid until ReleaseLayer(layer) (RamWeights keeps every
// layer, so the release is a no-op there); an expert view until ReleaseExperts(layer); an lm_head
// chunk until the next LmHeadRows call; Head() for the source's lifetime.
// Thread safety: one model (one thread) calls a source at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/aligned_buffer.h"
#include "common/env.h"
#include "common/status.h"
#include "formats/prepared_layout.h"
#include "formats/prepared_manifest.h"
#include "k3run/ops/weights.h"

namespace k3::run {

// Trunk runs and lm_head are read into AlignedBuffer::AllocateLarge buffers (RamWeights,
// StreamingWeights): its alignment must cover the prepared format's.
static_assert(prepared::kRunAlign <= AlignedBuffer::kLargeMinAlign &&
                  prepared::kResidentAlign <= AlignedBuffer::kLargeMinAlign,
              "AllocateLarge's alignment is below the prepared format's");

// Bytes read from disk, by kind (the report's "bytes read by kind").
struct ReadCounters {
  uint64_t trunk = 0;      // trunk.bin runs
  uint64_t experts = 0;    // routed expert records
  uint64_t embedding = 0;  // embed_tokens rows
  uint64_t lm_head = 0;    // lm_head rows
  uint64_t head = 0;       // final norm and output_attn_res_* vectors
  // Expert records read ahead on a guess (WeightSource::Prefetch) that their layer's routing then
  // did not pick. Disk traffic, but not bytes the token had to read: `experts` counts the guesses
  // that were picked, and only `experts` enters the floor.
  uint64_t prefetch_unused = 0;
  uint64_t total() const { return trunk + experts + embedding + lm_head + head + prefetch_unused; }
  ReadCounters operator-(const ReadCounters& o) const {
    return {trunk - o.trunk,     experts - o.experts, embedding - o.embedding,
            lm_head - o.lm_head, head - o.head,       prefetch_unused - o.prefetch_unused};
  }
  ReadCounters& operator+=(const ReadCounters& o) {
    trunk += o.trunk;
    experts += o.experts;
    embedding += o.embedding;
    lm_head += o.lm_head;
    head += o.head;
    prefetch_unused += o.prefetch_unused;
    return *this;
  }
};

// Streaming counters besides bytes (zero for sources that do not stream).
struct SourceCounters {
  uint64_t expert_requests = 0;  // distinct (layer, expert) asked for per wave
  uint64_t expert_hits = 0;      // resident before the wave's own batch (true hits)
  double io_busy_seconds = 0;    // wall time with at least one weight read in flight
  double io_wait_seconds = 0;    // wall time the engine thread was blocked on reads
  uint64_t expert_guesses = 0;        // experts read ahead on a guess (Prefetch)
  uint64_t expert_guesses_used = 0;   // of the requests, those a guess had read or was reading
  SourceCounters operator-(const SourceCounters& o) const {
    return {expert_requests - o.expert_requests, expert_hits - o.expert_hits,
            io_busy_seconds - o.io_busy_seconds, io_wait_seconds - o.io_wait_seconds,
            expert_guesses - o.expert_guesses, expert_guesses_used - o.expert_guesses_used};
  }
  SourceCounters& operator+=(const SourceCounters& o) {
    expert_requests += o.expert_requests;
    expert_hits += o.expert_hits;
    io_busy_seconds += o.io_busy_seconds;
    io_wait_seconds += o.io_wait_seconds;
    expert_guesses += o.expert_guesses;
    expert_guesses_used += o.expert_guesses_used;
    return *this;
  }
};

// A routed expert that could not be used: the run is then invalid (exit 4), never silently.
struct ExpertFailure {
  int layer = 0;
  int expert = 0;
  std::string reason;
};

// The model-level vectors after the last layer (MODEL.md §2.1), widened to fp32.
struct HeadWeights {
  ops::Vec norm;                  // norm.weight                  [E]
  ops::Vec output_attn_res_norm;  // output_attn_res_norm.weight  [E]
  ops::Vec output_attn_res_proj;  // output_attn_res_proj.weight  [E] (on disk [1][E])
};

// The head vectors of a prepared directory, read from resident.bin on first use and kept (every
// weight source holds them the same way: they are a few hidden-sized vectors).
class HeadCache {
 public:
  Result<const HeadWeights*> Get(File* resident, const prepared::PreparedDir& p, const ops::Dims& dims,
                                 uint64_t* bytes_read);

 private:
  std::unique_ptr<HeadWeights> head_;
  std::vector<std::vector<float>> vectors_;  // the widened fp32 storage head_ points into
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;

  // Layer `layer`'s trunk weights, shape-checked against the config.
  virtual Result<const ops::LayerWeights*> Layer(int layer) = 0;
  virtual void ReleaseLayer(int layer) = 0;
  // Routed expert `expert` of MoE layer `layer`, or nullptr when it could not be read (or failed
  // its hash when verification is on); the failure is recorded in Failures().
  virtual const ops::GluWeights* Expert(int layer, int expert) = 0;
  // Whether Expert(layer, expert) would return without waiting for a read (its read is done,
  // or it was never in flight), so the model can compute the experts that are ready first.
  virtual bool ExpertReady(int /*layer*/, int /*expert*/) { return true; }
  virtual void ReleaseExperts(int layer) = 0;
  // Called by the model the moment a MoE layer's routing is known, once per wave (ops::ExpertWaves):
  // the experts (ascending ids) whose Expert() calls follow before the next ReleaseExperts(layer).
  // A streaming source issues their batch read here; the default does nothing.
  virtual void WillUse(int /*layer*/, std::span<const int32_t> /*experts*/) {}
  // At most this many distinct experts per wave (0: no limit); a cache of S slots says S − 1
  // (less the slots it keeps for guesses, below).
  virtual int64_t ExpertWaveSize() const { return 0; }
  // Reading ahead (DESIGN.md §7 "Overlap"). While MoE layer L's experts load, the model ranks
  // layer L+1's experts with L+1's router applied to L's MoE input, and hands the most likely to
  // Prefetch(L+1, …), so that their reads run while L finishes and L+1's attention computes.
  // Only a guess: routing always runs on the real input, and what was read never changes a bit.
  // PrefetchBudget(layer): how many guesses the source would read ahead for `layer` now (0: none:
  // it holds every expert, its cache is too small, reading ahead is off, or recent guesses were
  // all resident already; asking counts, see StreamingWeights). HeldLayer(layer):
  // the layer's trunk weights when held without a read (a pinned layer), else null; never
  // reads, never waits. The defaults never read ahead.
  virtual int64_t PrefetchBudget(int /*layer*/) { return 0; }
  virtual const ops::LayerWeights* HeldLayer(int /*layer*/) const { return nullptr; }
  virtual void Prefetch(int /*layer*/, std::span<const int32_t> /*guesses*/) {}
  // out [n][E] fp32 = rows ids[0..n) of embed_tokens (bf16 widened exactly). ids are in range
  // (the caller validated them against the vocab).
  virtual Status EmbeddingRows(const int32_t* ids, int64_t n, float* out) = 0;
  // lm_head is consumed in chunks of LmHeadChunkRows() rows (the last one shorter): rows
  // [begin, begin + n) as a Matrix. Output rows are independent, so chunking never changes a bit.
  virtual int64_t LmHeadChunkRows() const = 0;
  virtual Result<kernels::Matrix> LmHeadRows(int64_t begin, int64_t n) = 0;
  // The model is done with lm_head for this pass (the last chunk may be recycled).
  virtual void LmHeadDone() {}
  virtual Result<const HeadWeights*> Head() = 0;
  // The generation step about to run (0 = prefill), for traces.
  virtual void SetStep(int64_t /*step*/) {}

  virtual ReadCounters Counters() const = 0;
  virtual SourceCounters Source() const { return {}; }
  virtual const std::vector<ExpertFailure>& Failures() const = 0;
  // Bytes this source will hold in RAM at most (for the memory plan printed before a run).
  virtual uint64_t PlannedResidentBytes() const = 0;
};

struct RamWeightsOptions {
  // Hash every expert read against experts.idx's XXH3-64 (k3run --verify-reads).
  bool verify_reads = false;
};

// The simplest source: each trunk run read whole on first use (one large read) and kept; experts
// read on first use and kept; embedding rows read one by one on demand; lm_head and the head
// vectors read once. Small bf16 vectors are widened to fp32 exactly; F32 ones are copied.
class RamWeights final : public WeightSource {
 public:
  // `prepared` must outlive the source.
  static Result<std::unique_ptr<RamWeights>> Open(Env* env, const prepared::PreparedDir* prepared,
                                                  const RamWeightsOptions& options = {});
  ~RamWeights() override;

  Result<const ops::LayerWeights*> Layer(int layer) override;
  void ReleaseLayer(int) override {}
  const ops::GluWeights* Expert(int layer, int expert) override;
  void ReleaseExperts(int) override {}
  Status EmbeddingRows(const int32_t* ids, int64_t n, float* out) override;
  int64_t LmHeadChunkRows() const override;
  Result<kernels::Matrix> LmHeadRows(int64_t begin, int64_t n) override;
  Result<const HeadWeights*> Head() override;
  ReadCounters Counters() const override { return counters_; }
  const std::vector<ExpertFailure>& Failures() const override { return failures_; }
  uint64_t PlannedResidentBytes() const override;

 private:
  struct LoadedLayer;
  struct LoadedExpert;
  RamWeights(Env* env, const prepared::PreparedDir* prepared, const RamWeightsOptions& options);
  Result<LoadedLayer*> LoadLayer(int layer);
  Status LoadExpert(int layer, int expert, LoadedExpert* out);
  Result<File*> ExpertFile(uint32_t file_id);

  Env* env_;
  const prepared::PreparedDir* prepared_;
  RamWeightsOptions options_;
  ops::Dims dims_;
  std::unique_ptr<File> trunk_, resident_;
  std::vector<std::unique_ptr<File>> expert_files_;
  std::vector<std::unique_ptr<LoadedLayer>> layers_;
  std::vector<std::unique_ptr<LoadedExpert>> experts_;  // record index order
  AlignedBuffer lm_head_;
  kernels::Matrix lm_head_matrix_{};
  HeadCache head_;
  ReadCounters counters_;
  std::vector<ExpertFailure> failures_;
};

// A small vector's bytes (BF16 or F32 on disk, MODEL.md §2) widened exactly into fp32 in *out;
// kInvalid naming the file and tensor for any other dtype.
Status WidenInto(const prepared::Region& r, const uint8_t* bytes, std::vector<float>* out);

// ops::Dims from the resolved config. mla_latent_eps is upstream's 1e-6 (MODEL.md §3.1).
ops::Dims DimsFromConfig(const ModelConfig& c);

}  // namespace k3::run
