// k3run's report: one human line per step on stderr, and the JSON report (--out FILE).
//
// JSON (format "k3run-report", version 1): prepared, layers_run, n_layers, is_full_model (false
// with --layers N < n_layers: the numbers are NOT the model's), mode, isa, threads,
// prompt_ids, generated_ids (authoritative), generated_text (decoded bytes, invalid UTF-8 →
// U+FFFD; null without a tokenizer), stop_reason (gen | end-token | stop-id | stop-string | interrupted), steps [{index, tokens_in, token (null for a
// prefill-only step), seconds, tokens_per_s, bytes_read {trunk, experts, embedding, lm_head, head,
// prefetch_unused, total}, expert_requests, expert_hits, expert_hit_rate (null without requests),
// expert_guesses, expert_guesses_used, io_busy_s, io_wait_s}], totals {seconds,
// seconds_per_token (all steps / generated tokens), decode_seconds_per_token (steps after the
// first; null with fewer than 2 steps), bytes_read {…}, bytes_per_token {…} (decode steps),
// expert_hit_rate, expert_guesses, expert_guesses_used, expert_guess_precision (used ÷ guesses;
// null without guesses), io_share (I/O busy ÷ wall), io_hidden (share of I/O busy time the engine
// did not wait for)}, memory_plan {…}, streaming (null when every weight is held) {plan {…},
// stats {… prefetches, prefetch_used, prefetch_failed}, reader}, floor (null when not measured)
// {bandwidths {…}, per_token {…}, disk_s, memory_s, compute_s, floor_s, bound, time_over_floor},
// prefill (null without a probe or a prefill step) {tokens, seconds, tokens_per_s, flops,
// peak_flops_per_s, compute_floor_s, time_over_compute_floor},
// own_rate_floor (null when nothing was read per token) {read_bytes_per_s,
// needed_bytes_per_token, floor_s, seconds_per_token, time_over_floor}, peak_rss_bytes,
// experts_skipped, expert_failures [{layer, expert, reason}], valid, scale_out (null without
// --mpi) {ranks, map, send_s, wait_s, per_rank [{rank, experts, rows, bytes_sent,
// bytes_received, messages, bytes_sent_per_token, bytes_received_per_token}]}.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "k3run/app/floor.h"
#include "k3run/engine/grammar_constraint.h"
#include "k3run/engine/generate.h"
#include "k3run/engine/remote_experts.h"
#include "k3run/stream/memory_plan.h"
#include "k3run/stream/streaming_plan.h"
#include "k3run/stream/streaming_weights.h"
#include "k3run/weights/weights.h"

