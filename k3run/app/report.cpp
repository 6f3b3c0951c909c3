#include "k3run/app/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "common/progress.h"
#include "k3run/text/utf8.h"

namespace k3::run {
namespace {

using nlohmann::json;

json BytesJson(const ReadCounters& c) {
  return json{{"trunk", c.trunk},     {"experts", c.experts},
              {"embedding", c.embedding}, {"lm_head", c.lm_head},
              {"head", c.head},       {"prefetch_unused", c.prefetch_unused},
              {"total", c.total()}};
}

// What a set of steps adds up to.
struct Totals {
  ReadCounters bytes;
  SourceCounters source;
  PassTimes times;
  double seconds = 0;
  size_t steps = 0;
  void Add(const StepRecord& s) {
    bytes += s.bytes;
    source += s.source;
    times += s.times;
    seconds += s.seconds;
    ++steps;
  }
};

json SplitJson(const PassTimes& t, double per) {
  json j = json::object();
  for (const auto& [name, seconds] : PassSplit(t, per)) j[name] = seconds;
  return j;
}

Totals AllSteps(const std::vector<StepRecord>& steps) {
  Totals t;
  for (const StepRecord& s : steps) t.Add(s);
  return t;
}

// The steps that measure "a token": decode steps (index ≥ 1), or the only step there is.
Totals DecodeSteps(const std::vector<StepRecord>& steps) {
  Totals t;
  for (const StepRecord& s : steps) {
    if (s.index >= 1) t.Add(s);
  }
  if (t.steps == 0 && !steps.empty()) t.Add(steps.front());
  return t;
}

json NullableRate(uint64_t num, uint64_t den) {
  return den == 0 ? json(nullptr) : json(double(num) / double(den));
}

json PlanJson(const StreamingPlan& p) {
  return json{{"trunk_budget_bytes", p.trunk_budget},
              {"cache_budget_bytes", p.cache_budget},
              {"pinned_layers", p.pinned},
              {"pinned_bytes", p.pinned_bytes},
              {"ring_slots", p.ring_slots},
              {"ring_slot_bytes", p.ring_slot_bytes},
              {"expert_slots", p.expert_slots},
              {"expert_slot_bytes", p.expert_slot_bytes},
              {"lm_head_held", p.lm_head_held},
              {"lm_head_chunk_rows", p.lm_head_chunk_rows},
              {"policy", CachePolicyName(p.policy)},
              {"trunk_min_bytes", p.trunk_min},
              {"cache_min_bytes", p.cache_min},
              {"weights_bytes", p.bytes()}};
}

}  // namespace

std::vector<std::pair<std::string, double>> PassSplit(const PassTimes& t, double per) {
  const double d = per > 0 ? per : 1.0;
  return {{"experts", t.experts / d},
          {"trunk", t.trunk / d},
          {"attention", t.attention / d},
          {"waits", t.waits / d}};
}

std::string PassSplitText(const PassTimes& t, double per) {
  std::string out;
  char buf[64];
  for (const auto& [name, seconds] : PassSplit(t, per)) {
    std::snprintf(buf, sizeof buf, "%s%s %.1f ms", out.empty() ? "" : ", ", name.c_str(),
                  seconds * 1e3);
    out += buf;
  }
  return out;
}

PerToken MeasurePerToken(const RunReport& r) {
  PerToken t;
  const Totals d = DecodeSteps(r.steps);
  if (d.steps == 0) return t;
  const double n = double(d.steps);
  t.trunk_bytes = double(d.bytes.trunk) / n;
  t.lm_head_bytes = double(d.bytes.lm_head) / n;
  t.expert_bytes = double(d.bytes.experts) / n;
  t.other_bytes = double(d.bytes.embedding + d.bytes.head) / n;
  const double requests = double(d.source.expert_requests) / n;
  t.weight_bytes_used = double(r.weights_used_per_pass) + requests * double(r.expert_record_bytes);
  // bf16 trunk and lm_head: 2 bytes per weight; MXFP4 experts: 17 bytes per 32 weights.
  t.multiply_adds = double(r.weights_used_per_pass) / 2 +
                    requests * double(r.expert_record_bytes) * 32.0 / 17.0;
  return t;
}

std::optional<FloorResult> RunFloor(const RunReport& r) {
  if (!r.bandwidths || r.generated_ids.empty()) return std::nullopt;
  const Totals d = DecodeSteps(r.steps);
  if (d.steps == 0) return std::nullopt;
  FloorResult f;
  f.per_token = MeasurePerToken(r);
  f.floor = ComputeFloor(f.per_token, *r.bandwidths);
  f.seconds_per_token = d.seconds / double(d.steps);
  f.time_over_floor = f.floor.floor_s > 0 ? f.seconds_per_token / f.floor.floor_s : 0;
  return f;
}

std::optional<PrefillFloor> RunPrefillFloor(const RunReport& r) {
  if (!r.bandwidths || r.steps.empty()) return std::nullopt;
  const StepRecord& s = r.steps.front();
  const double peak = r.bandwidths->kernel_matmul_flops_per_s;
  if (s.index != 0 || s.tokens_in <= 0 || !(s.seconds > 0) || !(s.multiply_adds > 0) ||
      !(peak > 0) || !std::isfinite(peak)) {
    return std::nullopt;
  }
  PrefillFloor f;
  f.tokens = s.tokens_in;
  f.seconds = s.seconds;
  f.tokens_per_s = double(s.tokens_in) / s.seconds;
  f.flops = 2 * s.multiply_adds;
  f.peak_flops_per_s = peak;
  f.floor_s = f.flops / peak;
  f.time_over_floor = s.seconds / f.floor_s;
  return f;
}

std::optional<OwnRateFloor> RunOwnRateFloor(const RunReport& r) {
  if (r.generated_ids.empty()) return std::nullopt;
  const Totals all = AllSteps(r.steps);
  const Totals d = DecodeSteps(r.steps);
  const ReadCounters& b = d.bytes;
  if (d.steps == 0 || all.source.io_busy_seconds <= 0 || all.bytes.total() == 0 ||
      b.trunk + b.lm_head + b.experts == 0) {
    return std::nullopt;
  }
  const double n = double(d.steps);
  OwnRateFloor f;
  f.read_bytes_per_s = double(all.bytes.total()) / all.source.io_busy_seconds;
  f.needed_bytes_per_token = double(b.total() - b.prefetch_unused) / n;
  f.floor_s = f.needed_bytes_per_token / f.read_bytes_per_s;
  f.seconds_per_token = d.seconds / n;
  f.time_over_floor = f.seconds_per_token / f.floor_s;
  return f;
}

namespace {

json StepsJson(const std::vector<StepRecord>& steps) {
  json out = json::array();
  for (const StepRecord& s : steps) {
    out.push_back(json{{"index", s.index},
                       {"tokens_in", s.tokens_in},
                       {"drafted", s.drafted},
                       {"accepted", s.accepted},
                       {"mla_seconds", s.times.mla},
                       {"split", SplitJson(s.times, 1.0)},
                       {"token", s.token >= 0 ? json(s.token) : json(nullptr)},
                       {"seconds", s.seconds},
                       {"tokens_per_s", s.seconds > 0 ? json(double(s.tokens_in) / s.seconds)
                                                      : json(nullptr)},
                       {"bytes_read", BytesJson(s.bytes)},
                       {"expert_requests", s.source.expert_requests},
                       {"expert_hits", s.source.expert_hits},
                       {"expert_hit_rate",
                        NullableRate(s.source.expert_hits, s.source.expert_requests)},
                       {"expert_guesses", s.source.expert_guesses},
                       {"expert_guesses_used", s.source.expert_guesses_used},
                       {"io_busy_s", s.source.io_busy_seconds},
                       {"io_wait_s", s.source.io_wait_seconds}});
  }
  return out;
}

json TotalsJson(const RunReport& r) {
  const Totals all = AllSteps(r.steps);
  const double secs = all.seconds;
  const size_t n_gen = r.generated_ids.size();
  const double busy = all.source.io_busy_seconds, wait = all.source.io_wait_seconds;
  const Totals decode = DecodeSteps(r.steps);
  const uint64_t nd = std::max<uint64_t>(decode.steps, 1);
  const ReadCounters& db = decode.bytes;
  const ReadCounters per_token{db.trunk / nd,   db.experts / nd, db.embedding / nd,
                               db.lm_head / nd, db.head / nd,    db.prefetch_unused / nd};
  return json{
      {"seconds", secs},
      {"seconds_per_token", n_gen ? json(secs / double(n_gen)) : json(nullptr)},
      {"decode_seconds_per_token",
       r.steps.size() >= 2 ? json(decode.seconds / double(decode.steps)) : json(nullptr)},
      {"bytes_read", BytesJson(all.bytes)},
      {"bytes_per_token", BytesJson(per_token)},
      // Where a decode step's pass time went, seconds per decode step (model.h PassTimes).
      {"decode_split_per_token", SplitJson(decode.times, double(nd))},
      {"expert_hit_rate", NullableRate(all.source.expert_hits, all.source.expert_requests)},
      {"expert_guesses", all.source.expert_guesses},
      {"expert_guesses_used", all.source.expert_guesses_used},
      {"expert_guess_precision",
       NullableRate(all.source.expert_guesses_used, all.source.expert_guesses)},
      {"io_busy_s", busy},
      {"io_wait_s", wait},
      {"io_share", secs > 0 ? json(busy / secs) : json(nullptr)},
      {"io_hidden", busy > 0 ? json(std::max(0.0, busy - wait) / busy) : json(nullptr)}};
}

json FloorJson(const RunReport& r) {
  std::optional<FloorResult> f = RunFloor(r);
  if (!f) return nullptr;
  const Bandwidths& b = *r.bandwidths;
  return json{{"bandwidths",
               json{{"expert_bytes_per_s", b.expert_bytes_per_s},
                    {"expert_request_bytes", b.expert_request_bytes},
                    {"expert_queue_depth", b.expert_queue_depth},
                    {"trunk_bytes_per_s", b.trunk_bytes_per_s},
                    {"trunk_request_bytes", b.trunk_request_bytes},
                    {"combined_bytes_per_s", b.combined_bytes_per_s},
                    {"memory_bytes_per_s", b.memory_bytes_per_s},
                    {"kernel_flops_per_s", b.kernel_flops_per_s},
                    {"kernel_matmul_flops_per_s", b.kernel_matmul_flops_per_s},
                    {"backend", b.backend}}},
              {"per_token",
               json{{"trunk_bytes", f->per_token.trunk_bytes},
                    {"lm_head_bytes", f->per_token.lm_head_bytes},
                    {"expert_bytes", f->per_token.expert_bytes},
                    {"other_bytes", f->per_token.other_bytes},
                    {"weight_bytes_used", f->per_token.weight_bytes_used},
                    {"multiply_adds", f->per_token.multiply_adds}}},
              {"disk_s", f->floor.disk_s},
              {"memory_s", f->floor.memory_s},
              {"compute_s", f->floor.compute_s},
              {"floor_s", f->floor.floor_s},
              {"bound", f->floor.bound},
              {"seconds_per_token", f->seconds_per_token},
              {"time_over_floor", f->time_over_floor}};
}

json PrefillJson(const RunReport& r) {
  std::optional<PrefillFloor> p = RunPrefillFloor(r);
  if (!p) return nullptr;
  return json{{"tokens", p->tokens},
              {"seconds", p->seconds},
              {"tokens_per_s", p->tokens_per_s},
              {"flops", p->flops},
              {"peak_flops_per_s", p->peak_flops_per_s},
              {"compute_floor_s", p->floor_s},
              {"time_over_compute_floor", p->time_over_floor}};
}

json OwnRateFloorJson(const RunReport& r) {
  std::optional<OwnRateFloor> o = RunOwnRateFloor(r);
  if (!o) return nullptr;
  return json{{"read_bytes_per_s", o->read_bytes_per_s},
              {"needed_bytes_per_token", o->needed_bytes_per_token},
              {"floor_s", o->floor_s},
              {"seconds_per_token", o->seconds_per_token},
              {"time_over_floor", o->time_over_floor}};
}

json StreamingJson(const RunReport& r) {
  if (!r.streaming_plan) return nullptr;
  const StreamingStats& st = r.streaming_stats;
  return json{{"plan", PlanJson(*r.streaming_plan)},
              {"stats", json{{"expert_requests", st.expert_requests},
                             {"expert_hits", st.expert_hits},
                             {"expert_reads", st.expert_reads},
                             {"expert_evictions", st.expert_evictions},
                             {"waves", st.waves},
                             {"ring_loads", st.ring_loads},
                             {"ring_resyncs", st.ring_resyncs},
                             {"prefetches", st.prefetches},
                             {"prefetch_used", st.prefetch_used},
                             {"prefetch_failed", st.prefetch_failed}}},
              {"reader", r.reader_backend}};
}

}  // namespace

// Decode passes against decode tokens: every generated token but the first (which the prompt's
// pass chose) came from a decode pass, several per pass when drafts were kept.
json SpeculationJson(const RunReport& r) {
  const SpecStats& s = r.spec_stats;
  const auto decoded = static_cast<int64_t>(r.generated_ids.size()) - 1;
  const Totals d = DecodeSteps(r.steps);
  return json{{"spec", r.spec},
              {"decode_passes", s.passes},
              {"drafted", s.drafted},
              {"accepted", s.accepted},
              {"acceptance", s.drafted > 0 ? json(double(s.accepted) / double(s.drafted))
                                           : json(nullptr)},
              {"tokens_per_pass", s.passes > 0 && decoded > 0
                                      ? json(double(decoded) / double(s.passes))
                                      : json(nullptr)},
              {"bytes_read_per_decode_token",
               d.steps > 0 ? json(double(d.bytes.total()) / double(d.steps)) : json(nullptr)}};
}

namespace {

// Median, p99 and max in ms of `seconds` (by rank: the value at ceil(q·n) − 1 of the sorted).
json QuantilesMs(std::vector<double> seconds) {
  if (seconds.empty()) return json(nullptr);
  std::sort(seconds.begin(), seconds.end());
  auto at = [&](double q) {
    const auto n = static_cast<double>(seconds.size());
    const auto i = static_cast<size_t>(std::max(0.0, std::ceil(q * n) - 1));
    return seconds[std::min(i, seconds.size() - 1)] * 1e3;
  };
  return json{{"median_ms", at(0.5)}, {"p99_ms", at(0.99)}, {"max_ms", seconds.back() * 1e3}};
}

// The constraint's cost per token: computing each mask (its own thread, during the pass) and
// what choosing the token waited for it and spent applying it (the engine's thread).
json ConstraintJson(const RunReport& r) {
  if (!r.constraint) return json(nullptr);
  return json{{"tokens", r.constraint->wait_seconds.size()},
              {"mask_compute", QuantilesMs(r.constraint->compute_seconds)},
              {"choice_wait", QuantilesMs(r.constraint->wait_seconds)}};
}

}  // namespace

json ScaleOutJson(const RunReport& r) {
  if (!r.scale_out) return nullptr;
  const RemoteStats& so = *r.scale_out;
  const double tokens = double(std::max<size_t>(r.generated_ids.size(), 1));
  json ranks = json::array();
  for (const RemoteRankStats& p : so.per_rank) {
    ranks.push_back(json{{"rank", p.rank},
                         {"experts", p.experts},
                         {"rows", p.rows},
                         {"bytes_sent", p.bytes_sent},
                         {"bytes_received", p.bytes_received},
                         {"messages", p.messages},
                         {"bytes_sent_per_token", double(p.bytes_sent) / tokens},
                         {"bytes_received_per_token", double(p.bytes_received) / tokens}});
  }
  return json{{"ranks", so.ranks}, {"map", so.map}, {"send_s", so.send_seconds},
              {"wait_s", so.wait_seconds}, {"per_rank", ranks}};
}

std::string RenderReportJson(const RunReport& r) {
  json failures = json::array();
  for (const ExpertFailure& f : r.failures) {
    failures.push_back(json{{"layer", f.layer}, {"expert", f.expert}, {"reason", f.reason}});
  }
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
      {"images", json{{"count", r.images},
                      {"tokens", r.image_tokens},
                      {"tower_seconds", r.tower_seconds},
                      {"weights_load_seconds", r.vision_load_seconds}}},
      {"generated_ids", r.generated_ids},
      {"generated_text",
       r.generated_bytes ? json(SanitizeUtf8(*r.generated_bytes)) : json(nullptr)},
      {"stop_reason", !r.stop_reason.empty() ? r.stop_reason : r.stopped_by_id ? "stop-id" : "gen"},
      {"steps", StepsJson(r.steps)},
      {"totals", TotalsJson(r)},
      {"speculation", SpeculationJson(r)},
      {"memory_plan",
       json{{"positions", r.plan.positions},
            {"chunk", r.plan.chunk},
            {"budget_bytes", r.plan.budget},
            {"kv_cache_bytes", r.plan.kv_cache_bytes},
            {"state_bytes", r.plan.state_bytes},
            {"record_bytes", r.plan.record_bytes},
            {"sequences", r.plan.sequences},
            {"scratch_bytes", r.plan.scratch_bytes},
            {"weights_bytes", r.plan.weights_bytes},
            {"vision_bytes", r.plan.vision_bytes},
            {"total_bytes", r.plan.total()}}},
      {"streaming", StreamingJson(r)},
      {"floor", FloorJson(r)},
      {"prefill", PrefillJson(r)},
      {"own_rate_floor", OwnRateFloorJson(r)},
      {"peak_rss_bytes", r.peak_rss_bytes},
      {"experts_skipped", r.experts_skipped},
      {"expert_failures", failures},
      {"valid", r.experts_skipped == 0 && r.failures.empty()},
      {"constraint", ConstraintJson(r)},
      {"scale_out", ScaleOutJson(r)},
  };
  return j.dump(2) + "\n";
}

