// The text of a server response, decided token by token (docs/SERVER.md): what `k3run --serve`
// sends as deltas while a request generates, and as the whole text at its end.
//
// The same rules as the CLI's output (k3run/engine/stop_rules.h): special tokens are not text;
// stop strings are matched across token boundaries and never shown (StopText holds back every
// byte that may still begin one); a UTF-8 sequence split over tokens is held until complete
// (Utf8Chunker). Deltas are valid UTF-8 for JSON: bytes that never form UTF-8 become U+FFFD
// (SanitizeUtf8), so the concatenated deltas equal the final text.
// Chat completions have two channels, as `--chat` displays them (k3run/app/chat_display.h):
// with thinking on, the completion starts in the thinking channel (`reasoning_content`) and
// the first <|open|>/<|close|> tag ends it; tag names between <|open|>/<|close|> and <|sep|>
// and control tokens are never text. Stop strings apply to the answer (`content`) only.
// Thread safety: one object per request, used by one thread at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "k3run/engine/stop_rules.h"
#include "k3run/text/chat_template.h"
#include "k3run/text/tokenizer.h"
#include "k3run/text/tool_calls.h"
#include "k3run/text/utf8.h"

namespace k3::run {

struct TextDelta {
  std::string content;
  std::string reasoning;
  // Streamed pieces of tool calls (OpenAI's delta.tool_calls[k], text/tool_calls.h): the first
  // piece of a call carries its id and name, later ones only argument fragments.
  std::vector<ToolCallFragment> tool_calls;
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
};

// Appends `d` to `into`, merging a fragment into the last piece of the same call.
void AppendDelta(TextDelta* into, TextDelta d);

// With tools (a chat request that declares them), ids go through the template's completion
// parser (k3run/text/tool_calls.h) instead: its content and reasoning follow the rules above, and
// the tools section becomes tool-call deltas, never text. Should the model's output stop
// following the template, the parser's calls so far stand and the rest is shown as text by the
// rules above (a warning is logged), so a stray control token costs no answer.
class StreamText {
 public:
  // `tmpl` null: a plain completion (one channel, no tags). `thinking`: a chat completion that
  // starts in the thinking channel. `tools`: parse tool calls (needs `tmpl`), their ids seeded by
  // `call_id_seed`.
  StreamText(const tok::Tokenizer* tok, const ChatTemplate* tmpl, bool thinking,
             std::vector<std::string> stops, bool tools = false, uint64_t call_id_seed = 0);
  // The text this generated id makes showable now (both channels).
  TextDelta Token(int32_t id);
  // At the end: whatever was held back (none after a stop string matched).
  TextDelta Finish();
  // A stop string matched: generation should end.
  bool stopped() const { return stops_.stopped(); }
  // Everything shown so far (the deltas concatenated).
  const std::string& content() const { return content_; }
  const std::string& reasoning() const { return reasoning_; }
  // With tools, after Finish: the calls (arguments: JSON objects) and true when the message
  // ended with its tools section (OpenAI's finish_reason "tool_calls").
  const std::vector<ToolCall>& tool_calls() const { return calls_; }
  bool ended_with_calls() const { return ended_with_calls_; }

 private:
  TextDelta Plain(int32_t id);  // the rules without a parser
  void Content(std::string_view bytes, TextDelta* d);
  void Reasoning(std::string_view bytes, TextDelta* d);
  void FromParser(CompletionDelta cd, TextDelta* d);

  const tok::Tokenizer* tok_;
  const ChatTemplate* tmpl_;
  bool in_thinking_;
  bool in_tag_ = false;
  StopText stops_;
  Utf8Chunker content_utf8_;
  Utf8Chunker reasoning_utf8_;
  std::string content_;
  std::string reasoning_;
  std::optional<CompletionParser> parser_;  // with tools, until the output stops following it
  std::vector<ToolCall> calls_;
  bool ended_with_calls_ = false;
};

}  // namespace k3::run