namespace k3::run {

struct RunReport {
  std::string prepared;
  int layers_run = 0;
  int n_layers = 0;
  bool recompute = false;
  std::string isa;
  int threads = 0;
  std::vector<int32_t> prompt_ids;
  // --image: images in the prompt, their rows (= <|media_pad|> positions), the towers' time and
  // reading vision.bin (docs/VISION.md).
  int64_t images = 0;
  int64_t image_tokens = 0;
  double tower_seconds = 0;
  double vision_load_seconds = 0;
  std::vector<int32_t> generated_ids;
  std::optional<std::string> generated_bytes;  // raw; nullopt without a tokenizer
  bool stopped_by_id = false;
  std::string stop_reason;  // gen | end-token | stop-id | stop-string; "": from stopped_by_id
  std::vector<StepRecord> steps;
  int64_t spec = 0;          // --spec N
  SpecStats spec_stats;      // decode passes, drafted and accepted tokens
  MemoryPlan plan;
  std::optional<StreamingPlan> streaming_plan;
  StreamingStats streaming_stats;
  std::string reader_backend;
  std::optional<Bandwidths> bandwidths;  // probed at start-up (k3run/app/floor.h)
  uint64_t peak_rss_bytes = 0;
  int64_t experts_skipped = 0;
  std::vector<ExpertFailure> failures;
  std::optional<RemoteStats> scale_out;  // --mpi on rank 0: what went to the other ranks
  // For the floor: weight bytes a pass multiplies (trunk of the layers run + lm_head) and one
  // expert record's size.
  uint64_t weights_used_per_pass = 0;
  uint64_t expert_record_bytes = 0;
  // --grammar / --json-schema: each token's mask computation and the choice's wait for it.
  std::optional<GrammarConstraint::Timing> constraint;
};

std::string RenderReportJson(const RunReport& r);

// Per-token averages over the decode steps (all steps when there is only one), for the floor:
// bytes read by kind, and the weight bytes and multiply-adds a token uses (the trunk and lm_head
// of r.weights_used_per_pass plus the experts it asked for, r.expert_record_bytes each).
PerToken MeasurePerToken(const RunReport& r);
// Floor and time ÷ floor of the run (nullopt without bandwidths or generated tokens).
struct FloorResult {
  PerToken per_token;
  Floor floor;
  double seconds_per_token = 0;
  double time_over_floor = 0;
};
std::optional<FloorResult> RunFloor(const RunReport& r);

// The prefill against its compute floor (issue 30 item 3): 2 flops × the prefill step's
// multiply-adds (StepRecord::multiply_adds: PassMultiplyAdds, a lower bound of its work) ÷ the
// kernels' peak measured at start-up at prefill widths (Bandwidths::kernel_matmul_flops_per_s,
// cache-resident bf16, floor.h). time_over_floor = prefill seconds ÷ that
// floor. Nullopt without bandwidths, a prefill step (index 0, tokens_in > 0, seconds > 0) or
// its multiply-adds.
struct PrefillFloor {
  int64_t tokens = 0;
  double seconds = 0;
  double tokens_per_s = 0;
  double flops = 0;
  double peak_flops_per_s = 0;
  double floor_s = 0;
  double time_over_floor = 0;
};
std::optional<PrefillFloor> RunPrefillFloor(const RunReport& r);

// The disk floor at the engine's OWN read rate: the bytes a decode token had to read (all but
// unused guesses) ÷ the rate the run read at while reads were in flight (all bytes read ÷ I/O
// busy seconds, every step). It needs no probe, so unlike the probed floor it does not swing
// with a host or device cache that the probe and the engine see in different states; but it
// only says how well the engine used the disk it had (time ÷ it ≈ 1 ÷ (the decode steps' I/O
// share × the share of their reads that were needed)), not how fast that disk can be.
// Nullopt without generated tokens, without read time, or when a token reads no weights.
struct OwnRateFloor {
  double read_bytes_per_s = 0;
  double needed_bytes_per_token = 0;
  double floor_s = 0;
  double seconds_per_token = 0;
  double time_over_floor = 0;
};
std::optional<OwnRateFloor> RunOwnRateFloor(const RunReport& r);

// A pass's split (model.h PassTimes) divided by `per` (passes or tokens), named in the reports'
// order: experts, trunk, attention, waits (seconds).
std::vector<std::pair<std::string, double>> PassSplit(const PassTimes& t, double per);
// "experts 41.2 ms, trunk 20.1 ms, attention 12.0 ms, waits 0.3 ms" of PassSplit.
std::string PassSplitText(const PassTimes& t, double per);

// "step 3 (decode, 1 token): id 417  0.012 s  read 1.25 MiB (trunk 0 B, experts 1.25 MiB, …)".
std::string StepLine(const StepRecord& s);
// The one end-of-run line of a default run: "prompt 8 tokens in 0.120 s (66.67 tok/s, 3.10× its
// compute floor); generated
// 16 tokens, decode 0.0450 s/token (22.22 tok/s); read 1.2 MiB/token; peak RSS 310 MiB (plan
// 290 MiB); time / floor 1.83 (disk-bound)": the prefill apart from the decode steps, so the
// per-token rate is not diluted by the prompt (plus the --layers note when it applies).
std::string SummaryLine(const RunReport& r);
// The --verbose summary: every step's totals, bytes by kind, I/O share, guesses read ahead,
// the floor's terms and the floor at the engine's own read rate.
std::string SummaryLines(const RunReport& r);
std::string NotTheModelNote(const RunReport& r);

}  // namespace k3::run
