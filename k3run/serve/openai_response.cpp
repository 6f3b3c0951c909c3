#include "k3run/serve/openai_response.h"

#include <cstdio>

#include <nlohmann/json.hpp>

namespace k3::run {
namespace {

using json = nlohmann::json;

// Generated text is sanitised already; `replace` keeps a dump from ever throwing.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string Sse(const json& j) { return "data: " + Dump(j) + "\n\n"; }

json Head(const ResponseMeta& m, bool chunk) {
  const bool chat = m.endpoint == Endpoint::kChat;
  return json{{"id", m.id},
              {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                              : "text_completion"},
              {"created", m.created},
              {"model", m.model}};
}

json UsageJson(const Outcome& o) {
  return json{{"prompt_tokens", o.prompt_tokens},
              {"completion_tokens", o.completion_tokens},
              {"total_tokens", o.prompt_tokens + o.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", o.cached_tokens}}}};
}

json K3Json(const Outcome& o) {
  return json{{"generated_ids", o.generated_ids}, {"prompt_cached_tokens", o.cached_tokens}};
}

}  // namespace

const char* OpenAiFinishReason(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
    case FinishReason::kContext:
      return "length";
    case FinishReason::kStopId:
    case FinishReason::kStopped:
      return "stop";
    case FinishReason::kCancelled:
    case FinishReason::kError:
      return nullptr;
  }
  return nullptr;
}

std::string CompletionBody(const ResponseMeta& m, const std::string& content,
                           const std::string& reasoning, const Outcome& o,
                           const std::vector<ToolCall>& calls) {
  json choice = {{"index", 0}, {"finish_reason", o.finish_reason}, {"logprobs", nullptr}};
  if (m.endpoint == Endpoint::kChat) {
    json message = {{"role", "assistant"}, {"content", content}};
    if (m.thinking) message["reasoning_content"] = reasoning;
    if (!calls.empty()) {
      if (content.empty()) message["content"] = nullptr;
      json list = json::array();
      for (const ToolCall& c : calls) {
        list.push_back({{"id", c.id},
                        {"type", "function"},
                        {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      }
      message["tool_calls"] = list;
    }
    choice["message"] = message;
  } else {
    choice["text"] = content;
  }
  json body = Head(m, false);
  body["choices"] = json::array({choice});
  body["usage"] = UsageJson(o);
  body["k3"] = K3Json(o);
  return Dump(body);
}

std::string DeltaChunk(const ResponseMeta& m, const TextDelta& d, bool role) {
  json choice = {{"index", 0}, {"finish_reason", nullptr}, {"logprobs", nullptr}};
  if (m.endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (role) delta["role"] = "assistant";
    if (role || !d.content.empty()) delta["content"] = d.content;
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.tool_calls.empty()) {
      json list = json::array();
      for (const ToolCallFragment& t : d.tool_calls) {
        json fn = {{"arguments", t.arguments}};
        json piece = {{"index", t.index}};
        if (!t.id.empty()) {
          piece["id"] = t.id;
          piece["type"] = "function";
          fn["name"] = t.name;
        }
        piece["function"] = fn;
        list.push_back(piece);
      }
      delta["tool_calls"] = list;
    }
    choice["delta"] = delta;
  } else {
    choice["text"] = d.content;
  }
  json chunk = Head(m, true);
  chunk["choices"] = json::array({choice});
  return Sse(chunk);
}

std::string FinalChunks(const ResponseMeta& m, const Outcome& o, bool usage) {
  json choice = {{"index", 0}, {"finish_reason", o.finish_reason}, {"logprobs", nullptr}};
  if (m.endpoint == Endpoint::kChat) {
    choice["delta"] = json::object();
  } else {
    choice["text"] = "";
  }
  json last = Head(m, true);
  last["choices"] = json::array({choice});
  last["k3"] = K3Json(o);
  std::string out = Sse(last);
  if (usage) {
    json u = Head(m, true);
    u["choices"] = json::array();
    u["usage"] = UsageJson(o);
    out += Sse(u);
  }
  return out + "data: [DONE]\n\n";
}

std::string ErrorChunk(const ApiError& e) { return "data: " + ErrorBody(e) + "\n\n"; }

std::string ModelsBody(const std::string& model, int64_t created) {
  json entry = {{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "k3"}};
  return Dump(json{{"object", "list"}, {"data", json::array({entry})}});
}

std::string MetricsText(const SchedulerStats& s, int64_t max_seqs, int64_t max_queue,
                        int64_t rejected) {
  std::string out;
  auto metric = [&out](const char* name, const char* type, const char* help, double value) {
    char line[128];
    std::snprintf(line, sizeof line, "%.17g", value);
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
           name + " " + line + "\n";
  };
  const auto d = [](auto v) { return static_cast<double>(v); };
  metric("k3_passes_total", "counter", "Passes over the weights.", d(s.passes));
  metric("k3_pass_rows_total", "counter", "Rows fed by all passes.", d(s.rows));
  metric("k3_prompt_rows_total", "counter", "Prompt rows fed by all passes.", d(s.prompt_rows));
  metric("k3_generated_tokens_total", "counter", "Tokens generated.", d(s.generated));
  metric("k3_weight_bytes_read_total", "counter", "Weight bytes read by all passes.",
         d(s.bytes_read));
  metric("k3_pass_seconds_total", "counter", "Wall time of all passes.", s.pass_seconds);
  metric("k3_requests_finished_total", "counter", "Requests finished.", d(s.finished));
  metric("k3_requests_rejected_total", "counter", "Requests refused with 429 (queue full).",
         d(rejected));
  metric("k3_prompt_cache_hits_total", "counter", "Requests started from a prompt snapshot.",
         d(s.prompt_cache_hits));
  metric("k3_prompt_cache_tokens_total", "counter", "Prompt tokens served by snapshots.",
         d(s.prompt_cache_tokens));
  metric("k3_prompt_cache_bytes", "gauge", "Bytes held by prompt snapshots.",
         d(s.prompt_cache_bytes));
  metric("k3_spec_verifications_total", "counter",
         "Decode rows that carried a draft (--spec).", d(s.spec_verifications));
  metric("k3_spec_drafted_tokens_total", "counter", "Draft tokens verified (--spec).",
         d(s.spec_drafted));
  metric("k3_spec_accepted_tokens_total", "counter", "Draft tokens kept (--spec).",
         d(s.spec_accepted));
  metric("k3_active_sequences", "gauge", "Slots holding a request.", d(s.active));
  metric("k3_queued_requests", "gauge", "Requests waiting for a slot.", d(s.queued));
  metric("k3_max_sequences", "gauge", "Slots (--max-seqs).", d(max_seqs));
  metric("k3_max_queue", "gauge", "Queue bound (--queue).", d(max_queue));
  // A summary: quantiles over the scheduler's recent window, sum and count over all gaps.
  char summary[512];
  std::snprintf(summary, sizeof summary,
                "# HELP k3_engine_idle_seconds The engine's idle time between passes while it "
                "had work (quantiles over the last %zu gaps).\n"
                "# TYPE k3_engine_idle_seconds summary\n"
                "k3_engine_idle_seconds{quantile=\"0.5\"} %.17g\n"
                "k3_engine_idle_seconds{quantile=\"0.99\"} %.17g\n"
                "k3_engine_idle_seconds{quantile=\"1\"} %.17g\n"
                "k3_engine_idle_seconds_sum %.17g\nk3_engine_idle_seconds_count %lld\n",
                Scheduler::kIdleWindow, s.idle_median_seconds, s.idle_p99_seconds,
                s.idle_max_seconds, s.idle_seconds, static_cast<long long>(s.idle_gaps));
  out += summary;
  return out;
}

}  // namespace k3::run
