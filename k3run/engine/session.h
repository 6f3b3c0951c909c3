// The engine as a library (DESIGN.md §11.1): the one API that every front end uses (the CLI's
// prompt and chat modes today; batching and the server build on it).
//
//   Engine::Open(prepared)       k3.json, experts.idx and the tokenizer, checked; cheap
//   engine->Plan(options)        the memory plan (streaming or all-in-RAM), checked against
//                                MemAvailable before anything large is allocated
//   engine->LoadWeights()        the weight source the plan asks for
//   engine->NewSequence(...)     a sequence: its tokens, KDA state, MLA cache, position, sampler
//   engine->Step(batch)          ONE pass over the weights for the rows of one or more
//                                sequences; returns the logits asked for and appends the rows
//                                to each sequence tentatively
//   engine->Commit(seq, rows)    keeps the first `rows` rows of the sequence's last step
//
// Bits: a sequence's logits never depend on what else shares its pass, on the memory plan, the
// thread count or the ISA path (DESIGN.md §7, §11.2a). Progress is reported as events that the
// front end renders. Thread safety: one thread drives an Engine and its sequences.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/progress.h"
#include "common/status.h"
#include "formats/prepared_manifest.h"
#include "k3run/engine/model.h"
#include "k3run/engine/remote_experts.h"
#include "k3run/engine/sampler.h"
#include "k3run/engine/token_constraint.h"
#include "k3run/stream/memory_plan.h"
#include "k3run/stream/streaming_plan.h"
#include "k3run/stream/streaming_weights.h"
#include "k3run/text/tokenizer.h"
#include "k3run/weights/weights.h"

namespace k3::run {

class Engine;

// --max-seqs when the plan chooses (PlanOptions::sequences = 0).
inline constexpr int64_t kDefaultMaxSeqs = 16;

// A copy of a committed sequence (tokens, KDA states, latent rows up to its length): the
// server's prompt cache. Restoring it and continuing gives the bits of the original.
struct SequenceSnapshot {
  std::vector<int32_t> tokens;
  State state;      // MLA caches hold exactly tokens.size() rows (capacity = length)
  uint64_t bytes() const;  // what the snapshot holds in memory
};

// A sequence: the tokens fed so far, the carried state (KDA state + MLA cache per layer), and
// its own sampler (one RNG per sequence: nothing random is shared between sequences).
class Sequence {
 public:
  const std::vector<int32_t>& tokens() const { return tokens_; }  // committed rows
  int64_t length() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t capacity() const { return capacity_; }  // positions the caches hold
  int64_t pending() const { return pending_; }    // rows of the last Step not yet committed
  // Rows of this sequence were routed to an expert that could not be read: its output since
  // is not the model's (RUN INVALID). Cleared by Reset.
  bool invalid() const { return state_.invalid; }
  Sampler& sampler() { return sampler_; }
  // Its images (media.h), attached by Engine::AttachMedia; Reset clears them.
  const std::vector<MediaSpan>& media() const { return state_.media; }
  // What the next token must satisfy (a JSON schema, a grammar); null: anything (the default).
  // ChooseToken (token_choice.h) applies it. Reset clears it.
  std::shared_ptr<TokenConstraint>& constraint() { return constraint_; }
  // Back to an empty sequence (zero state, empty caches), keeping the allocations.
  void Reset();

