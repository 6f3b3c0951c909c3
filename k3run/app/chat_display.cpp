#include "k3run/app/chat_display.h"

namespace k3::run {

ChatDisplay::ChatDisplay(const tok::Tokenizer& tok, const ChatTemplate& tmpl,
                         ChatDisplayOptions o, std::function<Status(std::string_view)> out)
    : tok_(tok), tmpl_(tmpl), o_(o), out_(std::move(out)), in_thinking_(o.thinking) {}

Status ChatDisplay::Token(int32_t id) {
  const ChatIds& c = tmpl_.ids();
  if (id == c.open || id == c.close) {
    in_tag_ = true;
    tag_opens_ = id == c.open;
    tag_.clear();
    // The first tag after the generation prompt's open(think) is close(think).
    if (in_thinking_) return EndThinking();
    return Status::Ok();
  }
  if (id == c.sep) {
    in_tag_ = false;
    // A tools section is the calls, shown by the chat once parsed (never as text).
    if (tag_ == "tools") in_tools_ = tag_opens_;
    return Status::Ok();
  }
  if (in_tag_) {
    if (tag_.size() < 64) tag_ += tok_.TokenBytes(id);
    return Status::Ok();
  }
  if (in_tools_ || tmpl_.IsControl(id)) return Status::Ok();
  if (in_thinking_ && o_.hide_thinking) return Status::Ok();
  if (in_thinking_ && !thinking_shown_) {
    thinking_shown_ = true;
    K3_RETURN_IF_ERROR(out_(o_.terminal ? kDim : kThinkOpen));
  }
  return Text(tok_.TokenBytes(id));
}

Status ChatDisplay::Text(std::string_view bytes) {
  const std::string ready = chunker_.Push(bytes);
  return ready.empty() ? Status::Ok() : out_(ready);
}

Status ChatDisplay::EndThinking() {
  in_thinking_ = false;
  if (!thinking_shown_) return Status::Ok();
  const std::string rest = chunker_.Flush();
  // On a terminal the dim ends and the answer starts on a new line; elsewhere the marker line.
  return out_(rest + (o_.terminal ? std::string(kNoDim) + "\n" : std::string(kThinkClose)));
}

Status ChatDisplay::Finish() {
  if (in_thinking_) K3_RETURN_IF_ERROR(EndThinking());
  return out_(chunker_.Flush() + "\n");
}

}  // namespace k3::run
