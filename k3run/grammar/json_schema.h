// JSON Schema (a subset, docs/GRAMMAR.md) → GBNF text for Grammar::Parse.
//
// Two forms:
//   kJsonText      a JSON value matching the schema (response_format json_schema,
//                  --json-schema). JsonObjectGbnf() is response_format json_object: any object.
//   kXtmlArguments the argument list of a Kimi K3 tool call for an object schema: per argument
//                  <|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|>
//                  with K's & and " written &amp; and &quot;, T the value's JSON type (string,
//                  number, boolean, null, object, array) and VALUE the raw text for strings
//                  (not quoted, no escapes), the JSON text of the value otherwise. The grammar
//                  names the specials kXtmlSpecialNames.
// Every sentence of the produced grammar is a value the schema validates (checked against
// python3-jsonschema's Draft 2020-12 validator by tests/k3run/grammar/), with these choices:
//   - properties in schema order; required ones always, each optional one may be skipped;
//   - additionalProperties absent counts as false (no extra keys are generated); true or a
//     schema adds at most 8 extra members after the declared ones, keys written without
//     escapes and never equal to a declared name;
//   - whitespace: none, except at most one space after ':' and after ',' (JSON text);
//   - numbers: at most 16 integral digits, 16 fraction digits and 2 exponent digits (every
//     value is a finite double: parsers such as nlohmann refuse overflow); integers
//     -?(0|[1-9][0-9]{0,15});
//   - oneOf is compiled as anyOf: exact only when its alternatives do not overlap.
// Rule names: the start rule is `root_rule`, every other rule is `root_rule` + "-" + a name, so
// texts made with different root_rules can be concatenated into one grammar.
#pragma once

#include <array>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/status.h"

namespace k3::run::grammar {

enum class SchemaForm { kJsonText, kXtmlArguments };

inline constexpr std::array<std::string_view, 3> kXtmlSpecialNames = {"<|open|>", "<|close|>",
                                                                      "<|sep|>"};

// kInvalid naming the keyword and its JSON pointer for anything outside the subset, e.g.
// `unsupported JSON Schema keyword "pattern" at /properties/name`.
// nlohmann::json keeps object keys sorted, so "schema order" is then alphabetical; pass an
// nlohmann::ordered_json (or the text) to keep the order the schema was written in.
Result<std::string> JsonSchemaToGbnf(const nlohmann::json& schema, SchemaForm form,
                                     std::string_view root_rule = "root");
Result<std::string> JsonSchemaToGbnf(const nlohmann::ordered_json& schema, SchemaForm form,
                                     std::string_view root_rule = "root");
// The schema as JSON text (parsed keeping its order; kInvalid if it is not JSON).
Result<std::string> JsonSchemaTextToGbnf(std::string_view schema_text, SchemaForm form,
                                         std::string_view root_rule = "root");

// Any JSON object (members unbounded, any keys), in the whitespace rules above.
std::string JsonObjectGbnf(std::string_view root_rule = "root");

}  // namespace k3::run::grammar