 private:
  friend class Engine;
  Sequence(State state, int64_t capacity, Sampler sampler);
  State state_;
  int64_t capacity_;
  std::vector<int32_t> tokens_;
  std::vector<int32_t> pending_ids_;
  int64_t pending_ = 0;
  bool pending_tentative_ = false;  // the pending rows were recorded (Commit may drop some)
  Sampler sampler_;
  std::shared_ptr<TokenConstraint> constraint_;
};

// One sequence's rows of a pass.
struct StepInput {
  Sequence* seq = nullptr;
  std::vector<int32_t> ids;      // ≥ 1, each < vocab
  Logits logits = Logits::kLast;
  // Rows that Commit may discard (speculative drafts): KDA layers run them on a scratch copy of
  // the state and record what the recurrence consumes; at most plan spec_rows + 1 rows.
  bool tentative = false;
};

struct StepResult {
  int64_t pass = 0;                // 0 for the engine's first pass
  std::vector<float> logits;       // the rows asked for, input by input, [rows][vocab]
  std::vector<int64_t> first_row;  // per input: its first row in `logits`
  double seconds = 0;              // the pass's wall time
  PassTimes times;                 // where the pass's wall time went (model.h)
  int64_t experts_routed = 0;      // distinct (layer, expert) pairs its routing chose
  ReadCounters bytes;              // read during the pass
  SourceCounters source;           // expert requests, hits and I/O time during the pass
  const float* LogitsOf(size_t input, int64_t vocab) const {
    return logits.data() + first_row[input] * vocab;
  }
};

// What happened, for front ends to render (the engine never prints).
struct EngineEvent {
  enum class Kind { kStreamingPlan, kPass, kPrefill } kind;
  std::string text;            // kStreamingPlan: the plan as printed
  const StepResult* pass = nullptr;  // kPass: the pass just run (valid during the call)
  // kPrefill, after each pass of Feed: rows fed so far of `total`, and the seconds since the
  // feed started (rate and ETA follow).
  int64_t done = 0, total = 0;
  double seconds = 0;
};
using EventSink = std::function<void(const EngineEvent&)>;

struct PlanOptions {
  int layers = 0;                 // first N layers only (a diagnostic); 0: every layer
  int64_t positions = 1;          // per sequence: the positions its caches hold (--ctx)
  int64_t sequences = 1;          // sequences held at once (--max-seqs), each with its caches
                                  // and KDA states; 0: as many as fit, at most kDefaultMaxSeqs
  int64_t spec_rows = 0;          // the most draft rows a pass verifies (--spec N): each KDA
                                  // layer keeps per-row records for N + 1 rows per sequence
  int64_t pass_rows = 1;          // the most rows the caller feeds at once (a prompt's length)
  int64_t chunk = 0;              // rows per pass (--chunk); 0: the largest the plan allows,
                                  // at most min(pass_rows, kDefaultMaxChunk)
  BudgetRequest budget;           // none: every weight in RAM, read on first use; a total budget
                                  // (--budget-gb, --preset) covers caches, states and scratch too
  bool preload = false;           // read every expert at start (the budget must hold them)
  uint64_t vision_bytes = 0;      // images: the tower's weights + scratch (VisionEncoder::
                                  // PlanBytes), held beside the caches; 0 for text only
  bool verify_reads = false;      // hash every expert read (a mismatch makes the run invalid)
  int prefetch_experts = kDefaultPrefetchExperts;
  ProgressMode progress = ProgressMode::kNone;  // start-up loading display
  std::function<Result<uint64_t>()> mem_available;  // default: MemAvailableBytes()
};

class Engine {
 public:
  // kInvalid naming the file for a manifest that fails its sum (untrusted input, DESIGN.md §5).
  static Result<std::unique_ptr<Engine>> Open(Env* env, const std::string& prepared,
                                               const std::string& model_dir = "");
  // An engine over a prepared directory the caller built in memory (tools that plan for a model
  // that is not on disk, e.g. the released config): Plan works with a budget (streaming plans
  // read no file); LoadWeights does not. No tokenizer.
  static std::unique_ptr<Engine> ForPrepared(prepared::PreparedDir prepared);
  // An engine over a weight source the caller built (tests, tools): no plan, no tokenizer;
  // sequences hold `positions`.
  static std::unique_ptr<Engine> WithSource(const ModelConfig& c, WeightSource* source,
                                            int layers, int64_t positions);

  Status Plan(const PlanOptions& o);
  // `trace`, not owned, records the expert cache's waves (streaming plans only).
  Status LoadWeights(CacheTraceWriter* trace = nullptr);
  void SetEventSink(EventSink sink) { events_ = std::move(sink); }

  std::unique_ptr<Sequence> NewSequence(const SamplerOptions& sampling = {}, uint64_t seed = 0,
                                        uint64_t stream = 0);
  // One pass for every input (each a different sequence with nothing pending).
  Result<StepResult> Step(std::span<StepInput> batch);
  // Shutdown (the server's SIGTERM): the pass in flight stops before its next layer and fails
  // with kIo "interrupted", and every later Step is refused. The sequences of that pass are
  // good only for a Reset. Any thread (one atomic store).
  void Interrupt() { interrupted_.store(true, std::memory_order_relaxed); }
  // Feeds a long input to one sequence in passes of chunk() rows (DESIGN.md §11.3), committing
  // each, with a kPrefill event after every pass. The result is the last pass's, with the
  // seconds, bytes and source counters of all passes summed; `logits` applies to the last row
  // (kLast) or to none. Refused before any pass when the rows do not fit the sequence.
  Result<StepResult> Feed(Sequence* seq, std::span<const int32_t> ids,
                          Logits logits = Logits::kLast);
  // Keeps the first `rows` of the sequence's pending rows and discards the rest without another
  // pass over the weights: MLA caches by a length reset; KDA layers replay the kept rows'
  // recorded recurrence inputs on the live state (DESIGN.md §11.4). Rows stepped with
  // `tentative` false were applied to the state directly: they can only be kept (all of them)
  // or the sequence Reset.
  Status Commit(Sequence* seq, int64_t rows);

