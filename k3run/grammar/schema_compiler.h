// The JSON Schema → GBNF compiler behind json_schema.h. Internal to k3run/grammar.
//
// One rule per schema that needs one, named after where it sits (root-name-item, ...); the JSON
// primitives (string, number, value, ...) are shared rules, written once when first used.
// Schemas reached through $ref become one rule per reference target, named before its body is
// compiled, so recursive schemas give recursive (never left-recursive) rules.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace k3::run::grammar {

using Json = nlohmann::ordered_json;

// RFC 6901 escaping of one JSON pointer token (~ → ~0, / → ~1).
std::string PointerEscape(std::string_view key);
// kInvalid "JSON Schema at POINTER: what" ("the root" for the empty pointer).
Status SchemaError(const std::string& ptr, const std::string& what);

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, std::string root_rule);

  Result<std::string> JsonText();
  Result<std::string> XtmlArguments();
  // Any JSON object: the shared object rule as the start rule.
  std::string AnyObject();

 private:
  // One way to write a value: its JSON type ("string", "number", "boolean", "null", "object",
  // "array"; integers are "number"; "" for a $ref in JSON text, where no one asks) and a GBNF
  // item (a rule name, literal or group).
  struct Typed {
    std::string type;
    std::string expr;
  };
  struct Members {  // an object schema's members, in generation order
    std::vector<std::string> names;
    std::vector<const Json*> schemas;
    std::vector<std::string> pointers;
    std::vector<bool> required;
    const Json* additional = nullptr;  // null: no extra members
  };

  std::string NewRule(std::string_view hint);
  void SetRule(const std::string& name, std::string body);
  std::string Shared(std::string_view which);
  std::string Text() const;

  Status CheckKeywords(const Json& s, const std::string& ptr) const;
  Status CheckAlone(const Json& s, const std::string& ptr, std::string_view keyword,
                    const std::set<std::string_view>& also_allowed) const;
  Result<std::vector<std::string>> Types(const Json& s, const std::string& ptr) const;
  Result<std::pair<const Json*, std::string>> Resolve(const Json& ref,
                                                      const std::string& ptr) const;

  // A GBNF item for the JSON text of a value valid under `s`.
  Result<std::string> Compile(const Json& s, const std::string& ptr, const std::string& hint);
  // The ways to write a value valid under `s`; `raw`: strings as raw text (XTML values).
  Result<std::vector<Typed>> Alternatives(const Json& s, const std::string& ptr,
                                          const std::string& hint, bool raw);
  std::vector<Typed> AnyValue(bool raw);
  Result<std::string> RefRule(const Json& ref, const std::string& ptr);
  Result<std::string> StringRule(const Json& s, const std::string& ptr, const std::string& hint,
                                 bool raw);
  Result<std::string> ArrayRule(const Json& s, const std::string& ptr, const std::string& hint);
  Result<Members> ObjectMembers(const Json& s, const std::string& ptr) const;
  Result<std::string> ObjectRule(const Json& s, const std::string& ptr, const std::string& hint);
  // Strings over the code points outside `excluded_class` (GBNF class members) that are none of
  // `names`; the empty string only if `allow_empty`.
  std::string NotOneOf(const std::vector<std::string>& names, std::string_view excluded_class,
                       const std::function<bool(uint32_t)>& is_excluded, bool allow_empty,
                       const std::string& hint);
  Result<std::string> XtmlArgument(const std::string& key_expr, const std::vector<Typed>& values,
                                   const std::string& hint);

  const Json& root_;
  std::string root_rule_;
  std::vector<std::pair<std::string, std::string>> rules_;  // name, body; in creation order
  std::set<std::string> taken_;
  std::map<std::string, std::string> shared_;
  std::map<std::string, std::string> ref_rules_;
  std::set<std::string> refs_expanding_;  // $ref targets inside Alternatives (cycle guard)
  int depth_ = 0;                         // Alternatives calls in progress
};

}  // namespace k3::run::grammar
