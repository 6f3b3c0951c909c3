#include "k3run/grammar/schema_compiler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "k3run/grammar/gbnf_text.h"
#include "k3run/grammar/utf8_ranges.h"

namespace k3::run::grammar {
namespace {

// Extra members of an object with additionalProperties: bounded, so the grammar is finite.
constexpr int kMaxExtraMembers = 8;
// Deepest nesting of subschemas (the compiler recurses once per level).
constexpr int kMaxDepth = 256;

// Rule-name text for a hint: [a-zA-Z0-9-], runs of anything else become one '-'.
std::string Sanitize(std::string_view hint) {
  std::string out;
  for (const char c : hint) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (ok) {
      out.push_back(c);
    } else if (!out.empty() && out.back() != '-') {
      out.push_back('-');
    }
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  if (out.size() > 48) out.resize(48);
  return out.empty() ? "p" : out;
}

std::string TypeOf(const Json& v) {
  if (v.is_string()) return "string";
  if (v.is_number()) return "number";
  if (v.is_boolean()) return "boolean";
  if (v.is_null()) return "null";
  if (v.is_object()) return "object";
  return "array";
}

bool HasType(const Json& v, std::string_view type) {
  if (type == "integer") {
    if (v.is_number_integer()) return true;
    if (!v.is_number_float()) return false;
    const double d = v.get<double>();
    return std::isfinite(d) && std::floor(d) == d;
  }
  return TypeOf(v) == type;
}

std::string Repeat(const std::string& item, int64_t min, int64_t max) {  // max < 0: unbounded
  if (max < 0) {
    if (min == 0) return item + "*";
    if (min == 1) return item + "+";
    return item + "{" + std::to_string(min) + ",}";
  }
  if (min == max) return item + "{" + std::to_string(min) + "}";
  if (min == 0 && max == 1) return item + "?";
  return item + "{" + std::to_string(min) + "," + std::to_string(max) + "}";
}

std::string Join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

}  // namespace

SchemaCompiler::SchemaCompiler(const Json& root, std::string root_rule)
    : root_(root), root_rule_(std::move(root_rule)) {
  taken_.insert(root_rule_);
}

std::string SchemaCompiler::NewRule(std::string_view hint) {
  const std::string base = root_rule_ + "-" + Sanitize(hint);
  std::string name = base;
  for (int k = 2; taken_.count(name) != 0; ++k) name = base + "-" + std::to_string(k);
  taken_.insert(name);
  rules_.emplace_back(name, "");
  return name;
}

void SchemaCompiler::SetRule(const std::string& name, std::string body) {
  // A rule must not end in "|" or be empty: GBNF reads a newline after "|" or "::=" as a
  // continuation, so an empty last alternative is written "".
  if (body.empty()) body = "\"\"";
  if (body.size() >= 2 && body.compare(body.size() - 2, 2, "| ") == 0) body += "\"\"";
  for (auto& [n, b] : rules_) {
    if (n == name) {
      b = std::move(body);
      return;
    }
  }
  rules_.emplace_back(name, std::move(body));
}

// The JSON primitives. Whitespace: at most one space, only after ':' and ','. Numbers are
// bounded (json_schema.h) so every value is a finite double.
std::string SchemaCompiler::Shared(std::string_view which) {
  auto found = shared_.find(std::string(which));
  if (found != shared_.end()) return found->second;
  const std::string name = NewRule(which);
  shared_.emplace(std::string(which), name);
  std::string body;
  if (which == "ws") {
    body = R"("" | " ")";
  } else if (which == "hex") {
    body = "[0-9a-fA-F]";
  } else if (which == "char") {
    // \u escapes: no lone surrogates (JSON parsers such as nlohmann refuse them).
    const std::string h = Shared("hex");
    body = R"([^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" ([0-9a-cA-CeEfF] )" + h + " " + h + " " +
           h + " | [dD] [0-7] " + h + " " + h + " | [dD] [89abAB] " + h + " " + h +
           R"( "\\u" [dD] [c-fC-F] )" + h + " " + h + "))";
  } else if (which == "string") {
    body = R"("\"" )" + Shared("char") + R"(* "\"")";
  } else if (which == "raw") {
    body = ".*";
  } else if (which == "integer") {
    body = R"("-"? ("0" | [1-9] [0-9]{0,15}))";
  } else if (which == "number") {
    body = R"("-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?)";
  } else if (which == "boolean") {
    body = R"("true" | "false")";
  } else if (which == "null") {
    body = R"("null")";
  } else if (which == "value") {
    body = Shared("object") + " | " + Shared("array") + " | " + Shared("string") + " | " +
           Shared("number") + " | " + Shared("boolean") + " | " + Shared("null");
  } else if (which == "object") {
    const std::string m = Shared("member");
    body = R"("{" ()" + m + R"( ("," )" + Shared("ws") + " " + m + R"()*)? "}")";
  } else if (which == "member") {
    body = Shared("string") + R"( ":" )" + Shared("ws") + " " + Shared("value");
  } else if (which == "array") {
    const std::string v = Shared("value");
    body = R"("[" ()" + v + R"( ("," )" + Shared("ws") + " " + v + R"()*)? "]")";
  }
  SetRule(name, std::move(body));
  return name;
}

