// The JSON Schema side of SchemaCompiler: which keywords are supported, their values checked,
// the types a schema allows, and $ref targets.
#include <algorithm>
#include <cstdint>

#include "common/utf8.h"
#include "k3run/grammar/schema_compiler.h"

namespace k3::run::grammar {
namespace {

// The largest count keyword accepted (the GBNF repetition limit).
constexpr uint64_t kMaxCount = 10000;

std::string Where(const std::string& ptr) { return ptr.empty() ? "the root" : ptr; }

// Keywords that only annotate: accepted anywhere and ignored.
const std::set<std::string_view>& Annotations() {
  static const std::set<std::string_view> k = {"title",    "description", "default",  "examples",
                                               "$schema",  "$id",         "$comment", "deprecated",
                                               "readOnly", "writeOnly"};
  return k;
}

const std::set<std::string_view>& Supported() {
  static const std::set<std::string_view> k = {
      "type",      "properties", "required", "additionalProperties",
      "items",     "minItems",   "maxItems", "minLength",
      "maxLength", "enum",       "const",    "anyOf",
      "oneOf",     "$ref",       "$defs",    "definitions"};
  return k;
}

const std::vector<std::string_view>& TypeNames() {
  static const std::vector<std::string_view> k = {"string", "number", "integer", "boolean",
                                                  "null",   "object", "array"};
  return k;
}

// Whether every string inside `v` (keys too) is valid UTF-8, so dump() cannot throw.
bool AllUtf8(const Json& v) {
  if (v.is_string()) return IsValidUtf8(v.get_ref<const std::string&>());
  if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!IsValidUtf8(it.key()) || !AllUtf8(it.value())) return false;
    }
  }
  if (v.is_array()) {
    for (const Json& e : v) {
      if (!AllUtf8(e)) return false;
    }
  }
  return true;
}

}  // namespace

// JSON pointer escaping of one reference token (RFC 6901).
std::string PointerEscape(std::string_view key) {
  std::string out;
  for (const char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

Status SchemaError(const std::string& ptr, const std::string& what) {
  return Status::Invalid("JSON Schema at " + Where(ptr) + ": " + what);
}

Status SchemaCompiler::CheckKeywords(const Json& s, const std::string& ptr) const {
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    if (Annotations().count(k) != 0) continue;
    if (Supported().count(k) == 0) {
      return Status::Invalid("unsupported JSON Schema keyword \"" + k + "\" at " + Where(ptr));
    }
    const Json& v = it.value();
    auto schema_like = [](const Json& x) { return x.is_object() || x.is_boolean(); };
    if (k == "type") {
      const bool list = v.is_array() && !v.empty();
      if (!v.is_string() && !list)
        return SchemaError(ptr, "\"type\" must be a type name or a list of them");
      for (const Json& t : list ? v : Json::array({v})) {
        if (!t.is_string() || std::find(TypeNames().begin(), TypeNames().end(),
                                        t.get_ref<const std::string&>()) == TypeNames().end()) {
          return SchemaError(ptr, "\"type\": unknown type " + t.dump());
        }
      }
    } else if (k == "properties" || k == "$defs" || k == "definitions") {
      if (!v.is_object()) return SchemaError(ptr, "\"" + k + "\" must be an object of schemas");
      for (auto p = v.begin(); p != v.end(); ++p) {
        if (!schema_like(p.value())) {
          return SchemaError(ptr + "/" + k + "/" + PointerEscape(p.key()),
                             "a schema must be an object or a boolean");
        }
      }
    } else if (k == "required") {
      if (!v.is_array() ||
          !std::all_of(v.begin(), v.end(), [](const Json& x) { return x.is_string(); })) {
        return SchemaError(ptr, "\"required\" must be a list of property names");
      }
    } else if (k == "additionalProperties" || k == "items") {
      if (!schema_like(v))
        return SchemaError(ptr, "\"" + k + "\" must be a schema (an object or a boolean)");
    } else if (k == "minItems" || k == "maxItems" || k == "minLength" || k == "maxLength") {
      if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
        return SchemaError(ptr, "\"" + k + "\" must be a non-negative integer");
      }
      if (v.get<uint64_t>() > kMaxCount) {
        return SchemaError(
            ptr, "\"" + k + "\" above " + std::to_string(kMaxCount) + " is not supported");
      }
    } else if (k == "enum" || k == "anyOf" || k == "oneOf") {
      if (!v.is_array() || v.empty())
        return SchemaError(ptr, "\"" + k + "\" must be a non-empty list");
    } else if (k == "$ref") {
      if (!v.is_string()) return SchemaError(ptr, "\"$ref\" must be a string");
    }
  }
  for (const auto& [lo, hi] :
       {std::pair{"minItems", "maxItems"}, std::pair{"minLength", "maxLength"}}) {
    if (s.contains(lo) && s.contains(hi) && s[lo].get<uint64_t>() > s[hi].get<uint64_t>()) {
      return SchemaError(ptr,
                         std::string("\"") + lo + "\" is above \"" + hi + "\": nothing is valid");
    }
  }
  if (!AllUtf8(s)) return SchemaError(ptr, "a string is not valid UTF-8");
  return Status::Ok();
}