std::string NotTheModelNote(const RunReport& r) {
  return "NOTE: first " + std::to_string(r.layers_run) + " of " + std::to_string(r.n_layers) +
         " layers only (--layers): this is NOT the model";
}

std::string StepLine(const StepRecord& s) {
  char head[200];
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
  std::string line = head;
  if (s.seconds > 0) {
    std::snprintf(head, sizeof head, " (%.2f tok/s)", double(s.tokens_in) / s.seconds);
    line += head;
  }
  const ReadCounters& b = s.bytes;
  line += "  read " + FormatIecBytes(double(b.total())) + " (trunk " +
          FormatIecBytes(double(b.trunk)) + ", experts " + FormatIecBytes(double(b.experts)) +
          ", embedding " + FormatIecBytes(double(b.embedding)) + ", lm_head " +
          FormatIecBytes(double(b.lm_head)) + ", head " + FormatIecBytes(double(b.head));
  if (b.prefetch_unused > 0) {
    line += ", unused guesses " + FormatIecBytes(double(b.prefetch_unused));
  }
  line += ")";
  if (s.source.expert_requests > 0) {
    std::snprintf(head, sizeof head, "  expert hits %.1f %%",
                  100.0 * double(s.source.expert_hits) / double(s.source.expert_requests));
    line += head;
  }
  if (s.source.expert_guesses > 0) {
    std::snprintf(head, sizeof head, ", guessed %.1f %%",
                  100.0 * double(s.source.expert_guesses_used) /
                      double(std::max<uint64_t>(s.source.expert_requests, 1)));
    line += head;
  }
  return line;
}