std::string SchemaCompiler::Text() const {
  std::string out;
  for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
  return out;
}

Result<std::string> SchemaCompiler::RefRule(const Json& ref, const std::string& ptr) {
  const std::string& r = ref.get_ref<const std::string&>();
  auto found = ref_rules_.find(r);
  if (found != ref_rules_.end()) return found->second;
  K3_ASSIGN_OR_RETURN(const auto target, Resolve(ref, ptr));
  const std::string hint = target.second.empty() ? "ref-root" : "ref-" + target.second;
  const std::string name = NewRule(hint);
  ref_rules_.emplace(r, name);  // before the body: recursion refers to the name
  K3_ASSIGN_OR_RETURN(const std::string body, Compile(*target.first, target.second, hint));
  SetRule(name, body);
  return name;
}

Result<std::string> SchemaCompiler::Compile(const Json& s, const std::string& ptr,
                                            const std::string& hint) {
  if (s.is_object() && s.contains("$ref")) {
    K3_RETURN_IF_ERROR(CheckKeywords(s, ptr));
    K3_RETURN_IF_ERROR(CheckAlone(s, ptr, "$ref", {}));
    return RefRule(s["$ref"], ptr);
  }
  K3_ASSIGN_OR_RETURN(const std::vector<Typed> alts, Alternatives(s, ptr, hint, false));
  if (alts.size() == 1) return alts[0].expr;
  std::vector<std::string> exprs;
  for (const Typed& a : alts) exprs.push_back(a.expr);
  const std::string name = NewRule(hint);
  SetRule(name, Join(exprs, " | "));
  return name;
}

std::vector<SchemaCompiler::Typed> SchemaCompiler::AnyValue(bool raw) {
  return {{"string", raw ? Shared("raw") : Shared("string")},
          {"number", Shared("number")},
          {"boolean", Shared("boolean")},
          {"null", Shared("null")},
          {"object", Shared("object")},
          {"array", Shared("array")}};
}

