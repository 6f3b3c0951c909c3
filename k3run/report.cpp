#include "k3run/report.h"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "common/progress.h"
#include "k3run/utf8.h"

namespace k3::run {
namespace {

using nlohmann::json;

json BytesJson(const ReadCounters& c) {
  return json{{"trunk", c.trunk},     {"experts", c.experts}, {"embedding", c.embedding},
              {"lm_head", c.lm_head}, {"head", c.head},       {"total", c.total()}};
}

ReadCounters Sum(const std::vector<StepRecord>& steps) {
  ReadCounters t;
  for (const StepRecord& s : steps) {
    t.trunk += s.bytes.trunk;
    t.experts += s.bytes.experts;
    t.embedding += s.bytes.embedding;
    t.lm_head += s.bytes.lm_head;
    t.head += s.bytes.head;
  }
  return t;
}

double Seconds(const std::vector<StepRecord>& steps) {
  double s = 0;
  for (const StepRecord& r : steps) s += r.seconds;
  return s;
}

}  // namespace

std::string RenderReportJson(const RunReport& r) {
  json steps = json::array();
  for (const StepRecord& s : r.steps) {
    steps.push_back(json{{"index", s.index},
                         {"tokens_in", s.tokens_in},
                         {"token", s.token >= 0 ? json(s.token) : json(nullptr)},
                         {"seconds", s.seconds},
                         {"bytes_read", BytesJson(s.bytes)}});
  }
  json failures = json::array();
  for (const ExpertFailure& f : r.failures) {
    failures.push_back(json{{"layer", f.layer}, {"expert", f.expert}, {"reason", f.reason}});
  }
  const double secs = Seconds(r.steps);
  const size_t n_gen = r.generated_ids.size();
  json j = {
      {"format", "k3run-report"},
      {"version", 1},
      {"prepared", r.prepared},
      {"layers_run", r.layers_run},
      {"n_layers", r.n_layers},
      {"is_full_model", r.layers_run == r.n_layers},
      {"mode", r.recompute ? "recompute" : "incremental"},
      {"isa", r.isa},
      {"threads", r.threads},
      {"prompt_ids", r.prompt_ids},
      {"generated_ids", r.generated_ids},
      {"generated_text",
       r.generated_bytes ? json(SanitizeUtf8(*r.generated_bytes)) : json(nullptr)},
      {"stop_reason", r.stopped_by_id ? "stop-id" : "gen"},
      {"steps", steps},
      {"totals",
       json{{"seconds", secs},
            {"seconds_per_token", n_gen ? json(secs / double(n_gen)) : json(nullptr)},
            {"bytes_read", BytesJson(Sum(r.steps))}}},
      {"memory_plan",
       json{{"positions", r.plan.positions},
            {"kv_cache_bytes", r.plan.kv_cache_bytes},
            {"state_bytes", r.plan.state_bytes},
            {"weights_bytes", r.plan.weights_bytes},
            {"total_bytes", r.plan.total()}}},
      {"peak_rss_bytes", r.peak_rss_bytes},
      {"experts_skipped", r.experts_skipped},
      {"expert_failures", failures},
      {"valid", r.experts_skipped == 0 && r.failures.empty()},
  };
  return j.dump(2) + "\n";
}

std::string StepLine(const StepRecord& s) {
  char head[160];
  if (s.token >= 0) {
    std::snprintf(head, sizeof head, "step %lld (%s, %lld token%s): id %d  %.4f s",
                  static_cast<long long>(s.index), s.index == 0 ? "prefill" : "decode",
                  static_cast<long long>(s.tokens_in), s.tokens_in == 1 ? "" : "s", s.token,
                  s.seconds);
  } else {
    std::snprintf(head, sizeof head, "step %lld (prefill only, %lld token%s)  %.4f s",
                  static_cast<long long>(s.index), static_cast<long long>(s.tokens_in),
                  s.tokens_in == 1 ? "" : "s", s.seconds);
  }
  const ReadCounters& b = s.bytes;
  return std::string(head) + "  read " + FormatIecBytes(double(b.total())) + " (trunk " +
         FormatIecBytes(double(b.trunk)) + ", experts " + FormatIecBytes(double(b.experts)) +
         ", embedding " + FormatIecBytes(double(b.embedding)) + ", lm_head " +
         FormatIecBytes(double(b.lm_head)) + ", head " + FormatIecBytes(double(b.head)) + ")";
}

std::string SummaryLines(const RunReport& r) {
  const double secs = Seconds(r.steps);
  const ReadCounters t = Sum(r.steps);
  const size_t n = r.generated_ids.size();
  char buf[256];
  std::snprintf(buf, sizeof buf, "%zu token%s in %.3f s", n, n == 1 ? "" : "s", secs);
  std::string out = buf;
  if (n > 0) {
    std::snprintf(buf, sizeof buf, " (%.4f s/token, %.2f tok/s)", secs / double(n),
                  secs > 0 ? double(n) / secs : 0.0);
    out += buf;
  }
  out += "; read " + FormatIecBytes(double(t.total())) + " (trunk " +
         FormatIecBytes(double(t.trunk)) + ", experts " + FormatIecBytes(double(t.experts)) +
         ", embedding " + FormatIecBytes(double(t.embedding)) + ", lm_head " +
         FormatIecBytes(double(t.lm_head)) + "); peak RSS " +
         FormatIecBytes(double(r.peak_rss_bytes));
  if (r.layers_run != r.n_layers) {
    out += "\nNOTE: first " + std::to_string(r.layers_run) + " of " +
           std::to_string(r.n_layers) + " layers only (--layers): this is NOT the model";
  }
  return out;
}

}  // namespace k3::run
