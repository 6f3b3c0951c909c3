// The K3 chat template ("XTML", ORIGINAL-ENGINE.md §6), rendered straight to token ids, and the
// parser of a completion.
//
// Layout (control tokens in <|…|>, everything else is text):
//   open(tag, attrs)  = <|open|> tag attrs <|sep|>
//   close(tag)        = <|close|> tag <|sep|>
//   message           = open("message", ` role="R"`) body close("message") <|end_of_msg|>
//   assistant body    = open("think") reasoning close("think") open("response") content
//                       close("response")          (thinking off: the response part only)
//   thinking on       : first a system message with ` role="system" type="thinking-effort"`
//                       whose body is kThinkingEffortBody with E = low|high|max
//   generation prompt : open("message", ` role="assistant"`) then open("think"), or
//                       open("response") with thinking off.
//   assistant with ids: the generation prompt then the ids as generated (ChatMessage::ids), so
//                       Render(messages + reply) extends exactly what the sequence was fed.
// Control tokens are found by content in the tokenizer (never hard-coded ids: synthetic
// checkpoints place them elsewhere). Text segments (tag, attrs, content, the effort body: each
// one segment) are encoded with allow_special = false, so text such as "<|end_of_msg|>" typed
// by a user stays text.
// A completion (the ids generated after the generation prompt) parses as
//   thinking on : reasoning close(think) open(response) content close(response) close(message) END
//   thinking off: content close(response) close(message) END
// where END is exactly one of [EOS] and <|end_of_msg|> and nothing follows; an added (control)
// token anywhere inside reasoning or content is refused.
// Non-goals: tool calls, media, the Jinja template text itself.
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

struct ChatMessage {
  std::string role;       // "system", "user" or "assistant"
  std::string content;
  std::string reasoning;  // assistant only; "" when none
  // assistant only: the ids the reply was generated as (after the generation prompt). When
  // present, Render emits the generation prompt then these ids, instead of re-encoding the text.
  std::vector<int32_t> ids = {};
};

struct TemplateOptions {
  bool thinking = true;
  std::string effort = "max";  // low | high | max (medium is refused, as upstream's encoder)
};

// Refuses efforts other than low/high/max (kInvalid naming --thinking-effort).
Status ValidateEffort(std::string_view effort);

inline constexpr std::string_view kThinkingEffortBody =
    "`thinking_effort` guides on how much to think in your thinking channel (not including the "
    "response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
    "Now the system is invoked with `thinking_effort=";

struct ChatIds {
  int32_t open = -1, close = -1, sep = -1, end_of_msg = -1, eos = -1;
};

struct Completion {
  std::string content;    // raw bytes of the response payload
  std::string reasoning;  // raw bytes of the think payload (thinking on)
};

class ChatTemplate {
 public:
  // Looks up <|open|>, <|close|>, <|sep|>, <|end_of_msg|> and [EOS] by content; kInvalid naming
  // the missing one and `source` otherwise.
  static Result<ChatTemplate> Create(const tok::Tokenizer* tok, const std::string& source);

  std::vector<int32_t> Render(const std::vector<ChatMessage>& messages, const TemplateOptions& o,
                              bool generation_prompt) const;
  Result<Completion> Parse(std::span<const int32_t> completion, bool thinking) const;

  const ChatIds& ids() const { return ids_; }
  // True for any added token of the tokenizer (the five above, [BOS], reserved ones, …).
  bool IsControl(int32_t id) const;

 private:
  explicit ChatTemplate(const tok::Tokenizer* tok) : tok_(tok) {}
  void Text(std::string_view text, std::vector<int32_t>* out) const;
  void Open(std::string_view tag, std::string_view attrs, std::vector<int32_t>* out) const;
  void Close(std::string_view tag, std::vector<int32_t>* out) const;
  void Message(const ChatMessage& m, std::string_view attrs, const TemplateOptions& o,
               std::vector<int32_t>* out) const;

  const tok::Tokenizer* tok_;
  ChatIds ids_;
};

}  // namespace k3::run