Result<std::vector<SchemaCompiler::Typed>> SchemaCompiler::Alternatives(const Json& s,
                                                                        const std::string& ptr,
                                                                        const std::string& hint,
                                                                        bool raw) {
  struct DepthGuard {
    int* depth;
    ~DepthGuard() { --*depth; }
  } guard{&depth_};
  if (++depth_ > kMaxDepth) {
    return SchemaError(ptr, "subschemas nested deeper than " + std::to_string(kMaxDepth));
  }
  if (s.is_boolean()) {
    if (s.get<bool>()) return AnyValue(raw);
    return SchemaError(ptr, "the schema false accepts no value");
  }
  if (!s.is_object()) return SchemaError(ptr, "a schema must be an object or a boolean");
  K3_RETURN_IF_ERROR(CheckKeywords(s, ptr));
  std::vector<Typed> out;
  if (s.contains("$ref")) {
    K3_RETURN_IF_ERROR(CheckAlone(s, ptr, "$ref", {}));
    // JSON text: the target's rule (recursion goes through rules). Raw form (the top of an XTML
    // argument, which needs the value's types): the target expanded here.
    if (!raw) {
      K3_ASSIGN_OR_RETURN(std::string rule, RefRule(s["$ref"], ptr));
      out.push_back({"", std::move(rule)});
      return out;
    }
    const std::string& r = s["$ref"].get_ref<const std::string&>();
    if (!refs_expanding_.insert(r).second) {
      return SchemaError(ptr,
                         "$ref \"" + r + "\" refers back to itself before any value is written");
    }
    K3_ASSIGN_OR_RETURN(const auto target, Resolve(s["$ref"], ptr));
    auto alts = Alternatives(*target.first, target.second, hint, raw);
    refs_expanding_.erase(r);
    return alts;
  }
  for (const char* k : {"anyOf", "oneOf"}) {
    if (!s.contains(k)) continue;
    K3_RETURN_IF_ERROR(CheckAlone(s, ptr, k, {}));
    for (size_t i = 0; i < s[k].size(); ++i) {
      K3_ASSIGN_OR_RETURN(const std::vector<Typed> sub,
                          Alternatives(s[k][i], ptr + "/" + k + "/" + std::to_string(i),
                                       hint + "-" + std::to_string(i), raw));
      out.insert(out.end(), sub.begin(), sub.end());
    }
    return out;
  }
  if (s.contains("enum") || s.contains("const")) {
    const char* k = s.contains("enum") ? "enum" : "const";
    K3_RETURN_IF_ERROR(CheckAlone(s, ptr, k, {"type"}));
    const Json values = s.contains("enum") ? s["enum"] : Json::array({s["const"]});
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      for (const Json& x : t.is_array() ? t : Json::array({t}))
        types.push_back(x.get<std::string>());
    }
    for (const Json& v : values) {
      const bool typed_ok =
          types.empty() || std::any_of(types.begin(), types.end(),
                                       [&](const std::string& t) { return HasType(v, t); });
      if (!typed_ok) continue;
      const std::string text = raw && v.is_string() ? v.get<std::string>() : v.dump();
      out.push_back({TypeOf(v), GbnfLiteral(text)});
    }
    if (out.empty())
      return SchemaError(ptr, std::string("no value of \"") + k + "\" has the schema's type");
    return out;
  }
  K3_ASSIGN_OR_RETURN(const std::vector<std::string> types, Types(s, ptr));
  for (const std::string& t : types) {
    const std::string sub_hint = types.size() > 1 ? hint + "-" + t : hint;
    if (t == "string") {
      K3_ASSIGN_OR_RETURN(std::string e, StringRule(s, ptr, sub_hint, raw));
      out.push_back({t, std::move(e)});
    } else if (t == "number" || t == "integer" || t == "boolean" || t == "null") {
      out.push_back({t == "integer" ? "number" : t, Shared(t)});
    } else if (t == "object") {
      K3_ASSIGN_OR_RETURN(std::string e, ObjectRule(s, ptr, sub_hint));
      out.push_back({t, std::move(e)});
    } else {
      K3_ASSIGN_OR_RETURN(std::string e, ArrayRule(s, ptr, sub_hint));
      out.push_back({t, std::move(e)});
    }
  }
  return out;
}

Result<std::string> SchemaCompiler::StringRule(const Json& s, const std::string& ptr,
                                               const std::string& hint, bool raw) {
  (void)ptr;
  if (!s.contains("minLength") && !s.contains("maxLength")) return Shared(raw ? "raw" : "string");
  const int64_t min = s.contains("minLength") ? s["minLength"].get<int64_t>() : 0;
  const int64_t max = s.contains("maxLength") ? s["maxLength"].get<int64_t>() : -1;
  const std::string name = NewRule(hint + "-string");
  // Lengths count code points, as JSON Schema does: one char is one code point (an escaped
  // surrogate pair is one char).
  if (raw) {
    SetRule(name, Repeat(".", min, max));
  } else {
    SetRule(name, R"("\"" )" + Repeat(Shared("char"), min, max) + R"( "\"")");
  }
  return name;
}

