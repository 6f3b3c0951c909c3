#include "k3run/text/chat_template.h"

#include <optional>
#include <string>

#include "k3run/text/tool_calls.h"

namespace k3::run {
namespace {

inline constexpr std::string_view kToolDeclarationHead =
    "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n";
inline constexpr std::string_view kResponseFormatJson =
    "Your response must be raw JSON data without markdown code blocks (```json) or any "
    "additional formatting.";

std::string_view Trim(std::string_view s) {
  const size_t begin = s.find_first_not_of(" \t\n\r\f\v");
  if (begin == std::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(" \t\n\r\f\v") - begin + 1);
}

// The encoder's internal system message: ` role="system" type="T"`, body trimmed, one segment.
void InternalSystem(XtmlWriter& w, std::string_view type, std::string_view body) {
  w.Open("message", Attr("role", "system") + Attr("type", type));
  w.Text(Trim(body));
  w.Close("message");
  w.EndOfMessage();
}

// The tool_choice and response_format instructions (after the messages). A named function is
// not rendered (the encoder renders nothing for it: the grammar enforces it).
Status Instructions(const TemplateOptions& o, XtmlWriter& w) {
  if (o.tool_choice == "required") {
    InternalSystem(w, "tool-choice",
                   "The system is invoked with `tool_choice=required`.\n"
                   "You MUST call tools in the next message.");
  } else if (o.tool_choice == "none") {
    InternalSystem(w, "tool-choice",
                   "The system is invoked with `tool_choice=none`.\n"
                   "You MUST NOT call any tools in the next message.");
  } else if (!o.tool_choice.empty() && o.tool_choice != "auto" && o.tool_choice != "function") {
    return Status::Invalid("tool_choice \"" + o.tool_choice +
                           "\": must be auto, none, required or function");
  }
  if (o.response_format == "json_object") {
    InternalSystem(w, "response-format",
                   "The system is invoked with `response_format=json_object`.\n" +
                       std::string(kResponseFormatJson));
  } else if (o.response_format == "json_schema") {
    if (o.response_schema_json.empty()) {
      return Status::Invalid("response_format json_schema: no schema given");
    }
    K3_ASSIGN_OR_RETURN(const std::string schema,
                        CompactJson(o.response_schema_json, "response_format schema"));
    InternalSystem(w, "response-format",
                   "The system is invoked with `response_format=json_schema`.\n" +
                       std::string(kResponseFormatJson) +
                       "\nThe JSON data must match the following schema:\n```json\n" + schema +
                       "\n```");
  } else if (!o.response_format.empty() && o.response_format != "text") {
    return Status::Invalid("response_format \"" + o.response_format +
                           "\": must be text, json_object or json_schema");
  }
  return Status::Ok();
}

// A system, user or assistant message (tool results are rendered by RenderChecked: their
// attributes depend on the run they are in).
void Message(const ChatMessage& m, const TemplateOptions& o, const ChatIds& ids, XtmlWriter* w) {
  w->Open("message", " role=\"" + m.role + "\"");
  if (m.role == "assistant" && !m.ids.empty()) {
    w->Open(o.thinking ? "think" : "response");
    w->Ids(m.ids);
    return;
  }
  if (m.role == "assistant") {
    if (o.thinking) {
      w->Open("think");
      w->Text(m.reasoning);
      w->Close("think");
    }
    w->Open("response");
    w->Text(m.content);
    w->Close("response");
    RenderToolCalls(m.tool_calls, w);
  } else {
    // Text around the images, each image's block where it sits (ChatImage).
    size_t from = 0;
    for (const ChatImage& img : m.images) {
      w->Text(std::string_view(m.content).substr(from, img.at - from));
      w->Ids({ids.media_begin});
      w->Text("image " + std::to_string(img.width) + "x" + std::to_string(img.height));
      w->Ids({ids.media_content});
      w->Ids(std::vector<int32_t>(static_cast<size_t>(img.tokens), ids.media_pad));
      w->Ids({ids.media_end});
      from = img.at;
    }
    w->Text(std::string_view(m.content).substr(from));
  }
  w->Close("message");
  w->EndOfMessage();
}

// Images only in user messages, in order, inside the content, each with rows; the tokenizer
// must have the media tokens.
Status CheckImages(const std::vector<ChatMessage>& messages, const ChatIds& ids) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.images.empty()) continue;
    const std::string where = "message " + std::to_string(i);
    if (m.role != "user") {
      return Status::Invalid(where + ": images are accepted in user messages only (this one is "
                             "\"" + m.role + "\")");
    }
    if (ids.media_begin < 0 || ids.media_content < 0 || ids.media_end < 0 || ids.media_pad < 0) {
      return Status::Invalid(where + ": the tokenizer has no <|media_begin|>, <|media_content|>, "
                             "<|media_end|> and <|media_pad|> tokens, so it cannot take images");
    }
    size_t last = 0;
    for (const ChatImage& img : m.images) {
      if (img.at < last || img.at > m.content.size() || img.tokens < 1) {
        return Status::Invalid(where + ": an image at byte " + std::to_string(img.at) +
                               " is out of order, past the content or without rows");
      }
      last = img.at;
    }
  }
  return Status::Ok();
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
  // Optional: only a prompt with images needs them (CheckImages).
  const struct {
    std::string_view content;
    int32_t* id;
  } media[] = {{"<|media_begin|>", &t.ids_.media_begin},
               {"<|media_content|>", &t.ids_.media_content},
               {"<|media_end|>", &t.ids_.media_end},
               {"<|media_pad|>", &t.ids_.media_pad}};
  for (const auto& m : media) {
    if (const std::optional<int32_t> id = tok->SpecialId(m.content)) *m.id = *id;
  }
  return t;
}

