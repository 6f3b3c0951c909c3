// --batch (see batch.h): flags, the run on the scheduler, the output lines in input order, the
// dumps and the report.
#include "k3run/app/batch.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/log.h"
#include "k3run/app/interrupt.h"
#include "k3run/app/logits_dump.h"
#include "k3run/app/report.h"
#include "k3run/engine/generate.h"
#include "k3run/engine/image_input.h"
#include "k3run/engine/scheduler.h"
#include "k3run/engine/stop_rules.h"
#include "k3run/text/chat_template.h"

namespace k3::run {

void AddBatchFlags(CLI::App* app, RunOptions* o) {
  app->add_option_function<std::string>(
      "--batch", [o](const std::string& v) { o->batch = v; },
      "run every request of FILE (JSON Lines: {\"prompt\": TEXT} or {\"ids\": [..]}, optional "
      "\"gen\", and \"images\": [FILE..] with a prompt as --image; - is stdin) together, "
      "sharing passes; one JSON line per request on stdout, in input order");
  app->add_option_function<int64_t>(
         "--max-seqs", [o](const int64_t& v) { o->max_seqs = v; },
         "--batch, --serve: sequences held at once, each sharing every pass (default: what "
         "the memory plan allows)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
}

Status CheckBatchFlags(const RunOptions& o) {
  const char* other = o.chat                   ? "--chat"
                      : o.prompt               ? "--prompt"
                      : o.prompt_file          ? "--prompt-file"
                      : !o.ids.empty()         ? "--ids"
                      : o.recompute            ? "--recompute"
                      : !o.save_state.empty()  ? "--save-state"
                      : !o.load_state.empty()  ? "--load-state"
                      : !o.cache_trace_dir.empty() ? "--dump-cache-trace"
                      : !o.spec_oracle.empty() ? "--spec-oracle (one continuation: a prompt run's)"
                                               : nullptr;
  if (other != nullptr) {
    return Status::Invalid(std::string("--batch and ") + other + " cannot be combined: the "
                           "requests come from the --batch file");
  }
  if (o.gen < 0) return Status::Invalid("--gen " + std::to_string(o.gen) + ": must be >= 0");
  // Sampled or constrained lines decode without drafts (scheduler.h), so only the range applies.
  K3_RETURN_IF_ERROR(CheckSpec(o.spec, /*sampling=*/false));
  if (o.spec == 0 && o.spec_fixed) return Status::Invalid("--spec-fixed needs --spec N");
  return ValidateSamplerOptions(o.sampling);
}

std::string BatchInputName(const std::string& file) { return file == "-" ? "<stdin>" : file; }

Status CheckBatchInputs(const RunOptions& o, const std::vector<BatchInput>& inputs) {
  for (const BatchInput& in : inputs) {
    if (o.spec == 0 && !in.spec_oracle.empty()) {
      return Status::Invalid(BatchInputName(*o.batch) + ":" + std::to_string(in.line) +
                             ": \"spec_oracle\" needs --spec N");
    }
  }
  return Status::Ok();
}

Status ResolveBatchImages(const Engine& engine, const RunOptions& o,
                          std::vector<BatchInput>* inputs,
                          std::unique_ptr<VisionEncoder>* vision) {
  std::optional<ChatTemplate> chat;
  for (BatchInput& in : *inputs) {
    if (in.images.empty()) continue;
    const std::string where = BatchInputName(*o.batch) + ":" + std::to_string(in.line) + ": ";
    if (!*vision) {
      Result<std::unique_ptr<VisionEncoder>> v = VisionEncoder::Open(Env::Default(),
                                                                     engine.prepared());
      if (!v.ok()) return Status::Invalid(where + v.status().message());
      *vision = std::move(v).value();
      Result<ChatTemplate> t = ChatTemplate::Create(engine.tokenizer(), engine.prepared().dir);
      if (!t.ok()) return Status::Invalid(where + t.status().message());
      chat.emplace(std::move(t).value());
    }
    ChatMessage user;
    user.role = "user";
    user.content = in.text;
    for (const std::string& path : in.images) {
      Result<ImageInput> image = LoadImageFile(Env::Default(), path);
      if (!image.ok()) return Status::Invalid(where + image.status().message());
      user.images.push_back(ChatImageOf(*image, 0));
      in.image_inputs.push_back(std::move(image).value());
    }
    TemplateOptions t;
    t.thinking = !o.no_think;
    if (o.effort) t.effort = *o.effort;
    K3_RETURN_IF_ERROR(ValidateEffort(t.effort));
    Result<std::vector<int32_t>> ids = chat->RenderChecked({user}, t, /*generation_prompt=*/true);
    if (!ids.ok()) return Status::Invalid(where + ids.status().message());
    in.ids = std::move(ids).value();
  }
  return Status::Ok();
}

Result<int64_t> BatchPositions(const RunOptions& o, const std::vector<BatchInput>& inputs) {
  int64_t need = 1;
  const BatchInput* longest = &inputs.front();
  for (const BatchInput& in : inputs) {
    const int64_t n = PositionsNeeded(static_cast<int64_t>(in.ids.size()), in.gen);
    if (n > need) {
      need = n;
      longest = &in;
    }
  }
  if (!o.ctx) return need;
  if (*o.ctx < need) {
    return Status::Invalid("--ctx " + std::to_string(*o.ctx) + ": " +
                           BatchInputName(*o.batch) + ":" + std::to_string(longest->line) +
                           " needs " + std::to_string(need) + " positions (its prompt of " +
                           std::to_string(longest->ids.size()) + " ids + gen " +
                           std::to_string(longest->gen) + "); raise --ctx");
  }
  return *o.ctx;
}

int64_t BatchSequences(const Engine& engine, const RunOptions& o, size_t inputs) {
  // The plan holds every sequence's caches and states (PlanOptions::sequences: --max-seqs, or
  // 0 for as many as fit, at most kDefaultMaxSeqs).
  const int64_t want = o.max_seqs ? *o.max_seqs : engine.memory_plan().sequences;
  return std::max<int64_t>(1, std::min<int64_t>(want, static_cast<int64_t>(inputs)));
}

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::ordered_json;  // keys in the documented order

// One input's run: what a single run would print, its dump, its result.
struct Member {
  const BatchInput* in = nullptr;
  int64_t index = 0;
  std::optional<StopText> stops;
  std::string text;
  bool stopped_by_text = false;
  int64_t steps = 0;
  std::unique_ptr<LogitsDump> dump;
  Status dump_status;
  std::optional<RequestResult> result;
};

std::string StopReasonOf(const Member& m, const RunOptions& o, bool interrupted) {
  const RequestResult& r = *m.result;
  switch (r.reason) {
    case FinishReason::kLength: return "gen";
    case FinishReason::kStopId: {
      const int64_t last = r.generated.back();
      const bool asked = std::find(o.stop_ids.begin(), o.stop_ids.end(), last) != o.stop_ids.end();
      return asked ? "stop-id" : "end-token";
    }
    case FinishReason::kStopped:
      return m.stopped_by_text ? "stop-string" : m.dump_status.ok() ? "interrupted" : "error";
    case FinishReason::kContext: return "context";
    case FinishReason::kCancelled: return interrupted ? "interrupted" : "cancelled";
    case FinishReason::kError: return "error";
  }
  return "error";
}

// The error a member ends the run with (ok when none).
Status MemberStatus(const Member& m) {
  if (!m.result->status.ok()) return m.result->status;
  return m.dump_status;
}

std::string OutputLine(const Member& m, const RunOptions& o, bool tokenizer, bool interrupted) {
  json j;
  j["index"] = m.index;
  j["generated_ids"] = m.result->generated;
  j["text"] = tokenizer ? json(m.text) : json(nullptr);
  j["stop_reason"] = StopReasonOf(m, o, interrupted);
  const Status s = MemberStatus(m);
  if (!s.ok()) j["error"] = s.ToString();
  return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

// The batch's counters beyond the scheduler's: rows of the largest pass, wall time.
struct Totals {
  SchedulerStats stats;
  int64_t max_rows = 0;
  double seconds = 0;
  int64_t max_seqs = 0;
  int64_t pass_rows = 0;
};

// A decode pass's roofline floor (null without the start-up probes): the weight bytes it
// multiplies (the trunk and lm_head, and its distinct routed experts) at the probed memory
// bandwidth, and its multiply-adds (PassMultiplyAdds per row, each row attending one position:
// a lower bound) at the probed matmul peak (prefill widths, floor.h); the floor is the larger.
// What "decode tok/s at N sequences" can reach on this machine under the numerics contract.
json DecodeFloorJson(const Engine& engine, const BatchContext& ctx, const SchedulerStats& st) {
  if (!ctx.bandwidths || st.decode_passes == 0) return nullptr;
  const Bandwidths& b = *ctx.bandwidths;
  if (b.memory_bytes_per_s <= 0 || b.kernel_matmul_flops_per_s <= 0) return nullptr;
  const double passes = static_cast<double>(st.decode_passes);
  const double rows = static_cast<double>(st.decode_rows) / passes;
  const double experts = static_cast<double>(st.decode_experts_routed) / passes;
  const double bytes = static_cast<double>(ctx.pass_weights.weights_used) +
                       experts * static_cast<double>(ctx.pass_weights.expert_record);
  const double flops = 2.0 * rows * PassMultiplyAdds(engine, 1, 0, 1);
  const double memory_s = bytes / b.memory_bytes_per_s;
  const double compute_s = flops / b.kernel_matmul_flops_per_s;
  const double floor_s = std::max(memory_s, compute_s);
  return json{{"weight_bytes", bytes},
              {"distinct_experts", experts},
              {"flops", flops},
              {"memory_bytes_per_s", b.memory_bytes_per_s},
              {"peak_flops_per_s", b.kernel_matmul_flops_per_s},
              {"memory_s", memory_s},
              {"compute_s", compute_s},
              {"floor_s", floor_s},
              {"bound", memory_s >= compute_s ? "memory" : "compute"},
              {"time_over_floor", st.decode_seconds / passes / floor_s}};
}

// `floor`: DecodeFloorJson of the run (computed once, also for the summary).
std::string ReportJson(const Engine& engine, const RunOptions& o, const BatchContext& ctx,
                       const std::vector<Member>& members, const Totals& t, bool interrupted,
                       const json& floor) {
  const SchedulerStats& st = t.stats;
  const double passes = static_cast<double>(std::max<int64_t>(st.passes, 1));
  const double generated = static_cast<double>(std::max<int64_t>(st.generated, 1));
  json r;
  r["mode"] = "batch";
  r["prepared"] = o.prepared;
  r["isa"] = ctx.isa;
  r["plan"] = engine.memory_plan().Describe();
  r["max_seqs"] = t.max_seqs;
  r["pass_rows"] = t.pass_rows;
  r["passes"] = st.passes;
  r["rows_per_pass"] = {{"mean", static_cast<double>(st.rows) / passes}, {"max", t.max_rows}};
  r["prompt_rows"] = st.prompt_rows;
  r["generated_tokens"] = st.generated;
  r["tokens_per_pass"] = static_cast<double>(st.generated) / passes;
  r["bytes_read"] = st.bytes_read;
  r["bytes_per_generated_token"] = static_cast<double>(st.bytes_read) / generated;
  r["pass_seconds"] = st.pass_seconds;
  r["seconds"] = t.seconds;
  // Decode-only passes: bytes per generated token without the prompts' passes, and time ÷ the
  // own-rate floor: the bytes the tokens needed (unused guesses excluded) at the rate the reader
  // achieved while busy.
  const double needed = st.decode_bytes > 0
                            ? static_cast<double>(st.decode_bytes - st.decode_unused_bytes) /
                                  static_cast<double>(st.decode_bytes)
                            : 0.0;
  const double floor_s = st.decode_io_busy_seconds * needed;
  const double dpasses = static_cast<double>(std::max<int64_t>(st.decode_passes, 1));
  const double dtokens = static_cast<double>(std::max<int64_t>(st.decode_tokens, 1));
  r["decode"] = {
      {"passes", st.decode_passes},
      {"rows_per_pass", static_cast<double>(st.decode_rows) / dpasses},
      {"tokens_per_pass", static_cast<double>(st.decode_tokens) / dpasses},
      {"bytes_per_token", static_cast<double>(st.decode_bytes) / dtokens},
      {"seconds_per_pass", st.decode_seconds / dpasses},
      {"tokens_per_s", st.decode_seconds > 0 ? json(static_cast<double>(st.decode_tokens) /
                                                    st.decode_seconds)
                                             : json(nullptr)},
      {"own_rate_floor_seconds", floor_s},
      {"time_over_own_rate_floor", floor_s > 0 ? json(st.decode_seconds / floor_s)
                                               : json(nullptr)},
      {"split_seconds_per_pass", json::object()}};
  // Where a decode pass's time went (model.h PassTimes), seconds per pass.
  for (const auto& [name, seconds] : PassSplit(st.decode_times, dpasses)) {
    r["decode"]["split_seconds_per_pass"][name] = seconds;
  }
  r["decode"]["roofline_floor"] = floor;
  r["tokens_per_second"] = t.seconds > 0 ? static_cast<double>(st.generated) / t.seconds : 0.0;
  if (o.spec > 0) {
    // As a prompt run's "speculation" (report.cpp SpeculationJson), over every sequence.
    r["speculation"] = {
        {"spec", o.spec},
        {"verifications", st.spec_verifications},
        {"drafted", st.spec_drafted},
        {"accepted", st.spec_accepted},
        {"acceptance", st.spec_drafted > 0 ? json(static_cast<double>(st.spec_accepted) /
                                                  static_cast<double>(st.spec_drafted))
                                           : json(nullptr)}};
  }
  r["idle_between_passes"] = {{"gaps", st.idle_gaps},
                              {"seconds", st.idle_seconds},
                              {"median_seconds", st.idle_median_seconds},
                              {"p99_seconds", st.idle_p99_seconds},
                              {"max_seconds", st.idle_max_seconds}};
  json seqs = json::array();
  int64_t prompt_tokens = 0, sum_generated = 0, sum_passes = 0;
  for (const Member& m : members) {
    const RequestResult& res = *m.result;
    seqs.push_back({{"index", m.index},
                    {"line", m.in->line},
                    {"prompt_tokens", res.prompt_tokens},
                    {"generated", res.generated.size()},
                    {"passes", res.passes},
                    {"queued_seconds", res.queued_seconds},
                    {"first_token_seconds", res.first_token_seconds},
                    {"seconds", res.seconds},
                    {"stop_reason", StopReasonOf(m, o, interrupted)}});
    if (o.spec > 0) {
      seqs.back()["speculation"] = {{"decode_passes", res.spec.passes},
                                    {"drafted", res.spec.drafted},
                                    {"accepted", res.spec.accepted}};
    }
    prompt_tokens += res.prompt_tokens;
    sum_generated += static_cast<int64_t>(res.generated.size());
    sum_passes += res.passes;
  }
  r["sequences"] = seqs;
  r["total"] = {{"sequences", members.size()}, {"prompt_tokens", prompt_tokens},
                {"generated", sum_generated},   {"sequence_passes", sum_passes},
                {"passes", st.passes},          {"seconds", t.seconds}};
  r["experts_skipped"] = engine.experts_skipped();
  return r.dump(2) + "\n";
}

std::string SummaryLine(const Totals& t, size_t inputs, int64_t spec) {
  const SchedulerStats& st = t.stats;
  const double passes = static_cast<double>(std::max<int64_t>(st.passes, 1));
  char line[320];
  std::snprintf(line, sizeof line,
                "batch: %zu sequences (at most %lld at once), %lld tokens generated in %lld "
                "passes (%.2f rows/pass, max %lld; %.2f tokens/pass), %.2f tok/s, %.3f MB read "
                "per generated token, %.2f s",
                inputs, static_cast<long long>(t.max_seqs), static_cast<long long>(st.generated),
                static_cast<long long>(st.passes), static_cast<double>(st.rows) / passes,
                static_cast<long long>(t.max_rows), static_cast<double>(st.generated) / passes,
                t.seconds > 0 ? static_cast<double>(st.generated) / t.seconds : 0.0,
                st.generated > 0 ? static_cast<double>(st.bytes_read) / 1e6 /
                                       static_cast<double>(st.generated)
                                 : 0.0,
                t.seconds);
  std::string out = line;
  if (st.decode_passes > 0) {
    out += "; per decode pass: " +
           PassSplitText(st.decode_times, static_cast<double>(st.decode_passes));
  }
  if (spec > 0) {
    std::snprintf(line, sizeof line, "; spec %lld: %lld of %lld drafted kept",
                  static_cast<long long>(spec), static_cast<long long>(st.spec_accepted),
                  static_cast<long long>(st.spec_drafted));
    out += line;
  }
  return out;
}

// The request of one member: the single run's stop ids, its sampler seeded S + index, and the
// callbacks that collect its text and dump its logits.
Request MakeRequest(Engine* engine, const RunOptions& o, const BatchContext& ctx, Member* m,
                    const std::vector<int64_t>& stop_ids,
                    const std::function<void()>& on_finished) {
  const tok::Tokenizer* tokenizer = engine->tokenizer();
  const int64_t vocab = engine->config().vocab;
  Request r;
  r.prompt = m->in->ids;
  r.max_tokens = m->in->gen;
  r.sampling = o.sampling;
  r.seed = ctx.seed + static_cast<uint64_t>(m->index);
  r.stop_ids = stop_ids;
  if (!m->in->spec_oracle.empty()) r.drafter = ContinuationDrafter(m->in->spec_oracle);
  if (!m->in->image_inputs.empty()) {
    // At admission, on this (the engine's) thread: only admitted lines hold image rows.
    const auto pad = static_cast<int32_t>(engine->config().media_placeholder_token_id);
    r.encode_media = [in = m->in, vision = ctx.vision, pad](const MediaLookup& held) {
      return EncodeImages(vision, in->ids, 0, pad, in->image_inputs, nullptr, held);
    };
  }
  r.on_token = [m, &o, ctx, tokenizer, vocab](int32_t token, const float* logits) {
    if (!o.dump_logits.empty() && (o.dump_all || m->steps == 0) && m->dump_status.ok()) {
      if (!m->dump) {
        Result<std::unique_ptr<LogitsDump>> d =
            LogitsDump::Open(ctx.env, o.dump_logits + "." + std::to_string(m->index));
        if (d.ok()) m->dump = std::move(d).value();
        m->dump_status = d.status();
      }
      if (m->dump) m->dump_status = m->dump->Append(logits, vocab);
      if (!m->dump_status.ok()) return false;
    }
    ++m->steps;
    if (tokenizer && (o.show_special || !tok::IsAddedToken(*tokenizer, token))) {
      m->text += m->stops->Push(tokenizer->TokenBytes(token));
      if (m->stops->stopped()) {
        m->stopped_by_text = true;
        return false;
      }
    }
    return true;
  };
  r.on_done = [m, on_finished](const RequestResult& res) {
    m->result = res;
    if (!m->stopped_by_text && m->stops) m->text += m->stops->Flush();
    if (m->dump && m->dump_status.ok() && res.status.ok()) m->dump_status = m->dump->Finish();
    m->dump.reset();  // unfinished: its temporary file is removed
    on_finished();
  };
  return r;
}

// The final verdict: RUN INVALID (exit 4) first, then the first member's error.
Status Verdict(const Engine& engine, const std::vector<Member>& members) {
  Status first;
  for (const Member& m : members) {
    const Status s = MemberStatus(m);
    if (s.code() == Code::kUnreliable) return s;
    if (!s.ok() && first.ok()) first = s;
  }
  if (engine.experts_skipped() > 0 || !engine.Failures().empty()) {
    std::string msg = "RUN INVALID: " + std::to_string(engine.Failures().size()) +
                      " expert(s) could not be used (" + std::to_string(engine.experts_skipped()) +
                      " token-expert pairs skipped); the generated ids are not trustworthy:";
    for (const ExpertFailure& f : engine.Failures()) {
      msg += "\n  layer " + std::to_string(f.layer) + " expert " + std::to_string(f.expert) +
             ": " + f.reason;
    }
    return Status::Unreliable(msg);
  }
  return first;
}

}  // namespace

Status RunBatch(Engine* engine, const RunOptions& o, const std::vector<BatchInput>& inputs,
                const BatchContext& ctx) {
  std::vector<int64_t> stop_ids = o.stop_ids;
  if (!o.ignore_eos) {
    for (int64_t id : EndTokenIds(engine->tokenizer())) stop_ids.push_back(id);
  }
  std::vector<Member> members(inputs.size());
  SchedulerOptions so;
  so.max_seqs = BatchSequences(*engine, o, inputs.size());
  so.spec = o.spec;
  so.spec_fixed = o.spec_fixed;
  if (ctx.lines && o.spec > 0 && (o.sampling.sampling() || ctx.make_constraint)) {
    LogWarn(std::string("--spec: ") + (o.sampling.sampling() ? "sampled" : "constrained") +
            " requests decode without drafts (as a prompt run refuses --spec for them); the "
            "ids are those of a run without --spec");
  }
  Totals t;
  t.max_seqs = so.max_seqs;
  t.pass_rows = engine->chunk();
  if (ctx.lines && t.pass_rows < so.max_seqs) {
    LogWarn("passes of " + std::to_string(t.pass_rows) + " rows (--chunk) hold fewer than " +
            std::to_string(so.max_seqs) + " sequences' decode rows: they take turns");
  }
  // Output lines in input order: a member that finishes early waits for those before it.
  size_t next_out = 0;
  Status write_status;
  bool interrupted = false, cancelled = false;
  const bool tokenizer = engine->tokenizer() != nullptr;
  auto flush = [&] {
    while (next_out < members.size() && members[next_out].result) {
      if (write_status.ok()) {
        write_status = ctx.out(OutputLine(members[next_out], o, tokenizer, interrupted));
      }
      ++next_out;
    }
  };
  // After everything its callbacks touch: a scheduler destroyed with requests left (an early
  // return) still calls their on_done.
  Scheduler sched(engine, so);
  for (size_t i = 0; i < inputs.size(); ++i) {
    Member& m = members[i];
    m.in = &inputs[i];
    m.index = static_cast<int64_t>(i);
    m.stops.emplace(o.stop_strings);
    Request req = MakeRequest(engine, o, ctx, &m, stop_ids, flush);
    if (ctx.make_constraint) {
      K3_ASSIGN_OR_RETURN(req.constraint, ctx.make_constraint());
    }
    K3_RETURN_IF_ERROR(sched.Submit(std::move(req)).status());
  }
  const auto t0 = Clock::now();
  int64_t rows = 0;
  while (true) {
    // Ctrl-C, or stdout gone: end every request (their lines say why, as far as they go).
    if (!cancelled && (Interrupted() || !write_status.ok())) {
      cancelled = true;
      interrupted = Interrupted();
      if (interrupted) LogWarn("interrupted (Ctrl-C): ending every request");
      sched.CancelAll();
    }
    K3_ASSIGN_OR_RETURN(bool worked, sched.RunPass());
    if (!worked) break;
    const int64_t now = sched.Stats().rows;
    t.max_rows = std::max(t.max_rows, now - rows);
    rows = now;
  }
  t.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  t.stats = sched.Stats();
  K3_RETURN_IF_ERROR(write_status);
  const json floor = DecodeFloorJson(*engine, ctx, t.stats);
  if (!o.out.empty()) {
    K3_RETURN_IF_ERROR(WriteFileAtomic(ctx.env, o.out,
                                       ReportJson(*engine, o, ctx, members, t, interrupted,
                                                  floor)));
  }
  if (ctx.lines) {
    LogInfo(SummaryLine(t, inputs.size(), so.spec));
    if (!floor.is_null()) {
      char line[256];
      std::snprintf(line, sizeof line,
                    "decode pass: %.1f ms for %.2f rows; roofline floor %.1f ms (%s-bound: "
                    "memory %.1f, compute %.1f); time / floor %.2f",
                    t.stats.decode_seconds / static_cast<double>(t.stats.decode_passes) * 1e3,
                    static_cast<double>(t.stats.decode_rows) /
                        static_cast<double>(t.stats.decode_passes),
                    floor["floor_s"].get<double>() * 1e3,
                    floor["bound"].get<std::string>().c_str(),
                    floor["memory_s"].get<double>() * 1e3, floor["compute_s"].get<double>() * 1e3,
                    floor["time_over_floor"].get<double>());
      LogInfo(line);
    }
  }
  return Verdict(*engine, members);
}

}  // namespace k3::run
