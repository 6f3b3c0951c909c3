// `k3run PREPARED --batch FILE [--max-seqs N]` (DESIGN.md §11.4, issue #20): many prompts share
// every pass over the weights through the one scheduler (k3run/engine/scheduler.h); each gets
// exactly the ids (and logit bits) of its own single run with the same flags.
//
// Input: JSON Lines, one request per line (k3run/app/batch_input.h). Output on stdout: one JSON
// line per input IN INPUT ORDER (a line that finishes early waits for those before it):
//   {"index": I, "generated_ids": [..], "text": "..", "stop_reason": ".."}
// `text` is what a single run prints (special tokens only with --show-special, cut before a
// --stop string; bytes that are not UTF-8 become U+FFFD); null without a tokenizer.
// `stop_reason` uses the single run's words: gen | end-token | stop-id | stop-string, plus
// context (positions full), interrupted (Ctrl-C) and error (with an "error" field).
// Every input gets the flags of a single run: --gen (unless its line gives "gen"), the end
// tokens unless --ignore-eos, --stop-id, --stop and the sampling flags. Sampled runs are
// reproducible: input I samples with seed S + I (mod 2^64), S being --seed or the random seed
// printed, so `--seed S+I` on a single run of that input draws the same tokens.
// --dump-logits PATH writes PATH.<I> per input with a generated token, in the single run's
// format (float32 LE [vocab]: the first step, or every step with --dump-logits-all); an input
// with gen 0 chooses no token and writes none. --out FILE: the batch report (passes, rows per
// pass, tokens per pass, bytes read per generated token, per sequence and total); a summary
// line on stderr.
// --max-seqs N: sequences held at once (default: as many as the memory plan fits, at most
// kDefaultMaxSeqs, never more than the inputs); the plan holds each one's caches and states, so
// a --max-seqs that does not fit is refused (exit 2).
// --spec N [--spec-fixed]: greedy lines speculate in the shared passes (scheduler.h), each with
// exactly the ids of the batch without --spec; sampled lines and lines under --grammar or
// --json-schema decode without drafts (a warning says so). The report adds "speculation"
// (verifications, drafted, accepted) and each sequence's. --spec-oracle is a prompt run's; a
// line's "spec_oracle" (batch_input.h) is the batch's diagnostic equivalent.
// Exit codes as a single run; 4 (RUN INVALID) when an expert read failed, after every line is
// written.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/env.h"
#include "common/status.h"
#include "k3run/app/batch_input.h"
#include "k3run/app/cli.h"
#include "k3run/app/floor.h"
#include "k3run/engine/session.h"
#include "k3run/engine/vision_encoder.h"

namespace k3::run {

// --batch and --max-seqs.
void AddBatchFlags(CLI::App* app, RunOptions* o);
// Flags that cannot combine with --batch (exit 2 naming both), sampling options, --gen.
Status CheckBatchFlags(const RunOptions& o);
// "<stdin>" for -, else FILE as given: the name in every message about the input.
std::string BatchInputName(const std::string& file);
// What the inputs ask of the flags: a line's "spec_oracle" needs --spec (exit 2 naming FILE:LINE).
Status CheckBatchInputs(const RunOptions& o, const std::vector<BatchInput>& inputs);
// Lines with "images" (batch_input.h): opens the tower (kInvalid "no vision" on a text-only
// directory), reads and preprocesses each image (kInvalid naming FILE:LINE and the image), and
// renders the line as --image --prompt does (one user message, the images then the text;
// --no-think and --thinking-effort apply), filling its ids. *vision: the tower, null when no
// line has images.
Status ResolveBatchImages(const Engine& engine, const RunOptions& o,
                          std::vector<BatchInput>* inputs,
                          std::unique_ptr<VisionEncoder>* vision);
// Positions per sequence: the most any input needs (prompt + gen − 1); --ctx may reserve more,
// never less (kInvalid naming the line that does not fit).
Result<int64_t> BatchPositions(const RunOptions& o, const std::vector<BatchInput>& inputs);
// The sequences to hold at once: --max-seqs, else the plan's choice; at most the inputs.
int64_t BatchSequences(const Engine& engine, const RunOptions& o, size_t inputs);

struct BatchContext {
  Env* env = nullptr;
  std::function<Status(std::string_view)> out;  // stdout
  bool lines = true;                            // human lines on stderr
  uint64_t seed = 0;                            // input I samples with seed + I
  std::string isa;                              // for the report
  // --grammar / --json-schema: each input's own constraint (app/cli_constraint.h); unset: none.
  std::function<Result<std::shared_ptr<TokenConstraint>>()> make_constraint;
  // Lines with images: the tower (ResolveBatchImages), run at each line's admission.
  VisionEncoder* vision = nullptr;
  // The decode passes' roofline floor in the report: the start-up probes (none with
  // --no-floor: the floor is null) and what a pass multiplies.
  std::optional<Bandwidths> bandwidths;
  PassWeights pass_weights;
};

// Runs every input on a planned and loaded engine; writes the output lines, the dumps and the
// report.
Status RunBatch(Engine* engine, const RunOptions& o, const std::vector<BatchInput>& inputs,
                const BatchContext& ctx);

}  // namespace k3::run
