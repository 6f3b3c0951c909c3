#include "k3run/serve/stream_text.h"

#include "common/log.h"

namespace k3::run {

void AppendDelta(TextDelta* into, TextDelta d) {
  into->content += d.content;
  into->reasoning += d.reasoning;
  for (ToolCallFragment& t : d.tool_calls) {
    if (!into->tool_calls.empty() && into->tool_calls.back().index == t.index && t.id.empty()) {
      into->tool_calls.back().arguments += t.arguments;
    } else {
      into->tool_calls.push_back(std::move(t));
    }
  }
}

StreamText::StreamText(const tok::Tokenizer* tok, const ChatTemplate* tmpl, bool thinking,
                       std::vector<std::string> stops, bool tools, uint64_t call_id_seed)
    : tok_(tok), tmpl_(tmpl), in_thinking_(tmpl != nullptr && thinking), stops_(std::move(stops)) {
  if (tools && tmpl != nullptr) parser_.emplace(*tmpl, CompletionParserOptions{thinking, call_id_seed});
}

void StreamText::FromParser(CompletionDelta cd, TextDelta* d) {
  Reasoning(reasoning_utf8_.Push(cd.reasoning), d);
  if (!cd.content.empty()) Content(content_utf8_.Push(stops_.Push(cd.content)), d);
  for (ToolCallFragment& f : cd.tool_calls) d->tool_calls.push_back(std::move(f));
}

TextDelta StreamText::Token(int32_t id) {
  TextDelta d;
  if (tok_ == nullptr || stops_.stopped()) return d;
  if (!parser_) return Plain(id);
  FromParser(parser_->Feed(id), &d);
  if (parser_->malformed()) {
    const ParsedCompletion p = parser_->Finish();
    LogWarn("the model's output left the chat template (" + p.error +
            "); the rest is shown as text");
    calls_ = p.tool_calls;
    parser_.reset();
    // The plain rules from here: the text so far was the answer's (thinking ended with it).
    in_thinking_ = false;
    in_tag_ = false;
  }
  return d;
}

TextDelta StreamText::Plain(int32_t id) {
  TextDelta d;
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
  } else if (tok::IsAddedToken(*tok_, id)) {
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
  if (parser_) {
    ParsedCompletion p = parser_->Finish();
    FromParser(std::move(p.tail), &d);
    calls_ = std::move(p.tool_calls);
    ended_with_calls_ = p.finish == FinishKind::kToolCalls;
    parser_.reset();
  }
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