Result<std::vector<int32_t>> ChatTemplate::RenderChecked(const std::vector<ChatMessage>& messages,
                                                         const TemplateOptions& o,
                                                         bool generation_prompt) const {
  K3_RETURN_IF_ERROR(CheckImages(messages, ids_));
  std::vector<int32_t> out;
  XtmlWriter w(tok_, ids_, &out);
  if (!o.tools_json.empty()) {
    K3_ASSIGN_OR_RETURN(const std::string tools, CompactJson(o.tools_json, "tools"));
    if (tools.empty() || tools[0] != '[') return Status::Invalid("tools: not a JSON array");
    if (tools != "[]") {
      InternalSystem(w, "tool-declare", std::string(kToolDeclarationHead) + tools + "\n```");
    }
  }
  if (o.thinking) {
    // One text segment: BPE merges across "=max" (upstream encodes it whole).
    w.Open("message", " role=\"system\" type=\"thinking-effort\"");
    w.Text(std::string(kThinkingEffortBody) + o.effort + "`.");
    w.Close("message");
    w.EndOfMessage();
  }
  const ChatMessage* caller = nullptr;  // the last assistant message: tool results answer it
  int64_t results_since_caller = 0;
  for (size_t i = 0; i < messages.size();) {
    const ChatMessage& m = messages[i];
    if (m.role != "tool") {
      Message(m, o, ids_, &w);
      if (m.role == "assistant") {
        caller = &m;
        results_since_caller = 0;
      }
      ++i;
      continue;
    }
    size_t end = i;
    while (end < messages.size() && messages[end].role == "tool") ++end;
    K3_ASSIGN_OR_RETURN(const std::vector<ToolResultSlot> slots,
                        OrderToolResults(messages, i, end, caller, results_since_caller));
    for (const ToolResultSlot& slot : slots) {
      w.Open("message", Attr("role", "tool") + Attr("tool", slot.name) +
                            Attr("index", std::to_string(slot.index)));
      w.Text(messages[slot.message].content);
      w.Close("message");
      w.EndOfMessage();
    }
    results_since_caller += static_cast<int64_t>(end - i);
    i = end;
  }
  K3_RETURN_IF_ERROR(Instructions(o, w));
  if (generation_prompt) {
    w.Open("message", " role=\"assistant\"");
    w.Open(o.thinking ? "think" : "response");
  }
  return out;
}

std::vector<int32_t> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                          const TemplateOptions& o, bool generation_prompt) const {
  Result<std::vector<int32_t>> ids = RenderChecked(messages, o, generation_prompt);
  return ids.ok() ? std::move(ids).value() : std::vector<int32_t>();
}

Result<Completion> ChatTemplate::Parse(std::span<const int32_t> c, bool thinking) const {
  CompletionParser parser(tok_, ids_, CompletionParserOptions{thinking, 0});
  for (int32_t id : c) parser.Feed(id);
  ParsedCompletion r = parser.Finish();
  if (r.finish != FinishKind::kStop && r.finish != FinishKind::kToolCalls) {
    return Status::Invalid(r.error);
  }
  return Completion{std::move(r.content), std::move(r.reasoning), std::move(r.tool_calls)};
}

}  // namespace k3::run
