#include "k3run/grammar/json_schema.h"

#include <vector>

#include "k3run/grammar/gbnf_text.h"
#include "k3run/grammar/grammar.h"
#include "k3run/grammar/schema_compiler.h"

namespace k3::run::grammar {
namespace {

constexpr int kMaxExtraArguments = 8;

}  // namespace

// One argument: <|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|>, with one
// alternative per JSON type the value may have, each with its own T.
Result<std::string> SchemaCompiler::XtmlArgument(const std::string& key_expr,
                                                 const std::vector<Typed>& values,
                                                 const std::string& hint) {
  std::vector<std::string> per_type;
  for (const char* type : {"string", "number", "boolean", "null", "object", "array"}) {
    std::string exprs;
    for (const Typed& v : values) {
      if (v.type != type) continue;
      exprs += (exprs.empty() ? "" : " | ") + v.expr;
    }
    if (exprs.empty()) continue;
    per_type.push_back(GbnfLiteral(std::string(type) + "\"") + " <|sep|> (" + exprs + ")");
  }
  const std::string name = NewRule(hint + "-argument");
  std::string body = "<|open|> " + key_expr + " (";
  for (size_t i = 0; i < per_type.size(); ++i) body += (i ? " | " : "") + per_type[i];
  body += R"() <|close|> "argument" <|sep|>)";
  SetRule(name, std::move(body));
  return name;
}

Result<std::string> SchemaCompiler::XtmlArguments() {
  const Json* s = &root_;
  std::string ptr;
  std::set<std::string> seen;
  while (s->is_object() && s->contains("$ref")) {
    K3_RETURN_IF_ERROR(CheckKeywords(*s, ptr));
    K3_RETURN_IF_ERROR(CheckAlone(*s, ptr, "$ref", {}));
    if (!seen.insert((*s)["$ref"].get<std::string>()).second) {
      return SchemaError(ptr, "$ref refers back to itself");
    }
    K3_ASSIGN_OR_RETURN(const auto target, Resolve((*s)["$ref"], ptr));
    s = target.first;
    ptr = target.second;
  }
  const std::string need = "tool-call arguments need an object schema at the top";
  if (!s->is_object()) return SchemaError(ptr, need);
  K3_RETURN_IF_ERROR(CheckKeywords(*s, ptr));
  for (const char* k : {"anyOf", "oneOf", "enum", "const"}) {
    if (s->contains(k)) return SchemaError(ptr, need + " (found \"" + k + "\")");
  }
  K3_ASSIGN_OR_RETURN(const std::vector<std::string> types, Types(*s, ptr));
  if (types != std::vector<std::string>{"object"}) {
    return SchemaError(ptr, need + " (\"type\": \"object\")");
  }
  K3_ASSIGN_OR_RETURN(const Members m, ObjectMembers(*s, ptr));
  std::vector<std::string> parts;
  for (size_t i = 0; i < m.names.size(); ++i) {
    const std::string hint = "arg-" + m.names[i];
    K3_ASSIGN_OR_RETURN(const std::vector<Typed> values,
                        Alternatives(*m.schemas[i], m.pointers[i], hint, /*raw=*/true));
    const std::string key =
        GbnfLiteral("argument key=\"" + XtmlAttributeEscape(m.names[i]) + "\" type=\"");
    K3_ASSIGN_OR_RETURN(const std::string arg, XtmlArgument(key, values, hint));
    parts.push_back(m.required[i] ? arg : arg + "?");
  }
  if (m.additional != nullptr) {
    std::vector<Typed> values;
    if (m.additional->is_boolean()) {
      values = AnyValue(true);
    } else {
      K3_ASSIGN_OR_RETURN(values, Alternatives(*m.additional, ptr + "/additionalProperties",
                                               "extra", /*raw=*/true));
    }
    // Extra keys: non-empty, without " and & (so no entity is ever needed), never a declared
    // name.
    const std::string key = NotOneOf(
        m.names, R"("&)", [](uint32_t cp) { return cp == '"' || cp == '&'; }, false, "xkey");
    const std::string key_expr =
        GbnfLiteral("argument key=\"") + " " + key + " " + GbnfLiteral("\" type=\"");
    K3_ASSIGN_OR_RETURN(const std::string arg, XtmlArgument(key_expr, values, "extra"));
    parts.push_back(arg + "{0," + std::to_string(kMaxExtraArguments) + "}");
  }
  std::string body = parts.empty() ? "\"\"" : "";
  for (size_t i = 0; i < parts.size(); ++i) body += (i ? " " : "") + parts[i];
  rules_.insert(rules_.begin(), {root_rule_, body});
  return Text();
}

namespace {

// Every compiled text is parsed once here, so a schema that cannot become a grammar (a $ref
// cycle that writes nothing, say) fails now, naming the schema, not later in Grammar::Parse.
Result<std::string> Checked(std::string text, std::string_view root_rule) {
  std::vector<std::string> specials(kXtmlSpecialNames.begin(), kXtmlSpecialNames.end());
  const std::string full =
      root_rule == "root" ? text : text + "root ::= " + std::string(root_rule) + "\n";
  auto g = Grammar::Parse(full, specials, "the grammar compiled from the JSON Schema");
  if (!g.ok()) return Status::Invalid("JSON Schema: " + g.status().message());
  return text;
}

Result<std::string> Compile(const Json& schema, SchemaForm form, std::string_view root_rule) {
  if (!IsGbnfRuleName(root_rule)) {
    return Status::Invalid("JSON Schema: root rule name \"" + std::string(root_rule) +
                           "\" is not a GBNF rule name ([a-zA-Z0-9_-]+)");
  }
  SchemaCompiler c(schema, std::string(root_rule));
  K3_ASSIGN_OR_RETURN(std::string text,
                      form == SchemaForm::kJsonText ? c.JsonText() : c.XtmlArguments());
  return Checked(std::move(text), root_rule);
}

}  // namespace

Result<std::string> JsonSchemaToGbnf(const nlohmann::json& schema, SchemaForm form,
                                     std::string_view root_rule) {
  return Compile(Json(schema), form, root_rule);
}

Result<std::string> JsonSchemaToGbnf(const nlohmann::ordered_json& schema, SchemaForm form,
                                     std::string_view root_rule) {
  return Compile(schema, form, root_rule);
}

Result<std::string> JsonSchemaTextToGbnf(std::string_view schema_text, SchemaForm form,
                                         std::string_view root_rule) {
  Json schema = Json::parse(schema_text, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return Status::Invalid("JSON Schema: not valid JSON");
  return Compile(schema, form, root_rule);
}

std::string JsonObjectGbnf(std::string_view root_rule) {
  const Json none;
  SchemaCompiler c(none, std::string(root_rule));
  return c.AnyObject();
}

}  // namespace k3::run::grammar
