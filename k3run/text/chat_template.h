// The K3 chat template ("XTML", ORIGINAL-ENGINE.md §6), rendered straight to token ids, and the
// parser of a completion. Tool calls, tool results and the structured-output instructions follow
// the released encoder (docs/TOOLS.md; the XTML helpers and the completion grammar live in
// k3run/text/tool_calls.h).
//
// Layout (control tokens in <|…|>, everything else is text):
//   open(tag, attrs)  = <|open|> tag attrs <|sep|>
//   close(tag)        = <|close|> tag <|sep|>
//   message           = open("message", ` role="R"`) body close("message") <|end_of_msg|>
//   assistant body    = open("think") reasoning close("think") open("response") content
//                       close("response") [tools section]   (thinking off: no think part)
//   thinking on       : a system message with ` role="system" type="thinking-effort"`
//                       whose body is kThinkingEffortBody with E = low|high|max
//   generation prompt : open("message", ` role="assistant"`) then open("think"), or
//                       open("response") with thinking off.
//   assistant with ids: the generation prompt then the ids as generated (ChatMessage::ids), so
//                       Render(messages + reply) extends exactly what the sequence was fed.
// Order of a prompt: the tool declaration (when tools are given), the thinking-effort message,
// the messages, the tool_choice / response_format instructions, the generation prompt.
// Control tokens are found by content in the tokenizer (never hard-coded ids: synthetic
// checkpoints place them elsewhere). Text segments (tag, attrs, content, the effort body: each
// one segment) are encoded with allow_special = false, so text such as "<|end_of_msg|>" typed
// by a user stays text.
// A completion (the ids generated after the generation prompt) parses as
//   thinking on : reasoning close(think) open(response) content close(response) [tools]
//                 close(message) END
//   thinking off: content close(response) [tools] close(message) END
// where END is exactly one of [EOS] and <|end_of_msg|> and nothing follows; an added (control)
// token anywhere inside reasoning or content is refused. Parse runs the incremental
// CompletionParser (tool_calls.h) over the whole completion: one grammar.
// Images: ChatImage above (user messages only).
// Non-goals: video, the Jinja template text itself (K3 ships none).
// Thread safety: immutable after Create.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "k3run/text/tokenizer.h"

namespace k3::run {

// An image in a user message (docs/VISION.md "Prompt"), rendered where it sits in the content as
//   <|media_begin|> "image {W}x{H}" <|media_content|> <|media_pad|> × tokens <|media_end|>
// with W×H the image's ORIGINAL size and `tokens` the rows its tower output has (one pad a row:
// the engine binds the rows to these positions, k3run/engine/media.h).
struct ChatImage {
  size_t at = 0;                   // byte offset in the message's content (0: before the text)
  uint32_t width = 0, height = 0;  // original size
  int64_t tokens = 0;              // rows = pads, ≥ 1
  // Where the image came from, for a chat transcript (k3run/app/chat_images.h); not rendered.
  std::string path = {};           // the file as the user named it ("" for request bytes)
  std::string file_hash = {};      // Hash128::Hex of XXH3-128 over the file's bytes
};

// One call of an assistant message (OpenAI's tool_calls[k]).
struct ToolCall {
  std::string id;         // OpenAI's call id ("call_…"); tool results name it
  std::string name;       // the function
  std::string arguments;  // JSON text, as OpenAI sends it (normally an object)
};

struct ChatMessage {
  std::string role;       // "system", "user", "assistant" or "tool"
  std::string content;
  std::string reasoning;  // assistant only; "" when none
  // assistant only: the ids the reply was generated as (after the generation prompt). When
  // present, Render emits the generation prompt then these ids, instead of re-encoding the text.
  std::vector<int32_t> ids = {};
  std::vector<ToolCall> tool_calls = {};  // assistant only: its calls, in order
  std::string tool_call_id = {};          // tool only: the call this result answers
  std::string name = {};                  // tool only, optional: the function's name
  std::vector<ChatImage> images = {};     // user only: its images, by ascending `at`
};

struct TemplateOptions {
  bool thinking = true;
  std::string effort = "max";  // low | high | max (medium is refused, as upstream's encoder)
  // The OpenAI `tools` array as JSON text ("" or "[]": none); rendered canonicalised (keys
  // sorted at every depth, no spaces: Python json.dumps(sort_keys, separators=(',', ':'))).
  std::string tools_json = {};
  std::string tool_choice = {};      // "" | auto | none | required | function (a named one)
  std::string response_format = {};  // "" | text | json_object | json_schema
  std::string response_schema_json = {};  // json_schema: the schema object (json_schema.schema)
};

// Refuses efforts other than low/high/max (kInvalid naming --thinking-effort).
Status ValidateEffort(std::string_view effort);

inline constexpr std::string_view kThinkingEffortBody =
    "`thinking_effort` guides on how much to think in your thinking channel (not including the "
    "response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
    "Now the system is invoked with `thinking_effort=";

struct ChatIds {
  int32_t open = -1, close = -1, sep = -1, end_of_msg = -1, eos = -1;
  // The media tokens; -1 when the tokenizer has none (then a message with images is refused).
  int32_t media_begin = -1, media_content = -1, media_end = -1, media_pad = -1;
};

struct Completion {
  std::string content;    // raw bytes of the response payload
  std::string reasoning;  // raw bytes of the think payload (thinking on)
  std::vector<ToolCall> tool_calls = {};  // the tools section's calls (arguments: JSON objects)
};

class ChatTemplate {
 public:
  // Looks up <|open|>, <|close|>, <|sep|>, <|end_of_msg|> and [EOS] by content; kInvalid naming
  // the missing one and `source` otherwise.
  static Result<ChatTemplate> Create(const tok::Tokenizer* tok, const std::string& source);

  // kInvalid for a tool message whose call cannot be found ("message M: …", M from 0), tools or
  // a schema that is not JSON (or tools not an array), an unknown tool_choice/response_format.
  Result<std::vector<int32_t>> RenderChecked(const std::vector<ChatMessage>& messages,
                                             const TemplateOptions& o,
                                             bool generation_prompt) const;
  // RenderChecked for callers whose input cannot fail (no tool messages, no JSON options):
  // its ids, or empty when it fails.
  std::vector<int32_t> Render(const std::vector<ChatMessage>& messages, const TemplateOptions& o,
                              bool generation_prompt) const;
  // A whole completion: kInvalid naming what and where unless it ends with END.
  Result<Completion> Parse(std::span<const int32_t> completion, bool thinking) const;

  const ChatIds& ids() const { return ids_; }
  const tok::Tokenizer& tokenizer() const { return *tok_; }
  bool IsControl(int32_t id) const { return tok::IsAddedToken(*tok_, id); }

 private:
  explicit ChatTemplate(const tok::Tokenizer* tok) : tok_(tok) {}

  const tok::Tokenizer* tok_;
  ChatIds ids_;
};

}  // namespace k3::run
