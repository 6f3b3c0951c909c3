// The OpenAI response bodies of `k3run --serve` (docs/SERVER.md): whole responses, the SSE
// chunks of a streamed one, /v1/models and the Prometheus text of /metrics.
// Every response of a completion carries a non-standard "k3" object (generated_ids, the prompt's
// tokens fed and served from the prompt cache): clients ignore it, tests compare ids with it.
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "k3run/serve/openai_request.h"
#include "k3run/serve/stream_text.h"
#include "k3run/engine/scheduler.h"

namespace k3::run {

// What every body of one response repeats.
struct ResponseMeta {
  std::string id;       // chatcmpl-N / cmpl-N
  int64_t created = 0;  // Unix seconds
  std::string model;
  Endpoint endpoint = Endpoint::kChat;
  bool thinking = false;  // chat with thinking on: reasoning_content is present
};

// The end of a request, as the response reports it.
struct Outcome {
  const char* finish_reason = "stop";  // "stop" | "length" | "tool_calls"
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;           // prompt tokens the prompt cache served
  std::vector<int32_t> generated_ids;
};

// "stop" (an end token, a stop id or string) or "length" (max_tokens, the context); nullptr for
// kCancelled and kError (the request did not complete).
const char* OpenAiFinishReason(FinishReason r);

// The whole response of a non-streamed request; `calls` become message.tool_calls (and the
// content null when it is empty, as OpenAI answers a pure call).
std::string CompletionBody(const ResponseMeta& m, const std::string& content,
                           const std::string& reasoning, const Outcome& o,
                           const std::vector<ToolCall>& calls = {});
// One SSE event "data: {...}\n\n" carrying a delta; `role`: the first chunk of a chat stream.
std::string DeltaChunk(const ResponseMeta& m, const TextDelta& d, bool role);
// The last chunk with the finish reason (and the "k3" ids); with `usage` also the usage chunk
// (empty choices, as stream_options.include_usage asks); then "data: [DONE]".
std::string FinalChunks(const ResponseMeta& m, const Outcome& o, bool usage);
// An error inside a stream: "data: {"error": {...}}\n\n" (no [DONE]: the stream did not finish).
std::string ErrorChunk(const ApiError& e);
inline constexpr const char kKeepAlive[] = ": keep-alive\n\n";

std::string ModelsBody(const std::string& model, int64_t created);
// Prometheus text exposition (version 0.0.4) of the scheduler's counters.
std::string MetricsText(const SchedulerStats& s, int64_t max_seqs, int64_t max_queue,
                        int64_t rejected);

}  // namespace k3::run
