#include "k3run/grammar/gbnf_text.h"

namespace k3::run::grammar {
namespace {

constexpr char kHex[] = "0123456789ABCDEF";

void AppendHex(uint32_t v, int digits, std::string* out) {
  for (int i = digits - 1; i >= 0; --i) out->push_back(kHex[(v >> (4 * i)) & 15]);
}

}  // namespace

std::string GbnfLiteral(std::string_view utf8) {
  std::string out(1, '"');
  for (const char c : utf8) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7F) {
      out += "\\x";
      AppendHex(u, 2, &out);
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

std::string GbnfClassChar(uint32_t cp) {
  std::string out;
  if (cp <= 0xFFFF) {
    out = "\\u";
    AppendHex(cp, 4, &out);
  } else {
    out = "\\U";
    AppendHex(cp, 8, &out);
  }
  return out;
}

bool IsGbnfRuleName(std::string_view name) {
  if (name.empty()) return false;
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_';
    if (!ok) return false;
  }
  return true;
}

std::string XtmlAttributeEscape(std::string_view value) {
  std::string out;
  for (const char c : value) {
    if (c == '&') {
      out += "&amp;";
    } else if (c == '"') {
      out += "&quot;";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace k3::run::grammar
