// The K3 forward pass, top to bottom (MODEL.md §3.2–3.8), llama2.c style: embedding → decoder
// layers (k3run/ops) → final attention residual → norm → lm_head.
//
// Goals: one token can be followed through Forward() in one sitting; every weight comes through
// WeightSource (weights.h), so where bytes live (RAM, a ring, an expert cache) never shows here.
// Bits: T rows in one Forward() equal T one-row calls with carried State (MODEL.md §7), and the
// rows of several sequences in one Pass() equal each sequence's own Forward(); the thread count
// and ISA path never change a bit (DESIGN.md §7).
// Non-goals: sampling and the generation loop (k3run/engine/generate.h), memory planning (plan.h).
// Thread safety: one Model and its State are used by one thread at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "formats/config.h"
#include "k3run/ops/kda.h"
#include "k3run/ops/layer.h"
#include "k3run/ops/mla.h"
#include "k3run/engine/media.h"
#include "k3run/engine/remote_experts.h"
#include "k3run/ops/moe.h"
#include "k3run/weights/weights.h"

namespace k3::run {

// The carried per-sequence state (MODEL.md §7): KDA state + conv histories per KDA layer, the
// MLA KV cache per MLA layer, the position counter. Layers past the run's depth stay empty.
struct State {
  std::vector<ops::KdaState> kda;  // [n_layers]; sized only for KDA layers < layers
  std::vector<ops::MlaCache> mla;  // [n_layers]; sized (capacity positions) only for MLA layers
  // [n_layers]: the last tentative pass's per-row records of each KDA layer (Model::Keep);
  // empty until a tentative segment runs.
  std::vector<ops::KdaRecords> records;
  int64_t pos = 0;                 // positions already in the cache
  // Rows of this sequence were routed to an expert that could not be read (RUN INVALID).
  bool invalid = false;
  // Images in this sequence (media.h), by position: their rows replace the pads' embeddings.
  std::vector<MediaSpan> media;

  // `capacity`: positions the MLA caches hold (prompt + generated tokens fed back).
  static State Make(const ModelConfig& c, int layers, int64_t capacity);
  // Back to the start of a sequence (zero KDA state, empty caches, no images), keeping
  // allocations.
  void Reset();
};

// Where passes' wall time went (the reports' split of a pass, DESIGN.md §11): every second of
// Model::Pass is in exactly one of the first four.
struct PassTimes {
  double attention = 0;  // attention sublayers: projections, KDA recurrence / MLA cache, output
  double experts = 0;    // routed experts' compute (ExpertWaves), their waits excluded
  double waits = 0;      // blocked on the weight source (a trunk layer, an expert, an lm_head
                         // chunk not yet in RAM) or on other ranks' experts
  double trunk = 0;      // the rest: embedding, norms, residual aggregation, dense and shared
                         // MLPs, routing, latent projections, lm_head
  double mla = 0;        // of `attention`, in MLA layers (the benchmarks' "MLA share")

  double total() const { return attention + experts + waits + trunk; }
  PassTimes& operator+=(const PassTimes& o);
  PassTimes operator-(const PassTimes& o) const;
};

// Which logits a sequence's rows of a pass produce.
enum class Logits { kNone, kLast, kAll };

// One sequence's rows in a pass: ids[0..n) fed at positions state->pos … pos + n − 1.
struct Segment {
  const int32_t* ids = nullptr;
  int64_t n = 0;
  State* state = nullptr;
  Logits logits = Logits::kLast;
  // The rows may be discarded (speculative drafts): KDA layers record them and leave the state
  // as it was; Model::Keep then applies the rows that stay. MLA caches are appended either way.
  bool tentative = false;
};

class Model {
 public:
  // Runs the first `layers` layers (n_layers for the model; fewer is a diagnostic, not the model).
  Model(const ModelConfig& c, WeightSource* weights, int layers);

  // ONE pass over the weights for the rows of every segment (each its own sequence, in any
  // order; no state twice), advancing each state->pos by its n. logits: the rows each segment
  // asks for, segment by segment ([n][vocab] for kAll, [vocab] for kLast).
  Status Pass(std::span<const Segment> segments, float* logits);
  // When *flag turns true, a Pass in flight stops before its next layer with kIo ("interrupted");
  // the layers it ran have changed its segments' states, which are then good only for a Reset.
  void SetInterruptFlag(const std::atomic<bool>* flag) { interrupt_ = flag; }
  // Scale-out: routed experts that `remote` says are not local are computed by other processes
  // (remote_experts.h); null (the default) computes every expert here. Never changes a bit.
  void SetRemoteExperts(RemoteExperts* remote) { remote_ = remote; }
  // After a pass with a tentative segment of `n` rows on `state`: keeps the first `kept` (KDA
  // layers replay their records, MLA caches and the position drop the rest). No weight is read.
  void Keep(State* state, int64_t n, int64_t kept) const;
  // Pass() of one segment: logits [T][vocab] when all_rows, else [vocab] for the last row only.
  Status Forward(const int32_t* ids, int64_t T, State* state, bool all_rows, float* logits);

  int64_t vocab() const { return config_.vocab; }
  int layers() const { return layers_; }
  const ModelConfig& config() const { return config_; }
  // (token, expert) pairs skipped because an expert could not be read, over all Forward calls.
  int64_t experts_skipped() const { return stats_.experts_skipped; }
  // Where the passes' wall time went, summed over every pass so far.
  const PassTimes& times() const { return times_; }
  // Distinct (layer, expert) pairs the passes' routing chose, summed over every pass so far
  // (what a pass multiplies of the experts, wherever they were computed).
  int64_t experts_routed() const { return experts_routed_; }

 private:
  Status RunPass(std::span<const Segment> segments, float* logits);
  Status RunLayer(int L, const ops::LayerWeights& w, std::span<const Segment> segments,
                  float* h, int64_t T, ops::BlockStack* blocks, ops::LayerScratch* s);
  Status RunMoe(int L, const ops::LayerWeights& w, std::span<const Segment> segments,
                const float* h, int64_t T, ops::LayerScratch* s);
  Status Head(const float* h, int64_t rows, float* logits);
  void MarkInvalid(const ops::Routing& routing, std::span<const int32_t> missing,
                   std::span<const Segment> segments);
  // Hands the source a ranked guess of layer L+1's experts from L's pre-norm MLP input h [T][E].
  void GuessNextExperts(int L, const float* h, int64_t T);

  ModelConfig config_;
  ops::Dims dims_;
  WeightSource* weights_;
  int layers_;
  ops::MoeStats stats_;
  PassTimes times_;
  // The MoE block's buffers, sized by the first pass and reused by every layer after (zeroing
  // and freeing 8 MB of slots a layer ran on the engine thread alone at prefill).
  ops::MoeScratch moe_scratch_;
  int64_t experts_routed_ = 0;
  const std::atomic<bool>* interrupt_ = nullptr;
  RemoteExperts* remote_ = nullptr;
};

}  // namespace k3::run
