// The OpenAI request bodies `k3run --serve` accepts (docs/SERVER.md), parsed into a typed
// request, and the OpenAI-style error body for everything it refuses.
//
// Parsing is strict on what it uses and lenient on the rest, as OpenAI clients expect: unknown
// fields are ignored, a JSON null counts as "not given", and a used field of the wrong type or
// value is a 400 naming it (`param`). What k3 cannot do yet (logprobs, n > 1, echo, ...)
// is a 400 "not supported" rather than silently ignored, so a client never gets an answer that
// quietly lacks what it asked for.
// Non-goals: checks that need the model (ids < vocab, the context, the model name): the server
// does those after parsing.
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "k3run/engine/sampler.h"
#include "k3run/text/chat_template.h"

namespace k3::run {

// An OpenAI error: the HTTP status and the fields of {"error": {...}}.
struct ApiError {
  int http = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" → null
  std::string code;   // "" → null
};

// {"error":{"message","type","param","code"}}
std::string ErrorBody(const ApiError& e);
ApiError BadRequest(std::string message, std::string param = "", std::string code = "");

enum class Endpoint { kChat, kCompletion };

// One function of `tools`: its name and its parameters schema (JSON text; `{"type":"object",
// "properties":{}}` when not given).
struct ToolSpec {
  std::string name;
  std::string parameters;
};

// An image part of a chat message ({"type": "image_url", "image_url": {"url": ...}}), not yet
// decoded (server_images.h does that, with the server's limits): where it goes and its URL.
struct ApiImagePart {
  size_t message = 0;  // index in `messages`
  int index = 1;       // 1-based among the images of its message
  size_t at = 0;       // byte offset in the message's content (its text parts joined)
  std::string url;     // a data: URL (remote URLs are refused while parsing)
};

struct ApiRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;                     // "" when not given
  std::vector<ChatMessage> messages;     // chat
  std::vector<ApiImagePart> images;      // chat: image parts of user messages, in order
  TemplateOptions tmpl;                  // chat: thinking and effort (reasoning_effort)
  std::optional<std::string> prompt;     // completion: text
  std::vector<int32_t> prompt_ids;       // completion: ids (when `prompt` is not text)
  std::optional<int64_t> max_tokens;     // ≥ 1; default: up to the context
  SamplerOptions sampling;               // temperature always set (OpenAI's default 1)
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;         // non-empty strings
  bool stream = false;
  bool include_usage = false;            // stream_options.include_usage
  bool ignore_eos = false;               // k3/llama.cpp extension: do not stop at end tokens
  // Tool calls and structured output (chat only; openai_tools.h). tmpl carries what the
  // template renders of them (the declarations, the tool_choice and response_format messages).
  std::vector<ToolSpec> tools;
  std::string tool_choice = "none";      // none | auto | required | function (a named one)
  std::string tool_choice_name;          // tool_choice "function": its name
  bool parallel_tool_calls = true;
  std::string response_format;           // "" (text) | json_object | json_schema
  std::string response_schema;           // json_schema: the schema (JSON text)
};

// The largest request body the server reads (413 past it): a long conversation in JSON is far
// below this, and the bound keeps one client from making the server buffer arbitrary bytes.
inline constexpr size_t kMaxBodyBytes = size_t{4} << 20;
// The most stop strings a request may give (OpenAI allows 4).
inline constexpr size_t kMaxStopStrings = 16;

// Parses and validates a body for `endpoint`. On failure returns false and fills *error.
bool ParseApiRequest(std::string_view body, Endpoint endpoint, ApiRequest* out, ApiError* error);

// reasoning_effort → the chat template's options: "none"/"minimal" → thinking off; "low" → low;
// "medium"/"high" → high (the template has no medium); "max" → max. nullopt for other values.
std::optional<TemplateOptions> MapReasoningEffort(std::string_view effort);

}  // namespace k3::run
