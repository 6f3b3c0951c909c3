// Generation on a Sequence (DESIGN.md §6 k3run, §11.3, MODEL.md §7): the prompt is fed in
// passes of the plan's chunk (Engine::Feed: rows per weight read, scratch bounded by the chunk),
// then tokens are decoded one at a time with carried state; with `recompute` every step instead
// re-runs the whole prefix from an empty sequence (the O(T²) check path). Every chunk size and
// both paths produce bit-identical logits (tested).
//
// The sequence may already hold tokens (a chat's earlier turns, a loaded state): the prompt is
// fed after them, so only the new tokens cost a pass.
// Steps: step 0 feeds the prompt; step s > 0 feeds the token chosen at step s−1 (or, with
// recompute, the whole sequence so far). gen N runs N steps and chooses N tokens, stopping
// early after a token in stop_ids (that token is part of the output); gen 0 runs step 0 only
// (prefill) and chooses nothing. Tokens are chosen by the sequence's sampler (greedy unless it
// samples: argmax, the lowest id on ties).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "common/status.h"
#include "k3run/engine/session.h"
#include "k3run/engine/speculation.h"

namespace k3::run {

// argmax with strict > scanning from index 0: on exact ties the LOWEST id wins (MODEL.md §3.8).
int32_t Greedy(const float* logits, int64_t n);

struct GenerateOptions {
  std::vector<int32_t> prompt;     // non-empty, every id < vocab (validated by the caller)
  int64_t gen = 0;                 // tokens to generate
  bool recompute = false;
  // --spec N: verify up to N prompt-lookup draft tokens per pass (speculation.h); needs a
  // sampler that does not draw at random, and the plan's spec_rows ≥ N. Same ids and logits.
  int64_t spec = 0;
  bool spec_fixed = false;  // draft N whenever the lookup finds N (no adaptation)
  // Where drafts come from; null: PromptLookupDraft(ids so far, n). Given the ids so far, the
  // count generated and the most to draft. Tests and benchmarks give a known continuation here
  // (synthetic weights do not repeat text, so lookups rarely hit on them); any draft gives the
  // same output, only the passes differ.
  Drafter drafter;
  std::vector<int64_t> stop_ids;
  // Asked after each step's callback; true ends generation there (the caller's stop rules:
  // stop strings, an interrupt). The caller knows why it stopped.
  std::function<bool()> stop_requested;
};

struct StepRecord {
  int64_t index = 0;      // 0 = prefill
  int64_t tokens_in = 0;  // rows fed this step; 0 for a token that shared an earlier step's
                          // pass (speculation: the pass is counted on its first token)
  int64_t drafted = 0;    // draft tokens the pass verified (on its first token)
  int64_t accepted = 0;   // of which kept
  int32_t token = -1;     // chosen token; −1 for a prefill-only run (gen 0)
  double seconds = 0;     // the pass + choosing the token
  PassTimes times;        // the pass's split (model.h): attention, experts, waits, trunk
  // Prefill step only (0 otherwise): the multiply-adds of its pass, counted from the config
  // (PassMultiplyAdds), for the report's prefill compute floor.
  double multiply_adds = 0;
  ReadCounters bytes;     // read during this step
  SourceCounters source;  // expert requests/hits and I/O time during this step
};

// Called after every step with that step's logits [vocab] (valid during the call only). A
// failing Status stops generation and is returned.
using StepCallback = std::function<Status(const StepRecord&, const float* logits)>;

struct GenerateResult {
  std::vector<int32_t> generated;
  std::vector<StepRecord> steps;
  bool stopped_by_id = false;
  SpecStats spec;
};

// `seq` (empty or holding earlier tokens) must have room for PositionsNeeded more positions.
Result<GenerateResult> Generate(Engine* engine, Sequence* seq, const GenerateOptions& o,
                                const StepCallback& on_step);

// The multiply-adds of one pass of `rows` rows fed after `positions_before` positions, with
// `logits_rows` rows of logits: per row, every trunk weight of the layers run (a trunk run's
// bytes ÷ 2: bf16), top-k routed experts (3 · latent · moe_inter each) per MoE layer and the KDA
// recurrence (3 · H · D² per layer: Sᵀk, Sᵀq̃ and the rank-1 write); per MLA layer, row and
// attended position H · (2 · kv_lora + qk_rope) (score and output over the latent, §11.2); and
// vocab · hidden per logits row. A lower bound of the pass's work (norms, gates, softmax and the
// conv are left out), so a time ÷ its compute floor is never flattered. 0 for an engine without
// a prepared directory (Engine::WithSource).
double PassMultiplyAdds(const Engine& engine, int64_t rows, int64_t positions_before,
                        int64_t logits_rows);

// KV cache positions a run needs: the prompt plus every generated token fed back (gen − 1).
int64_t PositionsNeeded(int64_t prompt_len, int64_t gen);

}  // namespace k3::run