// "\nscale-out: …" with --mpi on rank 0, else "".
static std::string ScaleOutLine(const RunReport& r) {
  if (!r.scale_out) return "";
  const RemoteStats& so = *r.scale_out;
  uint64_t sent = 0, received = 0;
  for (const RemoteRankStats& p : so.per_rank) {
    sent += p.bytes_sent;
    received += p.bytes_received;
  }
  const double tokens = double(std::max<size_t>(r.generated_ids.size(), 1));
  char buf[384];
  std::snprintf(buf, sizeof buf,
                "\nscale-out: %d ranks; to the other ranks %s/token, back %s/token; rank 0 "
                "handed rows over for %.3f s and waited for outputs %.3f s",
                so.ranks, FormatIecBytes(double(sent) / tokens).c_str(),
                FormatIecBytes(double(received) / tokens).c_str(), so.send_seconds,
                so.wait_seconds);
  return buf;
}

std::string SummaryLine(const RunReport& r) {
  char buf[512];
  std::string out;
  if (!r.steps.empty()) {
    const StepRecord& prefill = r.steps.front();
    std::snprintf(buf, sizeof buf, "prompt %lld token%s in %.3f s (%.2f tok/s)",
                  static_cast<long long>(prefill.tokens_in), prefill.tokens_in == 1 ? "" : "s",
                  prefill.seconds,
                  prefill.seconds > 0 ? double(prefill.tokens_in) / prefill.seconds : 0.0);
    out = buf;
    if (std::optional<PrefillFloor> p = RunPrefillFloor(r)) {
      out.pop_back();  // the ")" of the rate
      std::snprintf(buf, sizeof buf, ", %.2f× its compute floor)", p->time_over_floor);
      out += buf;
    }
  }
  if (r.images > 0) {
    std::snprintf(buf, sizeof buf,
                  " (%lld image%s: %lld image tokens, tower %.3f s, vision.bin read in %.3f s)",
                  static_cast<long long>(r.images), r.images == 1 ? "" : "s",
                  static_cast<long long>(r.image_tokens), r.tower_seconds,
                  r.vision_load_seconds);
    out += buf;
  }
  const size_t n = r.generated_ids.size();
  std::snprintf(buf, sizeof buf, "; generated %zu token%s", n, n == 1 ? "" : "s");
  out += buf;
  const Totals decode = DecodeSteps(r.steps);
  if (n > 1 && decode.seconds > 0) {
    const double per = decode.seconds / double(decode.steps);
    std::snprintf(buf, sizeof buf, ", decode %.4f s/token (%.2f tok/s)", per, 1.0 / per);
    out += buf;
  }
  if (decode.steps > 0) {
    out += "; read " + FormatIecBytes(double(decode.bytes.total()) / double(decode.steps)) +
           "/token";
  }
  out += "; peak RSS " + FormatIecBytes(double(r.peak_rss_bytes)) + " (plan " +
         FormatIecBytes(double(r.plan.total())) + ")";
  if (std::optional<FloorResult> f = RunFloor(r)) {
    std::snprintf(buf, sizeof buf, "; time / floor %.2f (%s-bound)", f->time_over_floor,
                  f->floor.bound.c_str());
    out += buf;
  }
  if (r.spec > 0 && r.spec_stats.passes > 0) {
    const SpecStats& sp = r.spec_stats;
    std::snprintf(buf, sizeof buf, "; spec %lld: %lld decode passes, %lld of %lld drafted kept, "
                  "%.2f tokens/pass", static_cast<long long>(r.spec),
                  static_cast<long long>(sp.passes), static_cast<long long>(sp.accepted),
                  static_cast<long long>(sp.drafted),
                  double(std::max<size_t>(n, 1) - 1) / double(sp.passes));
    out += buf;
  }
  out += ScaleOutLine(r);
  if (r.layers_run != r.n_layers) out += "\n" + NotTheModelNote(r);
  return out;
}