Result<std::string> SchemaCompiler::ArrayRule(const Json& s, const std::string& ptr,
                                              const std::string& hint) {
  std::string item;
  if (s.contains("items")) {
    K3_ASSIGN_OR_RETURN(item, Compile(s["items"], ptr + "/items", hint + "-item"));
  } else {
    item = Shared("value");
  }
  const int64_t min = s.contains("minItems") ? s["minItems"].get<int64_t>() : 0;
  const int64_t max = s.contains("maxItems") ? s["maxItems"].get<int64_t>() : -1;
  const std::string name = NewRule(hint + "-array");
  if (max == 0) {
    SetRule(name, R"("[" "]")");
    return name;
  }
  const std::string more = Repeat(R"(("," )" + Shared("ws") + " " + item + ")",
                                  std::max<int64_t>(min - 1, 0), max < 0 ? -1 : max - 1);
  const std::string inner = item + " " + more;
  SetRule(name, R"("[" )" + (min == 0 ? "(" + inner + ")?" : inner) + R"( "]")");
  return name;
}

Result<SchemaCompiler::Members> SchemaCompiler::ObjectMembers(const Json& s,
                                                              const std::string& ptr) const {
  static const Json kAny = true;
  Members m;
  std::set<std::string> required;
  if (s.contains("required")) {
    for (const Json& r : s["required"]) required.insert(r.get<std::string>());
  }
  if (s.contains("properties")) {
    for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) {
      m.names.push_back(it.key());
      m.schemas.push_back(&it.value());
      m.pointers.push_back(ptr + "/properties/" + PointerEscape(it.key()));
      m.required.push_back(required.count(it.key()) != 0);
    }
  }
  // Required names without a property schema: any value, after the declared properties.
  if (s.contains("required")) {
    for (const Json& r : s["required"]) {
      const std::string& name = r.get_ref<const std::string&>();
      if (std::find(m.names.begin(), m.names.end(), name) != m.names.end()) continue;
      m.names.push_back(name);
      m.schemas.push_back(&kAny);
      m.pointers.push_back(ptr + "/required");
      m.required.push_back(true);
    }
  }
  // additionalProperties absent: generate no extra members (the schema would allow them, but a
  // generated object never needs them).
  if (s.contains("additionalProperties")) {
    const Json& ap = s["additionalProperties"];
    if (!ap.is_boolean() || ap.get<bool>()) m.additional = &ap;
  }
  return m;
}

