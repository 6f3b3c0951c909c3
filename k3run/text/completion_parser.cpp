// The incremental parser of a completion (tool_calls.h); the rendering helpers are in
// tool_calls.cpp.
#include "k3run/text/tool_calls.h"

#include <algorithm>
#include <cstdio>
#include <initializer_list>

#include <nlohmann/json.hpp>

namespace k3::run {
namespace {

using json = nlohmann::json;

// A JSON string literal of `s` (invalid UTF-8 replaced first, so dump cannot throw).
std::string JsonString(std::string_view s) {
  return json(SanitizeUtf8(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

// The characters of a JSON string literal without its quotes (a streamed string's middle).
std::string JsonChars(std::string_view s) {
  const std::string quoted = JsonString(s);
  return quoted.substr(1, quoted.size() - 2);
}

json ParseJson(std::string_view text) {
  return json::parse(text.begin(), text.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
}

// ---- tag headers: `tag key="value" …` ----

struct TagHeader {
  std::string tag;
  std::vector<std::pair<std::string, std::string>> attrs;  // values unescaped
};

bool IsKeyChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

bool ParseTagHeader(std::string_view text, TagHeader* out) {
  size_t i = 0;
  while (i < text.size() && IsKeyChar(text[i])) ++i;
  out->tag = std::string(text.substr(0, i));
  if (out->tag.empty()) return false;
  while (i < text.size()) {
    if (text[i++] != ' ') return false;
    const size_t key = i;
    while (i < text.size() && IsKeyChar(text[i])) ++i;
    if (i == key || text.substr(i, 2) != "=\"") return false;
    const std::string k(text.substr(key, i - key));
    const size_t value = i + 2;
    const size_t quote = text.find('"', value);
    if (quote == std::string_view::npos) return false;
    for (const auto& [seen, v] : out->attrs) {
      if (seen == k) return false;
    }
    out->attrs.emplace_back(k, UnescapeAttr(text.substr(value, quote - value)));
    i = quote + 1;
  }
  return true;
}

// values[i] = the value of names[i] ("" when absent). false for an attribute not in `names` or
// one of the first `required` names missing.
bool TakeAttrs(const TagHeader& h, std::initializer_list<std::string_view> names, size_t required,
               std::vector<std::string>* values) {
  const std::vector<std::string_view> want(names);
  values->assign(want.size(), "");
  std::vector<bool> seen(want.size(), false);
  for (const auto& [k, v] : h.attrs) {
    const auto it = std::find(want.begin(), want.end(), k);
    if (it == want.end()) return false;
    const size_t slot = static_cast<size_t>(it - want.begin());
    seen[slot] = true;
    (*values)[slot] = v;
  }
  for (size_t i = 0; i < required; ++i) {
    if (!seen[i]) return false;
  }
  return true;
}

bool ValueTypeMatches(const json& j, std::string_view type) {
  if (type == "number") return j.is_number();
  if (type == "boolean") return j.is_boolean();
  if (type == "null") return j.is_null();
  if (type == "object") return j.is_object();
  if (type == "array") return j.is_array();
  return false;
}

bool KnownValueType(std::string_view type) {
  return type == "string" || type == "number" || type == "boolean" || type == "null" ||
         type == "object" || type == "array";
}

bool AllDigits(std::string_view s) {
  return !s.empty() && s.size() <= 18 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A tag header as the model wrote it, for messages (bounded, valid UTF-8).
std::string ShowTag(bool open, std::string_view text) {
  const std::string shown = SanitizeUtf8(text.substr(0, 80));
  return std::string(open ? "<|open|>" : "<|close|>") + shown + (text.size() > 80 ? "…" : "") +
         "<|sep|>";
}

// Longer than any tag the template writes by far; bounds what a runaway header buffers.
constexpr size_t kMaxHeaderBytes = 64 * 1024;

}  // namespace

// ---- completion parsing ----

std::string_view FinishKindName(FinishKind kind) {
  switch (kind) {
    case FinishKind::kStop: return "stop";
    case FinishKind::kToolCalls: return "tool_calls";
    case FinishKind::kLength: return "length";
    case FinishKind::kMalformed: return "malformed";
  }
  return "malformed";
}

std::string ToolCallId(uint64_t seed, int64_t index) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(
                    SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(index))));
  return std::string("call_") + hex;
}

CompletionParser::CompletionParser(const tok::Tokenizer* tok, const ChatIds& ids,
                                   CompletionParserOptions o)
    : tok_(tok), ids_(ids), o_(o), phase_(o.thinking ? Phase::kReasoning : Phase::kContent) {}

CompletionDelta CompletionParser::Feed(int32_t id) {
  CompletionDelta d;
  const bool is_end = id == ids_.eos || id == ids_.end_of_msg;
  auto at = [&] { return " at position " + std::to_string(position_); };
  if (finished_ || phase_ == Phase::kMalformed) {
    // Nothing more: the result is decided.
  } else if (phase_ == Phase::kDone) {
    Fail("completion: id " + std::to_string(id) + at() + " after the end id at position " +
         std::to_string(phase_start_) + "; a completion ends at its first end id");
  } else if (phase_ == Phase::kAfterMessage && !is_end) {
    Fail("completion: id " + std::to_string(id) + at() +
         " after the message closure; only [EOS] (" + std::to_string(ids_.eos) +
         ") or <|end_of_msg|> (" + std::to_string(ids_.end_of_msg) + ") may end a message");
  } else if (header_.active) {
    if (id == ids_.sep) {
      Tag(&d);
    } else if (tok::IsAddedToken(*tok_, id)) {
      Fail("completion: control id " + std::to_string(id) + at() +
           " inside the tag header opened at position " + std::to_string(header_.position) +
           " (a header ends at <|sep|>)");
    } else {
      header_.text += tok_->TokenBytes(id);
      if (header_.text.size() > kMaxHeaderBytes) {
        Fail("completion: the tag header opened at position " + std::to_string(header_.position) +
             " runs past " + std::to_string(kMaxHeaderBytes) + " bytes without <|sep|>");
      }
    }
  } else if (id == ids_.open || id == ids_.close) {
    header_ = Header{true, id == ids_.open, position_, ""};
  } else if (is_end && phase_ == Phase::kAfterMessage) {
    phase_ = Phase::kDone;
    phase_start_ = position_;
  } else if (tok::IsAddedToken(*tok_, id)) {
    Fail("completion: control id " + std::to_string(id) + at() + " " + Where() +
         " (control tokens are not allowed inside a payload; expected " + Expected() + ")");
  } else {
    Text(tok_->TokenBytes(id), &d);
  }
  ++position_;
  return d;
}

void CompletionParser::Text(std::string_view bytes, CompletionDelta* d) {
  if (bytes.empty()) return;  // an id without bytes (outside the vocabulary) adds nothing
  switch (phase_) {
    case Phase::kReasoning:
      reasoning_ += bytes;
      d->reasoning += bytes;
      return;
    case Phase::kContent:
      content_ += bytes;
      d->content += bytes;
      return;
    case Phase::kInArgument:
      if (arg_.type == "string") {
        Emit(JsonChars(arg_.utf8.Push(bytes)), d);
      } else {
        arg_.raw += bytes;
      }
      return;
    case Phase::kInJson:
      arg_.raw += bytes;
      return;
    default:
      Fail("completion: text at position " + std::to_string(position_) + " " + Where() +
           " (only " + Expected() + " may follow there)");
  }
}

void CompletionParser::Tag(CompletionDelta* d) {
  header_.active = false;
  TagHeader h;
  const std::string shown = ShowTag(header_.open, header_.text);
  const std::string at = " at position " + std::to_string(header_.position);
  if (!ParseTagHeader(header_.text, &h)) {
    Fail("completion: malformed tag " + shown + at + " (expected tag key=\"value\" …)");
    return;
  }
  const bool open = header_.open;
  const bool bare = h.attrs.empty();
  auto is = [&](bool want_open, std::string_view tag) { return open == want_open && h.tag == tag; };
  std::vector<std::string> attrs;
  switch (phase_) {
    case Phase::kReasoning:
      if (is(false, "think") && bare) {
        phase_ = Phase::kAfterThink;
        return;
      }
      break;
    case Phase::kAfterThink:
      if (is(true, "response") && bare) {
        phase_ = Phase::kContent;
        phase_start_ = position_ + 1;
        return;
      }
      break;
    case Phase::kContent:
      if (is(false, "response") && bare) {
        phase_ = Phase::kAfterContent;
        return;
      }
      break;
    case Phase::kAfterContent:
      if (is(true, "tools") && bare) {
        phase_ = Phase::kInTools;
        calls_in_section_ = 0;
        return;
      }
      if (is(false, "message") && bare) {
        phase_ = Phase::kAfterMessage;
        return;
      }
      break;
    case Phase::kInTools:
      if (is(true, "call")) {
        if (!TakeAttrs(h, {"tool", "index"}, 2, &attrs) || attrs[0].empty() ||
            !AllDigits(attrs[1])) {
          Fail("completion: tag " + shown + at + " needs exactly tool=\"NAME\" index=\"N\"");
          return;
        }
        StartCall(attrs[0], d);
        return;
      }
      if (is(false, "tools") && bare) {
        if (calls_in_section_ == 0) {
          Fail("completion: the tools section closed" + at + " holds no call");
          return;
        }
        phase_ = Phase::kAfterTools;
        return;
      }
      break;
    case Phase::kInCall:
      if (is(true, "argument") && !calls_.back().json_block) {
        if (!TakeAttrs(h, {"key", "type"}, 2, &attrs) || !KnownValueType(attrs[1])) {
          Fail("completion: tag " + shown + at +
               " needs exactly key=\"K\" type=\"string|number|boolean|null|object|array\"");
          return;
        }
        StartArgument(attrs[0], attrs[1], d);
        return;
      }
      if (is(true, "json") && !calls_.back().json_block && calls_.back().arguments_seen == 0) {
        if (!TakeAttrs(h, {"type"}, 0, &attrs) || !(attrs[0].empty() || attrs[0] == "object")) {
          Fail("completion: tag " + shown + at + " allows only type=\"object\"");
          return;
        }
        arg_ = Argument{};
        arg_.position = header_.position;
        phase_ = Phase::kInJson;
        return;
      }
      if (is(false, "call") && bare) {
        EndCall(d);
        return;
      }
      break;
    case Phase::kInArgument:
      if (is(false, "argument") && bare) {
        EndArgument(d);
        return;
      }
      break;
    case Phase::kInJson:
      if (is(false, "json") && bare) {
        const Status s = EndJsonBlock(d);
        if (!s.ok()) Fail(s.message());
        return;
      }
      break;
    case Phase::kAfterTools:
      if (is(false, "message") && bare) {
        phase_ = Phase::kAfterMessage;
        return;
      }
      break;
    default:
      break;
  }
  Fail("completion: unexpected tag " + shown + at + " " + Where() + "; expected " + Expected());
}

void CompletionParser::StartCall(const std::string& name, CompletionDelta* d) {
  Call c;
  c.index = static_cast<int64_t>(calls_.size());
  c.position = header_.position;
  c.call.id = ToolCallId(o_.call_id_seed, c.index);
  c.call.name = SanitizeUtf8(name);
  d->tool_calls.push_back({c.index, c.call.id, c.call.name, ""});
  calls_.push_back(std::move(c));
  in_call_ = true;
  ++calls_in_section_;
  phase_ = Phase::kInCall;
}

void CompletionParser::StartArgument(std::string key, std::string type, CompletionDelta* d) {
  Call& c = calls_.back();
  std::string fragment = (c.arguments_seen == 0 ? "{" : ",") + JsonString(key) + ":";
  if (type == "string") fragment += '"';
  ++c.arguments_seen;
  arg_ = Argument{};
  arg_.key = std::move(key);
  arg_.type = std::move(type);
  arg_.position = header_.position;
  Emit(std::move(fragment), d);
  phase_ = Phase::kInArgument;
}

void CompletionParser::EndArgument(CompletionDelta* d) {
  if (arg_.type == "string") {
    Emit(JsonChars(arg_.utf8.Flush()) + "\"", d);
  } else {
    // A value that does not parse as its declared type is kept as the string of its text.
    const json j = ParseJson(arg_.raw);
    const bool ok = !j.is_discarded() && ValueTypeMatches(j, arg_.type);
    Emit(ok ? arg_.raw : JsonString(arg_.raw), d);
  }
  phase_ = Phase::kInCall;
}

Status CompletionParser::EndJsonBlock(CompletionDelta* d) {
  Call& c = calls_.back();
  if (!ParseJson(arg_.raw).is_object()) {
    return Status::Invalid("completion: the json block of call " + std::to_string(c.index + 1) +
                           " at position " + std::to_string(arg_.position) +
                           " is not a JSON object");
  }
  c.json_block = true;
  Emit(arg_.raw, d);
  phase_ = Phase::kInCall;
  return Status::Ok();
}

void CompletionParser::EndCall(CompletionDelta* d) {
  const Call& c = calls_.back();
  if (!c.json_block) Emit(c.arguments_seen == 0 ? "{}" : "}", d);
  in_call_ = false;
  phase_ = Phase::kInTools;
}

void CompletionParser::Emit(std::string fragment, CompletionDelta* d) {
  if (fragment.empty()) return;
  Call& c = calls_.back();
  c.call.arguments += fragment;
  if (!d->tool_calls.empty() && d->tool_calls.back().index == c.index) {
    d->tool_calls.back().arguments += fragment;
  } else {
    d->tool_calls.push_back({c.index, "", "", std::move(fragment)});
  }
}

void CompletionParser::Fail(std::string message) {
  if (phase_ == Phase::kMalformed) return;
  error_ = std::move(message);
  phase_ = Phase::kMalformed;
}

std::string CompletionParser::Where() const {
  const std::string call = calls_.empty() ? "" : std::to_string(calls_.back().index + 1);
  switch (phase_) {
    case Phase::kReasoning: return "inside the think payload";
    case Phase::kAfterThink: return "after close(think)";
    case Phase::kContent: return "inside the response payload";
    case Phase::kAfterContent: return "after the response";
    case Phase::kInTools: return "between tool calls";
    case Phase::kInCall: return "inside call " + call;
    case Phase::kInArgument:
      return "inside argument " + JsonString(arg_.key) + " of call " + call;
    case Phase::kInJson: return "inside the json block of call " + call;
    case Phase::kAfterTools: return "after the tools section";
    case Phase::kAfterMessage: return "after the message closure";
    case Phase::kDone: return "after the end id";
    case Phase::kMalformed: return "after an error";
  }
  return "";
}

std::string CompletionParser::Expected() const {
  switch (phase_) {
    case Phase::kReasoning: return "close(think)";
    case Phase::kAfterThink: return "open(response)";
    case Phase::kContent: return "close(response)";
    case Phase::kAfterContent: return "open(tools) or close(message)";
    case Phase::kInTools: return "open(call) or close(tools)";
    case Phase::kInCall:
      if (calls_.back().json_block) return "close(call)";
      return calls_.back().arguments_seen == 0 ? "open(argument), open(json) or close(call)"
                                               : "open(argument) or close(call)";
    case Phase::kInArgument: return "close(argument)";
    case Phase::kInJson: return "close(json)";
    case Phase::kAfterTools: return "close(message)";
    case Phase::kAfterMessage: return "[EOS] or <|end_of_msg|>";
    default: return "nothing";
  }
}

std::string CompletionParser::CutOff() const {
  const std::string p = std::to_string(position_);
  if (header_.active) {
    return "completion: cut off inside the tag header opened at position " +
           std::to_string(header_.position) + " (generation limit reached?)";
  }
  switch (phase_) {
    case Phase::kReasoning:
    case Phase::kContent:
      return std::string("completion: the ") +
             (phase_ == Phase::kReasoning ? "think" : "response") +
             " payload starting at position " + std::to_string(phase_start_) +
             " never ends (no control token follows; generation limit reached?)";
    case Phase::kAfterMessage:
      return "completion: the message closure at position " + p + " is not followed by [EOS] (" +
             std::to_string(ids_.eos) + ") or <|end_of_msg|> (" +
             std::to_string(ids_.end_of_msg) + ")";
    default:
      return "completion: cut off " + Where() + " at position " + p +
             " (generation limit reached?)";
  }
}

ParsedCompletion CompletionParser::Finish() {
  if (finished_) return result_;
  finished_ = true;
  ParsedCompletion& r = result_;
  if (phase_ == Phase::kMalformed) {
    r.finish = FinishKind::kMalformed;
    r.error = error_;
  } else if (phase_ == Phase::kDone) {
    r.finish = calls_.empty() ? FinishKind::kStop : FinishKind::kToolCalls;
  } else {
    r.finish = FinishKind::kLength;
    r.error = CutOff();
    // Close what the limit cut so the joined arguments still parse.
    if (in_call_) {
      if (phase_ == Phase::kInArgument) {
        EndArgument(&r.tail);
      } else if (phase_ == Phase::kInJson && ParseJson(arg_.raw).is_object()) {
        calls_.back().json_block = true;
        Emit(arg_.raw, &r.tail);
      }
      EndCall(&r.tail);
    }
  }
  r.reasoning = reasoning_;
  r.content = content_;
  for (const Call& c : calls_) r.tool_calls.push_back(c.call);
  return r;
}

}  // namespace k3::run
