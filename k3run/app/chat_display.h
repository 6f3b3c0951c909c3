// What of a chat answer reaches stdout (k3run --chat): the reply text streamed as it is decided,
// control tokens and tag names never shown, and the thinking channel set apart from the answer:
// dimmed (ANSI SGR 2) on a terminal, between "<think>" and "</think>" lines otherwise, or not
// shown at all with --hide-thinking (it is still kept in --history). A tools section (tool
// calls) is not text either: the chat shows the parsed calls after the reply.
// Thread safety: one object per turn, used by one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "k3run/text/chat_template.h"
#include "k3run/text/tokenizer.h"
#include "k3run/text/utf8.h"

namespace k3::run {

struct ChatDisplayOptions {
  bool thinking = true;        // the completion starts in the thinking channel
  bool hide_thinking = false;  // --hide-thinking
  bool terminal = false;       // stdout is a terminal: dim instead of markers
};

inline constexpr std::string_view kDim = "\x1b[2m";
inline constexpr std::string_view kNoDim = "\x1b[0m";
inline constexpr std::string_view kThinkOpen = "<think>\n";
inline constexpr std::string_view kThinkClose = "\n</think>\n";

class ChatDisplay {
 public:
  ChatDisplay(const tok::Tokenizer& tok, const ChatTemplate& tmpl, ChatDisplayOptions o,
              std::function<Status(std::string_view)> out);
  // One generated id, in order.
  Status Token(int32_t id);
  // The end of the answer: closes an unfinished thinking block, flushes, ends the line.
  Status Finish();

 private:
  Status Text(std::string_view bytes);
  Status EndThinking();

  const tok::Tokenizer& tok_;
  const ChatTemplate& tmpl_;
  ChatDisplayOptions o_;
  std::function<Status(std::string_view)> out_;
  Utf8Chunker chunker_;
  bool in_tag_ = false;         // between <|open|>/<|close|> and <|sep|>: a tag name, not text
  bool tag_opens_ = false;      // that tag began with <|open|>
  std::string tag_;             // its text so far (the first 64 bytes or more)
  bool in_tools_ = false;       // inside open(tools) … close(tools): calls, not text
  bool in_thinking_;            // before the first <|close|> of a thinking completion
  bool thinking_shown_ = false; // the thinking block's opening was written
};

}  // namespace k3::run
