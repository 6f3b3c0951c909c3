#include "k3run/text/chat_template.h"

#include <algorithm>
#include <optional>

namespace k3::run {
namespace {

std::string Describe(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

}  // namespace

Status ValidateEffort(std::string_view effort) {
  if (effort == "low" || effort == "high" || effort == "max") return Status::Ok();
  return Status::Invalid("--thinking-effort " + std::string(effort) +
                         ": must be low, high or max (medium is refused, as by the official "
                         "encoder)");
}

Result<ChatTemplate> ChatTemplate::Create(const tok::Tokenizer* tok, const std::string& source) {
  ChatTemplate t(tok);
  const struct {
    std::string_view content;
    int32_t* id;
  } wanted[] = {{"<|open|>", &t.ids_.open},
                {"<|close|>", &t.ids_.close},
                {"<|sep|>", &t.ids_.sep},
                {"<|end_of_msg|>", &t.ids_.end_of_msg},
                {"[EOS]", &t.ids_.eos}};
  for (const auto& w : wanted) {
    const std::optional<int32_t> id = tok->SpecialId(w.content);
    if (!id) {
      return Status::Invalid(source + ": the tokenizer has no added token \"" +
                             std::string(w.content) +
                             "\"; the K3 chat template needs it (is this a K3 tokenizer?)");
    }
    *w.id = *id;
  }
  return t;
}

bool ChatTemplate::IsControl(int32_t id) const {
  const std::string_view bytes = tok_->TokenBytes(id);
  if (bytes.empty()) return false;
  const std::optional<int32_t> special = tok_->SpecialId(bytes);
  return special && *special == id;
}

void ChatTemplate::Text(std::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  const std::vector<int32_t> ids = tok_->Encode(text, /*allow_special=*/false);
  out->insert(out->end(), ids.begin(), ids.end());
}

void ChatTemplate::Open(std::string_view tag, std::string_view attrs,
                        std::vector<int32_t>* out) const {
  out->push_back(ids_.open);
  Text(tag, out);
  Text(attrs, out);
  out->push_back(ids_.sep);
}

void ChatTemplate::Close(std::string_view tag, std::vector<int32_t>* out) const {
  out->push_back(ids_.close);
  Text(tag, out);
  out->push_back(ids_.sep);
}

void ChatTemplate::Message(const ChatMessage& m, std::string_view attrs, const TemplateOptions& o,
                           std::vector<int32_t>* out) const {
  Open("message", attrs, out);
  if (m.role == "assistant" && !m.ids.empty()) {
    Open(o.thinking ? "think" : "response", "", out);
    out->insert(out->end(), m.ids.begin(), m.ids.end());
    return;
  }
  if (m.role == "assistant") {
    if (o.thinking) {
      Open("think", "", out);
      Text(m.reasoning, out);
      Close("think", out);
    }
    Open("response", "", out);
    Text(m.content, out);
    Close("response", out);
  } else {
    Text(m.content, out);
  }
  Close("message", out);
  out->push_back(ids_.end_of_msg);
}

std::vector<int32_t> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                          const TemplateOptions& o, bool generation_prompt) const {
  std::vector<int32_t> out;
  if (o.thinking) {
    ChatMessage effort{"system", std::string(kThinkingEffortBody) + o.effort + "`.", "", {}};
    // One text segment: BPE merges across "=max" (upstream encodes it whole).
    Message(effort, " role=\"system\" type=\"thinking-effort\"", o, &out);
  }
  for (const ChatMessage& m : messages) {
    Message(m, " role=\"" + m.role + "\"", o, &out);
  }
  if (generation_prompt) {
    Open("message", " role=\"assistant\"", &out);
    Open(o.thinking ? "think" : "response", "", &out);
  }
  return out;
}

Result<Completion> ChatTemplate::Parse(std::span<const int32_t> c, bool thinking) const {
  // The control structure expected after each payload, as ids.
  std::vector<int32_t> boundary;  // close(think) open(response)
  Close("think", &boundary);
  Open("response", "", &boundary);
  std::vector<int32_t> closure;  // close(response) close(message)
  Close("response", &closure);
  Close("message", &closure);

  size_t pos = 0;
  // A payload runs to the first control id, which must start `expect` exactly.
  auto payload = [&](const std::vector<int32_t>& expect, const char* what,
                     std::string* bytes) -> Status {
    size_t end = pos;
    while (end < c.size() && !IsControl(c[end])) ++end;
    if (end == c.size()) {
      return Status::Invalid(std::string("completion: the ") + what + " payload starting at id " +
                             std::to_string(pos) + " never ends (no control token follows; " +
                             "generation limit reached?)");
    }
    if (c.size() - end < expect.size() ||
        !std::equal(expect.begin(), expect.end(), c.begin() + static_cast<std::ptrdiff_t>(end))) {
      return Status::Invalid(std::string("completion: control id ") + std::to_string(c[end]) +
                             " at position " + std::to_string(end) + " inside the " + what +
                             " payload; expected the sequence " + Describe(expect) +
                             " there (control tokens are not allowed inside a payload)");
    }
    const std::vector<int32_t> ids(c.begin() + static_cast<std::ptrdiff_t>(pos),
                                   c.begin() + static_cast<std::ptrdiff_t>(end));
    *bytes = tok_->Decode(ids);
    pos = end + expect.size();
    return Status::Ok();
  };
  Completion out;
  if (thinking) K3_RETURN_IF_ERROR(payload(boundary, "think", &out.reasoning));
  K3_RETURN_IF_ERROR(payload(closure, "response", &out.content));
  if (pos >= c.size()) {
    return Status::Invalid("completion: the message closure at position " +
                           std::to_string(pos) + " is not followed by [EOS] (" +
                           std::to_string(ids_.eos) + ") or <|end_of_msg|> (" +
                           std::to_string(ids_.end_of_msg) + ")");
  }
  if (c[pos] != ids_.eos && c[pos] != ids_.end_of_msg) {
    return Status::Invalid("completion: id " + std::to_string(c[pos]) + " at position " +
                           std::to_string(pos) + " after the message closure; only [EOS] (" +
                           std::to_string(ids_.eos) + ") or <|end_of_msg|> (" +
                           std::to_string(ids_.end_of_msg) + ") may end a message");
  }
  if (pos + 1 != c.size()) {
    return Status::Invalid("completion: " + std::to_string(c.size() - pos - 1) +
                           " id(s) after the end id at position " + std::to_string(pos) +
                           "; a completion ends at its first end id");
  }
  return out;
}

}  // namespace k3::run