// `keyword` combined with anything but annotations, $defs, definitions and `also_allowed`
// would intersect two schemas, which this compiler does not do.
Status SchemaCompiler::CheckAlone(const Json& s, const std::string& ptr, std::string_view keyword,
                                  const std::set<std::string_view>& also_allowed) const {
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    if (k == keyword || Annotations().count(k) || k == "$defs" || k == "definitions" ||
        also_allowed.count(k)) {
      continue;
    }
    std::string what(1, '"');
    what.append(keyword);
    what += "\" combined with \"" + k + "\" is not supported";
    if ((keyword == "enum" && k == "const") || (keyword == "anyOf" && k == "oneOf")) {
      return SchemaError(ptr, what);
    }
    return SchemaError(ptr, what + " (move \"" + k + "\" into each alternative)");
  }
  return Status::Ok();
}

Result<std::vector<std::string>> SchemaCompiler::Types(const Json& s,
                                                       const std::string& ptr) const {
  (void)ptr;
  std::vector<std::string> types;
  if (s.contains("type")) {
    const Json& t = s["type"];
    for (const Json& x : t.is_array() ? t : Json::array({t})) types.push_back(x.get<std::string>());
  } else if (s.contains("properties") || s.contains("required") ||
             s.contains("additionalProperties")) {
    types = {"object"};
  } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
    types = {"array"};
  } else if (s.contains("minLength") || s.contains("maxLength")) {
    types = {"string"};
  } else {
    types = {"string", "number", "boolean", "null", "object", "array"};
  }
  std::sort(types.begin(), types.end());
  types.erase(std::unique(types.begin(), types.end()), types.end());
  // integer ⊂ number: one alternative is enough (and keeps the grammar unambiguous).
  if (std::count(types.begin(), types.end(), "number") != 0) {
    types.erase(std::remove(types.begin(), types.end(), "integer"), types.end());
  }
  return types;
}

Result<std::pair<const Json*, std::string>> SchemaCompiler::Resolve(const Json& ref,
                                                                    const std::string& ptr) const {
  const std::string& r = ref.get_ref<const std::string&>();
  if (r == "#") return std::pair<const Json*, std::string>{&root_, ""};
  for (const std::string_view prefix : {"#/$defs/", "#/definitions/"}) {
    if (r.rfind(prefix, 0) != 0) continue;
    const std::string container(prefix.substr(2, prefix.size() - 3));
    std::string name;
    const std::string_view token = std::string_view(r).substr(prefix.size());
    if (token.find('/') != std::string_view::npos) break;
    for (size_t i = 0; i < token.size(); ++i) {
      if (token[i] == '~' && i + 1 < token.size() && (token[i + 1] == '0' || token[i + 1] == '1')) {
        name.push_back(token[i + 1] == '0' ? '~' : '/');
        ++i;
      } else {
        name.push_back(token[i]);
      }
    }
    if (!root_.is_object() || !root_.contains(container) || !root_[container].is_object() ||
        !root_[container].contains(name)) {
      return SchemaError(ptr, "$ref \"" + r + "\": no such definition");
    }
    return std::pair<const Json*, std::string>{&root_[container][name],
                                               "/" + container + "/" + PointerEscape(name)};
  }
  return SchemaError(ptr, "unsupported $ref \"" + r +
                              "\" (supported: \"#\", \"#/$defs/NAME\", \"#/definitions/NAME\")");
}

}  // namespace k3::run::grammar