  // --save-state / --load-state (DESIGN.md §11.3): the committed sequence (tokens, KDA states,
  // latent caches up to its length, --layers) in formats/sequence_state.h's file, bound to this
  // prepared directory's k3.json, written atomically. Loading needs an empty sequence of this
  // engine with room for the saved positions; a foreign model, another --layers or a malformed
  // file is kInvalid (exit 2), a hash mismatch or truncation kIntegrity (exit 3). Continuing a
  // loaded sequence gives the bits of never having stopped.
  Status SaveSequence(const Sequence& seq, const std::string& path) const;
  Status LoadSequence(const std::string& path, Sequence* seq) const;
  // The prompt cache's copies (DESIGN.md §11.5). Snapshot needs nothing pending; Restore needs
  // an empty sequence of this engine with room for the snapshot's tokens.
  SequenceSnapshot Snapshot(const Sequence& seq) const;
  Status Restore(const SequenceSnapshot& snap, Sequence* seq) const;
  // Images (media.h): binds each span's rows to positions the sequence has not fed yet, in
  // order and without overlap; the pads fed there take the rows. kInvalid naming the span
  // otherwise (nothing attached from that span on).
  Status AttachMedia(Sequence* seq, std::vector<MediaSpan> spans) const;

  // Engines made WithSource have no prepared directory: check before prepared().
  bool has_prepared() const { return prepared_ != nullptr; }
  const prepared::PreparedDir& prepared() const { return *prepared_; }
  const ModelConfig& config() const { return config_; }
  int layers() const { return layers_; }
  const tok::Tokenizer* tokenizer() const { return tokenizer_ ? &*tokenizer_ : nullptr; }
  const MemoryPlan& memory_plan() const { return plan_; }
  int64_t chunk() const { return plan_.chunk; }  // rows per pass of a long input (Feed)
  uint64_t mem_available() const { return mem_available_; }  // as Plan() measured it
  const std::optional<StreamingPlan>& streaming_plan() const { return streaming_plan_; }
  // The streaming source's counters; null without a budget.
  const StreamingWeights* streaming() const { return streaming_; }
  int64_t experts_skipped() const { return model_ ? model_->experts_skipped() : 0; }
  // Where every pass's time went so far (model.h); each StepResult has its own pass's.
  PassTimes times() const { return model_ ? model_->times() : PassTimes{}; }
  // The source's failures, then the remote experts' (scale-out).
  std::vector<ExpertFailure> Failures() const;
  // Scale-out: from here on this engine holds only the routed experts `keep(layer, expert)`
  // says: the others' records become absent (as in a share made by k3prep split), so the plan,
  // --preload and the cache count and read this rank's range only, even from a full prepared
  // directory. Call before Plan.
  void RestrictExperts(const std::function<bool(int layer, int expert)>& keep);
  // Scale-out (remote_experts.h): routed experts `remote` does not call local are computed by
  // other processes. Set before the first Step; not owned; null computes every expert here.
  void SetRemoteExperts(RemoteExperts* remote);
  // Layer views and expert lookups for a process that computes experts for another (an MPI
  // rank ≥ 1, k3run/mpi/expert_server.h): the loaded source. Null before LoadWeights.
  WeightSource* weight_source() const { return source_; }

 private:
  Engine() = default;
  Env* env_ = nullptr;
  std::unique_ptr<prepared::PreparedDir> prepared_;
  ModelConfig config_;
  int layers_ = 0;
  std::optional<tok::Tokenizer> tokenizer_;
  PlanOptions options_;
  MemoryPlan plan_;
  uint64_t mem_available_ = 0;
  std::optional<StreamingPlan> streaming_plan_;
  std::unique_ptr<WeightSource> owned_source_;
  WeightSource* source_ = nullptr;
  StreamingWeights* streaming_ = nullptr;
  std::unique_ptr<Model> model_;
  RemoteExperts* remote_ = nullptr;
  EventSink events_;
  int64_t passes_ = 0;
  int64_t max_tentative_rows_ = 1;  // spec_rows + 1: the records the plan holds per sequence
  std::atomic<bool> interrupted_{false};
};

// The prepared directory's tokenizer, its files read once: hashed against k3.json (kIntegrity
// on a mismatch) and parsed from the same bytes. nullopt when the directory has none.
Result<std::optional<tok::Tokenizer>> LoadPreparedTokenizer(Env* env,
                                                            const prepared::PreparedDir& p);

}  // namespace k3::run
