// The multi-sequence scheduler (DESIGN.md §11.4): many requests share each pass over the weights.
// `--batch FILE` and `--serve` both run on it; nothing else decides which rows share a pass.
//
// Continuous batching: a request waits in a FIFO queue until one of `max_seqs` slots is free;
// a slot holds one Sequence (its KDA states and latent caches are allocated once per slot and
// Reset between requests). Each pass takes, in slot order:
//   - one decode row from every slot that is generating, then
//   - prompt rows of slots that are still prefilling, oldest request first, until the pass holds
//     `pass_rows` rows (the plan's chunk); a prompt longer than that is fed over several passes.
//   When the generating slots alone would fill the pass while a prompt waits, decode rows leave
//   it one row (prefill always advances) and take turns round robin (no slot starves).
// A request finishes at its token limit, a stop id, when its callback says stop (stop strings,
// a client gone), on Cancel, or when the end of its context is reached; its slot takes the next
// queued request in the same call.
//
// Bits: every request gets exactly the logits (so the ids) of running it alone through
// Generate: rows never interact across sequences (DESIGN.md §11.2a), each request has its own
// Sampler (one RNG per sequence: Sampler(sampling, seed, turn 0), as NewSequence(sampling, seed)
// makes for Generate; Greedy() when it is greedy, else Next over prompt + tokens so far), and a
// prompt split across passes gives the bits of one pass (chunk identity).
// Prompt cache (prompt_cache_bytes > 0): a request that ends with kLength, kStopId, kStopped or
// kContext leaves Engine::Snapshot of its sequence (prompt + generated but the last, unfed
// token) in an LRU bounded by bytes; never after kError, kCancelled or RUN INVALID. Admission
// restores the longest snapshot whose tokens are a PROPER prefix of the prompt and whose images
// over that prefix are the request's (same positions, rows and id: SameMediaPrefix), and feeds
// only the rest; the logits are those of a cold run.
// Images (Request::media): spans of tower rows bound to prompt positions; after admission (and
// any restore) the spans at or past the restored length are attached (Engine::AttachMedia), so
// the pads fed there take the image's rows.
// Speculation (`spec` > 0, DESIGN.md §11.4, speculation.h): a greedy request without a
// constraint (the requests Generate speculates for) has its own DraftPolicy; its decode row
// becomes its last token + a draft of up to `spec` tokens, stepped as tentative in the shared
// pass. Its rows are verified with Generate's rule (the token chosen at row i, as plain decoding
// chooses it; go on while it equals draft i), and Commit keeps exactly the rows whose tokens were
// taken, so each sequence rolls back on its own. Sampled and constrained requests decode one row
// per pass beside them. Drafts take the room left after one row per generating slot (a prompt
// being fed keeps at least one row); a policy is timed (Observe) only by passes that carried its
// slot alone.
// Expert read failures: a request whose rows were routed to an expert that could not be read
// ends with kError and status kUnreliable ("RUN INVALID", exit 4), the others go on (a draft
// row that touched it counts, even when the row is then dropped).
// Threads: Submit, Cancel and the counters may be called from any thread; RunPass, and so every
// callback, runs on the one thread that drives the Engine.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "k3run/engine/media.h"
#include "k3run/engine/sampler.h"
#include "k3run/engine/session.h"
#include "k3run/engine/speculation.h"