Result<std::string> SchemaCompiler::ObjectRule(const Json& s, const std::string& ptr,
                                               const std::string& hint) {
  K3_ASSIGN_OR_RETURN(const Members m, ObjectMembers(s, ptr));
  const std::string ws = Shared("ws");
  const std::string name = NewRule(hint + "-object");
  std::vector<std::string> member;  // "KEY": value, per declared member
  for (size_t i = 0; i < m.names.size(); ++i) {
    const std::string sub_hint = hint + "-" + m.names[i];
    K3_ASSIGN_OR_RETURN(const std::string value, Compile(*m.schemas[i], m.pointers[i], sub_hint));
    member.push_back(GbnfLiteral(Json(m.names[i]).dump()) + R"( ":" )" + ws + " " + value);
  }
  std::string extra_first;  // after no member yet: optional first extra and up to 7 more
  std::string extra_more;   // after a member: up to 8
  if (m.additional != nullptr) {
    std::string value;
    if (m.additional->is_boolean()) {
      value = Shared("value");
    } else {
      K3_ASSIGN_OR_RETURN(value,
                          Compile(*m.additional, ptr + "/additionalProperties", hint + "-extra"));
    }
    // Extra keys: plain characters only (no escapes), so "none of the declared names" is a
    // property of the text itself.
    const std::string key = NotOneOf(
        m.names, R"("\\\x00-\x1F)",
        [](uint32_t cp) { return cp == '"' || cp == '\\' || cp < 0x20; }, true, hint + "-xkey");
    const std::string kv = NewRule(hint + "-extra-member");
    SetRule(kv, R"("\"" )" + key + R"( "\"" ":" )" + ws + " " + value);
    const std::string next = R"(("," )" + ws + " " + kv + ")";
    extra_first = "(" + kv + " " + Repeat(next, 0, kMaxExtraMembers - 1) + ")?";
    extra_more = Repeat(next, 0, kMaxExtraMembers);
  }
  // rest(i, started): members i.. given whether one was written (then each needs a comma).
  // Required ones always appear; an optional one may be skipped.
  std::map<std::pair<size_t, bool>, std::string> memo;
  std::function<std::string(size_t, bool)> rest = [&](size_t i, bool started) -> std::string {
    if (i == m.names.size()) return started ? extra_more : extra_first;
    auto found = memo.find({i, started});
    if (found != memo.end()) return found->second;
    const std::string r = NewRule(hint + "-" + std::to_string(i) + (started ? "-next" : "-first"));
    memo.emplace(std::make_pair(i, started), r);
    const std::string with =
        (started ? R"("," )" + ws + " " : std::string()) + member[i] + " " + rest(i + 1, true);
    const std::string skip = rest(i + 1, started);
    SetRule(r, m.required[i] ? with : with + " | " + (skip.empty() ? "\"\"" : skip));
    return r;
  };
  SetRule(name, R"("{" )" + rest(0, false) + R"( "}")");
  return name;
}

std::string SchemaCompiler::NotOneOf(const std::vector<std::string>& names,
                                     std::string_view excluded_class,
                                     const std::function<bool(uint32_t)>& is_excluded,
                                     bool allow_empty, const std::string& hint) {
  // A trie of the names that could be written at all; the rule of a trie node accepts every
  // string extending its prefix except the names.
  struct Node {
    std::map<uint32_t, int> next;
    bool name = false;
  };
  std::vector<Node> trie(1);
  for (const std::string& n : names) {
    const std::vector<uint32_t> cps = CodePointsOf(n);
    if (std::any_of(cps.begin(), cps.end(), is_excluded)) continue;  // cannot be written
    int at = 0;
    for (const uint32_t cp : cps) {
      auto it = trie[static_cast<size_t>(at)].next.find(cp);
      if (it == trie[static_cast<size_t>(at)].next.end()) {
        trie.push_back({});
        const int id = static_cast<int>(trie.size() - 1);
        trie[static_cast<size_t>(at)].next.emplace(cp, id);
        at = id;
      } else {
        at = it->second;
      }
    }
    trie[static_cast<size_t>(at)].name = true;
  }
  const std::string any = NewRule(hint + "-any");
  SetRule(any, "[^" + std::string(excluded_class) + "]*");
  std::function<std::string(int)> rule = [&](int at) -> std::string {
    const Node& node = trie[static_cast<size_t>(at)];
    const std::string r = NewRule(hint);
    std::vector<std::string> alts;
    std::string others = "[^" + std::string(excluded_class);
    for (const auto& [cp, child] : node.next) {
      alts.push_back(GbnfLiteral(Utf8Of(cp)) + " " + rule(child));
      others += GbnfClassChar(cp);
    }
    alts.push_back(others + "] " + any);
    if (!node.name && (allow_empty || at != 0)) alts.push_back("\"\"");
    SetRule(r, Join(alts, " | "));
    return r;
  };
  return rule(0);
}

Result<std::string> SchemaCompiler::JsonText() {
  K3_ASSIGN_OR_RETURN(const std::string value, Compile(root_, "", "value"));
  rules_.insert(rules_.begin(), {root_rule_, value});
  return Text();
}

std::string SchemaCompiler::AnyObject() {
  const std::string object = Shared("object");
  rules_.insert(rules_.begin(), {root_rule_, object});
  return Text();
}

}  // namespace k3::run::grammar
