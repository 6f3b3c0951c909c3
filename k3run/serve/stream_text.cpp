#include "k3run/serve/stream_text.h"

namespace k3::run {

StreamText::StreamText(const tok::Tokenizer* tok, const ChatTemplate* tmpl, bool thinking,
                       std::vector<std::string> stops)
    : tok_(tok), tmpl_(tmpl), in_thinking_(tmpl != nullptr && thinking), stops_(std::move(stops)) {}

TextDelta StreamText::Token(int32_t id) {
  TextDelta d;
  if (tok_ == nullptr || stops_.stopped()) return d;
  if (tmpl_ != nullptr) {
    const ChatIds& c = tmpl_->ids();
    if (id == c.open || id == c.close) {
      in_tag_ = true;
      // The first tag after the generation prompt's open(think) is close(think).
      if (in_thinking_) {
        in_thinking_ = false;
        Reasoning(reasoning_utf8_.Flush(), &d);
      }
      return d;
    }
    if (id == c.sep) {
      in_tag_ = false;
      return d;
    }
    if (in_tag_ || tmpl_->IsControl(id)) return d;
  } else if (IsSpecialToken(*tok_, id)) {
    return d;
  }
  const std::string_view bytes = tok_->TokenBytes(id);
  if (in_thinking_) {
    Reasoning(reasoning_utf8_.Push(bytes), &d);
  } else {
    Content(content_utf8_.Push(stops_.Push(bytes)), &d);
  }
  return d;
}

TextDelta StreamText::Finish() {
  TextDelta d;
  Reasoning(reasoning_utf8_.Flush(), &d);
  Content(content_utf8_.Push(stops_.Flush()) + content_utf8_.Flush(), &d);
  return d;
}

void StreamText::Content(std::string_view bytes, TextDelta* d) {
  if (bytes.empty()) return;
  const std::string text = SanitizeUtf8(bytes);
  d->content += text;
  content_ += text;
}

void StreamText::Reasoning(std::string_view bytes, TextDelta* d) {
  if (bytes.empty()) return;
  const std::string text = SanitizeUtf8(bytes);
  d->reasoning += text;
  reasoning_ += text;
}

}  // namespace k3::run
