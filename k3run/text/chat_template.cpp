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
void Message(const ChatMessage& m, const TemplateOptions& o, XtmlWriter* w) {
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
    w->Text(m.content);
  }
  w->Close("message");
  w->EndOfMessage();
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

Result<std::vector<int32_t>> ChatTemplate::RenderChecked(const std::vector<ChatMessage>& messages,
                                                         const TemplateOptions& o,
                                                         bool generation_prompt) const {
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
      Message(m, o, &w);
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
