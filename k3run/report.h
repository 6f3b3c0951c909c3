// k3run's report: one human line per step on stderr, and the JSON report (--out FILE).
//
// JSON (format "k3run-report", version 1): prepared, layers_run, n_layers, is_full_model (false
// with --layers N < n_layers: the numbers are NOT the model's), mode, isa, threads,
// prompt_ids, generated_ids (authoritative), generated_text (decoded bytes, invalid UTF-8 →
// U+FFFD; null without a tokenizer), stop_reason, steps [{index, tokens_in, token (null for a
// prefill-only step), seconds, bytes_read {trunk, experts, embedding, lm_head, head, total}}],
// totals {seconds, seconds_per_token, bytes_read {…}}, memory_plan {…}, peak_rss_bytes,
// experts_skipped, expert_failures [{layer, expert, reason}], valid.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "k3run/generate.h"
#include "k3run/plan.h"
#include "k3run/weights.h"

namespace k3::run {

struct RunReport {
  std::string prepared;
  int layers_run = 0;
  int n_layers = 0;
  bool recompute = false;
  std::string isa;
  int threads = 0;
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> generated_ids;
  std::optional<std::string> generated_bytes;  // raw; nullopt without a tokenizer
  bool stopped_by_id = false;
  std::vector<StepRecord> steps;
  MemoryPlan plan;
  uint64_t peak_rss_bytes = 0;
  int64_t experts_skipped = 0;
  std::vector<ExpertFailure> failures;
};

std::string RenderReportJson(const RunReport& r);

// "step 3 (decode, 1 token): id 417  0.012 s  read 1.25 MiB (trunk 0 B, experts 1.25 MiB, …)".
std::string StepLine(const StepRecord& s);
// The end-of-run summary line(s): s/token, bytes per token by kind, peak RSS.
std::string SummaryLines(const RunReport& r);

}  // namespace k3::run