std::string SummaryLines(const RunReport& r) {
  const Totals all = AllSteps(r.steps);
  const double secs = all.seconds;
  const ReadCounters& t = all.bytes;
  const size_t n = r.generated_ids.size();
  char buf[512];
  std::snprintf(buf, sizeof buf, "%zu token%s in %.3f s", n, n == 1 ? "" : "s", secs);
  std::string out = buf;
  if (n > 0) {
    std::snprintf(buf, sizeof buf, " (%.4f s/token over every step, prefill included)",
                  secs / double(n));
    out += buf;
  }
  out += "; read " + FormatIecBytes(double(t.total())) + " (trunk " +
         FormatIecBytes(double(t.trunk)) + ", experts " + FormatIecBytes(double(t.experts)) +
         ", embedding " + FormatIecBytes(double(t.embedding)) + ", lm_head " +
         FormatIecBytes(double(t.lm_head)) +
         (t.prefetch_unused > 0
              ? ", unused guesses " + FormatIecBytes(double(t.prefetch_unused))
              : std::string()) +
         "); peak RSS " +
         FormatIecBytes(double(r.peak_rss_bytes)) + " (plan " +
         FormatIecBytes(double(r.plan.total())) + ")";
  const double busy = all.source.io_busy_seconds, wait = all.source.io_wait_seconds;
  if (busy > 0 && secs > 0) {
    std::snprintf(buf, sizeof buf,
                  "\nI/O: busy %.3f s = %.1f %% of wall clock; %.1f %% of it hidden behind "
                  "compute (engine waited %.3f s)",
                  busy, 100.0 * busy / secs, 100.0 * std::max(0.0, busy - wait) / busy, wait);
    out += buf;
  }
  if (all.source.expert_guesses > 0) {
    std::snprintf(buf, sizeof buf,
                  "\nread ahead: %llu guesses of the next layer's experts, %llu used (%.1f %% of "
                  "guesses, %.1f %% of expert requests)",
                  static_cast<unsigned long long>(all.source.expert_guesses),
                  static_cast<unsigned long long>(all.source.expert_guesses_used),
                  100.0 * double(all.source.expert_guesses_used) /
                      double(all.source.expert_guesses),
                  100.0 * double(all.source.expert_guesses_used) /
                      double(std::max<uint64_t>(all.source.expert_requests, 1)));
    out += buf;
  }
  const Totals decode = DecodeSteps(r.steps);
  if (decode.steps > 0) {
    out += "\nper decode step: " + PassSplitText(decode.times, double(decode.steps));
  }
  if (std::optional<FloorResult> f = RunFloor(r)) {
    const PerToken& p = f->per_token;
    std::snprintf(buf, sizeof buf,
                  "\nper decode token: %.4f s; read trunk %s, lm_head %s, experts %s; floor "
                  "%.4f s (%s-bound: disk %.4f, memory %.4f, compute %.4f); time / floor %.2f",
                  f->seconds_per_token, FormatIecBytes(p.trunk_bytes).c_str(),
                  FormatIecBytes(p.lm_head_bytes).c_str(), FormatIecBytes(p.expert_bytes).c_str(),
                  f->floor.floor_s, f->floor.bound.c_str(), f->floor.disk_s, f->floor.memory_s,
                  f->floor.compute_s, f->time_over_floor);
    out += buf;
  }
  if (std::optional<OwnRateFloor> o = RunOwnRateFloor(r)) {
    std::snprintf(buf, sizeof buf,
                  "\nat the engine's own read rate (%s/s while reading): needed %s per decode "
                  "token, floor %.4f s; time / that floor %.2f",
                  FormatIecBytes(o->read_bytes_per_s).c_str(),
                  FormatIecBytes(o->needed_bytes_per_token).c_str(), o->floor_s,
                  o->time_over_floor);
    out += buf;
  }
  out += ScaleOutLine(r);
  if (r.layers_run != r.n_layers) out += "\n" + NotTheModelNote(r);
  return out;
}

}  // namespace k3::run