namespace k3::run {

// Why a request ended.
enum class FinishReason {
  kLength,     // generated max_tokens
  kStopId,     // generated one of stop_ids (the id is part of the output)
  kStopped,    // on_token returned false (a stop string matched, the client went away)
  kContext,    // the sequence's positions are full (no position left to feed the next token)
  kCancelled,  // Cancel() or the scheduler shutting down
  kError,      // a pass failed (status says why); an expert that could not be read: kUnreliable
};
// "length", "stop_id", "stopped", "context", "cancelled", "error".
const char* FinishReasonName(FinishReason r);

struct Request {
  std::vector<int32_t> prompt;   // ≥ 1 id, each < vocab (the submitter validates)
  // Images (media.h): spans at prompt positions (0 = the prompt's first id), ascending, not
  // overlapping, inside the prompt; the prompt holds a pad at each of their positions.
  std::vector<MediaSpan> media;
  // Images still to encode: called once at admission, on the engine thread (the tower drives
  // the compute threads, which only that thread may), it returns the spans that replace
  // `media`; its error ends the request with kError. Null: `media` as given. The server and
  // --batch encode here, so only admitted requests hold image rows. Its argument finds rows the
  // prompt cache's snapshots hold for a tower input (media.h MediaLookup): a conversation
  // re-sent with its images runs the tower only for the new ones.
  MediaEncoder encode_media;
  int64_t max_tokens = 0;        // tokens to generate; 0 = prefill only
  SamplerOptions sampling;       // greedy by default
  uint64_t seed = 0;
  std::vector<int64_t> stop_ids;
  // What every generated token must satisfy (token_constraint.h): a JSON schema, a grammar, a
  // forced tool call; null: unconstrained. Owned by this request alone (its state advances).
  std::shared_ptr<TokenConstraint> constraint;
  // After each generated token, with its logits [vocab] (valid during the call). false: stop
  // (the token stays part of the output). Never called for max_tokens 0.
  std::function<bool(int32_t token, const float* logits)> on_token;
  // After each pass that fed prompt rows: rows fed so far of the prompt (keep-alives, progress).
  std::function<void(int64_t fed, int64_t total)> on_prefill;
  // Exactly once, when the request ends (also on Cancel and shutdown).
  std::function<void(const struct RequestResult&)> on_done;
  // With SchedulerOptions::spec: where this request's drafts come from, as
  // GenerateOptions::drafter (the ids so far, the count generated, the most to draft); null:
  // PromptLookupDraft. Tests and diagnostics; any draft gives the same ids.
  Drafter drafter;
};

struct RequestResult {
  int64_t id = 0;
  std::vector<int32_t> generated;
  FinishReason reason = FinishReason::kLength;
  Status status;                  // ok unless kError
  int64_t prompt_tokens = 0;      // the prompt's length
  int64_t prompt_fed = 0;         // of which fed by passes (less when the prompt cache served a prefix)
  int64_t passes = 0;             // passes the request took part in (a failed one included)
  double queued_seconds = 0;      // submit → admission to a slot
  double first_token_seconds = 0; // submit → first generated token
  double seconds = 0;             // submit → done
  SpecStats spec;                 // speculating requests: decode passes, drafted, accepted
};

struct SchedulerOptions {
  int64_t max_seqs = 1;          // slots (sequences held at once); the plan must hold them
  int64_t pass_rows = 0;         // the most rows in one pass; 0: the engine's chunk()
  int64_t max_queue = -1;        // Submit refuses past this many waiting; −1: unbounded
  uint64_t prompt_cache_bytes = 0;  // snapshots at the ends of recent prompts (LRU); 0: off
  // --spec N: drafts of up to N tokens per decode pass for greedy unconstrained requests, clamped
  // to the engine's plan spec_rows (the KDA records it holds per sequence).
  int64_t spec = 0;
  bool spec_fixed = false;          // --spec-fixed: no adaptation (DraftPolicy adaptive false)
};

// Aggregate counters, readable from any thread (a consistent copy).
struct SchedulerStats {
  int64_t passes = 0;
  int64_t rows = 0;               // Σ rows over passes
  int64_t prompt_rows = 0;        // of which prompt rows
  int64_t generated = 0;          // tokens generated
  uint64_t bytes_read = 0;        // weight bytes read by all passes
  double pass_seconds = 0;        // Σ pass wall time
  // Passes of decode rows only (no prompt row): what batching saves per generated token.
  int64_t decode_passes = 0;
  int64_t decode_rows = 0;        // their rows (a decode row and its draft, if any)
  int64_t decode_tokens = 0;      // the tokens those passes chose (= decode_rows without drafts)
  uint64_t decode_bytes = 0;
  uint64_t decode_unused_bytes = 0;   // of which guesses read ahead and not used
  double decode_seconds = 0;
  double decode_io_busy_seconds = 0;  // the reader busy during them (own-rate floor)
  PassTimes decode_times;             // where their time went (model.h)
  int64_t decode_experts_routed = 0;  // distinct (layer, expert) pairs their passes routed to
  // The engine's idle time between passes: from the end of one pass to the start of the next
  // when the next follows without waiting for work (choosing tokens, callbacks, admission and
  // prompt snapshots happen there). Quantiles over the most recent kIdleWindow gaps.
  int64_t idle_gaps = 0;
  double idle_seconds = 0;        // Σ over all gaps
  double idle_median_seconds = 0;
  double idle_p99_seconds = 0;
  double idle_max_seconds = 0;    // over the window
  // Speculation: decode rows that carried a draft, draft tokens they verified, of which kept.
  int64_t spec_verifications = 0;
  int64_t spec_drafted = 0;
  int64_t spec_accepted = 0;
  int64_t active = 0;             // slots holding a request now
  int64_t queued = 0;             // requests waiting now
  int64_t finished = 0;
  int64_t prompt_cache_hits = 0;  // requests that started from a snapshot
  int64_t prompt_cache_tokens = 0;  // prompt tokens those snapshots saved
  uint64_t prompt_cache_bytes = 0;  // held now
};

class Scheduler {
 public:
  static constexpr size_t kIdleWindow = 4096;  // gaps behind SchedulerStats' idle quantiles

  // The engine must be planned for at least max_seqs sequences and loaded.
  Scheduler(Engine* engine, const SchedulerOptions& o);
  ~Scheduler();

  // Queues a request; its id, or Status::Io naming the queue limit when max_queue requests
  // already wait (the server's 429), or Status::Invalid for a request no sequence can run (an
  // empty prompt, an id outside the vocab, a prompt longer than a sequence's positions,
  // max_tokens < 0, sampling options ValidateSamplerOptions refuses). A refused request's
  // on_done is never called; a media span outside the prompt, out of order or of the wrong
  // width is kInvalid too. Any thread.
  Result<int64_t> Submit(Request r);
  // Ends a request (queued or running) with kCancelled; its rows in flight are discarded and its
  // slot is free for the next pass. Unknown or finished ids are ignored. Any thread.
  void Cancel(int64_t id);
  // Ends every request with kCancelled (shutdown). Any thread; takes effect at the next pass.
  void CancelAll();

  // Runs one pass if any request is queued or running; true when it ran a pass or ended a
  // request (a cancellation), false when idle. Engine thread only. A failing pass ends the
  // requests it carried with kError and the pass's status; the scheduler stays usable.
  Result<bool> RunPass();
  // RunPass until idle (--batch).
  Status RunUntilIdle();
  // Blocks until a request is queued, running or cancelled, or Wake() was called since the
  // last return; for the server's engine thread.
  void WaitForWork();
  void Wake();

  bool Idle() const;
  SchedulerStats Stats() const;
  const SchedulerOptions& options() const { return options_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  SchedulerOptions options_;
};

}  // namespace k3::run
