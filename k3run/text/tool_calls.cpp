// The XTML rendering helpers of tool_calls.h (declarations, calls, results, CompactJson); the
// completion parser is in completion_parser.cpp.
#include "k3run/text/tool_calls.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <numeric>

#include <nlohmann/json.hpp>

namespace k3::run {
namespace {

using json = nlohmann::json;

// A JSON string literal of `s` (invalid UTF-8 replaced first, so dump cannot throw).
std::string JsonString(std::string_view s) {
  return json(SanitizeUtf8(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

json ParseJson(std::string_view text) {
  return json::parse(text.begin(), text.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
}

// ---- CompactJson ----

// Python's float repr: the shortest digits that round-trip, the closest to the value on a tie
// (std::to_chars guarantees the same; nlohmann's Grisu2 does not always pick the closest), fixed
// notation for decimal exponents -4..15, else d.ddde±XX.
std::string PythonFloat(double v) {
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  const std::to_chars_result r =
      std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  const std::string_view sci(buf, static_cast<size_t>(r.ptr - buf));  // "-d.ddde+XX"
  const size_t e = sci.find('e');
  const bool negative = sci[0] == '-';
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e; ++i) {
    if (sci[i] != '.') digits += sci[i];
  }
  const int exp = std::stoi(std::string(sci.substr(e + 1)));
  std::string out = negative ? "-" : "";
  if (exp >= 16 || exp < -4) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    const int mag = exp < 0 ? -exp : exp;
    return out + (exp < 0 ? "e-" : "e+") + (mag < 10 ? "0" : "") + std::to_string(mag);
  }
  if (exp < 0) return out + "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  const size_t int_digits = static_cast<size_t>(exp) + 1;
  if (digits.size() <= int_digits) {
    return out + digits + std::string(int_digits - digits.size(), '0') + ".0";
  }
  return out + digits.substr(0, int_digits) + "." + digits.substr(int_digits);
}

// Deeper than this the tools are surely not a schema, and recursion must stay bounded.
constexpr int kMaxJsonDepth = 512;

bool DumpCompact(const json& j, int depth, std::string* out) {
  if (depth > kMaxJsonDepth) return false;
  if (j.is_object()) {
    *out += '{';
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {  // std::map: keys sorted
      if (!first) *out += ',';
      first = false;
      *out += JsonString(it.key());
      *out += ':';
      if (!DumpCompact(it.value(), depth + 1, out)) return false;
    }
    *out += '}';
  } else if (j.is_array()) {
    *out += '[';
    for (size_t i = 0; i < j.size(); ++i) {
      if (i) *out += ',';
      if (!DumpCompact(j[i], depth + 1, out)) return false;
    }
    *out += ']';
  } else if (j.is_number_float()) {
    *out += PythonFloat(j.get<double>());
  } else {
    *out += j.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  return true;
}

// ---- arguments as written: one level of a JSON object, each value's source text ----

struct Member {
  std::string key;
  std::string_view type;  // string | number | boolean | null | object | array
  std::string value;      // strings decoded; others their source text
};

size_t SkipSpace(std::string_view s, size_t i) {
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  return i;
}

// s[i] is the opening quote; returns the index after the closing one.
size_t StringEnd(std::string_view s, size_t i) {
  for (++i; i < s.size(); ++i) {
    if (s[i] == '\\') {
      ++i;
    } else if (s[i] == '"') {
      return i + 1;
    }
  }
  return s.size();
}

size_t ValueEnd(std::string_view s, size_t i) {
  if (s[i] == '"') return StringEnd(s, i);
  if (s[i] == '{' || s[i] == '[') {
    int depth = 0;
    while (i < s.size()) {
      const char c = s[i];
      if (c == '"') {
        i = StringEnd(s, i);
        continue;
      }
      if (c == '{' || c == '[') ++depth;
      if ((c == '}' || c == ']') && --depth == 0) return i + 1;
      ++i;
    }
    return s.size();
  }
  while (i < s.size() && std::string_view(" \t\n\r,}]").find(s[i]) == std::string_view::npos) {
    ++i;
  }
  return i;
}

std::string_view TypeOf(char first) {
  switch (first) {
    case '"': return "string";
    case '{': return "object";
    case '[': return "array";
    case 't':
    case 'f': return "boolean";
    case 'n': return "null";
    default: return "number";
  }
}

// The members of `text` in the order written, when it is a JSON object (else false). Validated
// by nlohmann first, so the scan only has to find where each value ends; it still refuses
// anything unexpected rather than trusting that (e.g. a byte-order mark nlohmann skips).
bool ObjectMembers(std::string_view text, std::vector<Member>* out) {
  size_t i = SkipSpace(text, 0);
  if (i >= text.size() || text[i] != '{' || !ParseJson(text).is_object()) return false;
  ++i;
  while (true) {
    i = SkipSpace(text, i);
    if (i < text.size() && text[i] == ',') i = SkipSpace(text, i + 1);
    if (i >= text.size()) return false;
    if (text[i] == '}') return true;
    if (text[i] != '"') return false;
    const size_t key_end = StringEnd(text, i);
    const json key = ParseJson(text.substr(i, key_end - i));
    i = SkipSpace(text, key_end);
    if (!key.is_string() || i >= text.size() || text[i] != ':') return false;
    i = SkipSpace(text, i + 1);
    if (i >= text.size()) return false;
    const size_t value_end = ValueEnd(text, i);
    const std::string_view value = text.substr(i, value_end - i);
    Member m{key.get<std::string>(), TypeOf(text[i]), std::string(value)};
    if (m.type == "string") {
      const json decoded = ParseJson(value);
      if (!decoded.is_string()) return false;
      m.value = decoded.get<std::string>();
    }
    out->push_back(std::move(m));
    i = value_end;
  }
}

}  // namespace

// ---- rendering ----

void XtmlWriter::Text(std::string_view text) {
  if (text.empty()) return;
  const std::vector<int32_t> ids = tok_->Encode(text, /*allow_special=*/false);
  out_->insert(out_->end(), ids.begin(), ids.end());
}

void XtmlWriter::Open(std::string_view tag, std::string_view attrs) {
  out_->push_back(ids_.open);
  Text(tag);
  Text(attrs);
  out_->push_back(ids_.sep);
}

void XtmlWriter::Close(std::string_view tag) {
  out_->push_back(ids_.close);
  Text(tag);
  out_->push_back(ids_.sep);
}

std::string EscapeAttr(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '&') {
      out += "&amp;";
    } else if (c == '"') {
      out += "&quot;";
    } else {
      out += c;
    }
  }
  return out;
}

std::string UnescapeAttr(std::string_view value) {
  // The reverse of EscapeAttr's order: &quot; first, then &amp; (so "&amp;quot;" → "&quot;").
  std::string quotes;
  for (size_t i = 0; i < value.size();) {
    if (value.substr(i, 6) == "&quot;") {
      quotes += '"';
      i += 6;
    } else {
      quotes += value[i++];
    }
  }
  std::string out;
  for (size_t i = 0; i < quotes.size();) {
    if (std::string_view(quotes).substr(i, 5) == "&amp;") {
      out += '&';
      i += 5;
    } else {
      out += quotes[i++];
    }
  }
  return out;
}

std::string Attr(std::string_view key, std::string_view value) {
  return " " + std::string(key) + "=\"" + EscapeAttr(value) + "\"";
}

Result<std::string> CompactJson(std::string_view text, std::string_view what) {
  const json j = ParseJson(text);
  if (j.is_discarded()) return Status::Invalid(std::string(what) + ": not valid JSON");
  std::string out;
  if (!DumpCompact(j, 0, &out)) {
    return Status::Invalid(std::string(what) + ": nested deeper than " +
                           std::to_string(kMaxJsonDepth) + " levels");
  }
  return out;
}

void RenderToolCalls(const std::vector<ToolCall>& calls, XtmlWriter* w) {
  if (calls.empty()) return;
  w->Open("tools");
  for (size_t i = 0; i < calls.size(); ++i) {
    const ToolCall& c = calls[i];
    w->Open("call", Attr("tool", c.name) + Attr("index", std::to_string(i + 1)));
    std::vector<Member> members;
    if (c.arguments.empty() || ObjectMembers(c.arguments, &members)) {
      for (const Member& m : members) {
        w->Open("argument", Attr("key", m.key) + Attr("type", m.type));
        w->Text(m.value);
        w->Close("argument");
      }
    } else {
      w->Open("json", Attr("type", "object"));
      w->Text(c.arguments);
      w->Close("json");
    }
    w->Close("call");
  }
  w->Close("tools");
}

Result<std::vector<ToolResultSlot>> OrderToolResults(const std::vector<ChatMessage>& messages,
                                                     size_t begin, size_t end,
                                                     const ChatMessage* caller, int64_t before) {
  const std::vector<ToolCall> none;
  const std::vector<ToolCall>& calls = caller ? caller->tool_calls : none;
  const size_t n = end - begin;
  std::vector<int64_t> call_of(n, -1);  // the matching call's position, -1: none
  bool all_match = true;
  for (size_t k = 0; k < n; ++k) {
    const std::string& id = messages[begin + k].tool_call_id;
    for (size_t c = 0; c < calls.size() && !id.empty(); ++c) {
      if (calls[c].id == id) {
        call_of[k] = static_cast<int64_t>(c);
        break;
      }
    }
    all_match = all_match && call_of[k] >= 0;
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  if (all_match) {
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return call_of[a] < call_of[b]; });
  }
  std::vector<ToolResultSlot> out;
  for (size_t k = 0; k < n; ++k) {
    const size_t m = begin + order[k];
    ToolResultSlot slot{m, "", before + static_cast<int64_t>(k) + 1};
    if (call_of[order[k]] >= 0) {
      slot.name = calls[static_cast<size_t>(call_of[order[k]])].name;
    } else if (!messages[m].name.empty()) {
      slot.name = messages[m].name;
    } else if (slot.index <= static_cast<int64_t>(calls.size())) {
      slot.name = calls[static_cast<size_t>(slot.index - 1)].name;
    } else {
      return Status::Invalid("message " + std::to_string(m) +
                             ": a tool result needs a preceding tool call (tool_call_id \"" +
                             SanitizeUtf8(messages[m].tool_call_id) + "\" matches no call)");
    }
    out.push_back(std::move(slot));
  }
  return out;
}

}  // namespace k3::run
