// JSON Schema refusals: every keyword outside the subset, and every malformed or unsupported
// use of one inside it, is kInvalid naming the keyword and its JSON pointer.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "k3run/grammar/json_schema.h"

namespace k3::run::grammar {
namespace {

struct SchemaRefusal {
  const char* name;
  const char* schema;
  SchemaForm form;
  std::string message;
};

class JsonSchemaRefusal : public ::testing::TestWithParam<SchemaRefusal> {};

TEST_P(JsonSchemaRefusal, ExactMessage) {
  const SchemaRefusal& r = GetParam();
  auto gbnf = JsonSchemaTextToGbnf(r.schema, r.form);
  ASSERT_FALSE(gbnf.ok()) << r.schema << "\n" << *gbnf;
  EXPECT_EQ(gbnf.status().code(), Code::kInvalid);
  EXPECT_EQ(gbnf.status().message(), r.message);
}

constexpr SchemaForm kJson = SchemaForm::kJsonText;
constexpr SchemaForm kXtml = SchemaForm::kXtmlArguments;

std::string Unsupported(const std::string& keyword, const std::string& at) {
  return "unsupported JSON Schema keyword \"" + keyword + "\" at " + at;
}

INSTANTIATE_TEST_SUITE_P(
    Schema, JsonSchemaRefusal,
    ::testing::Values(
        SchemaRefusal{"Pattern",
                      R"({"type":"object","properties":{"name":{"type":"string","pattern":"^a"}}})",
                      kJson, Unsupported("pattern", "/properties/name")},
        SchemaRefusal{"Format", R"({"type":"string","format":"date"})", kJson,
                      Unsupported("format", "the root")},
        SchemaRefusal{"Minimum", R"({"type":"array","items":{"type":"integer","minimum":0}})",
                      kJson, Unsupported("minimum", "/items")},
        SchemaRefusal{"Maximum", R"({"maximum":3})", kJson, Unsupported("maximum", "the root")},
        SchemaRefusal{"ExclusiveMinimum", R"({"exclusiveMinimum":3})", kJson,
                      Unsupported("exclusiveMinimum", "the root")},
        SchemaRefusal{"MultipleOf", R"({"multipleOf":3})", kJson,
                      Unsupported("multipleOf", "the root")},
        SchemaRefusal{"AllOf", R"({"allOf":[{"type":"string"}]})", kJson,
                      Unsupported("allOf", "the root")},
        SchemaRefusal{"Not", R"({"not":{"type":"string"}})", kJson, Unsupported("not", "the root")},
        SchemaRefusal{"IfThenElse", R"({"if":{"type":"string"}})", kJson,
                      Unsupported("if", "the root")},
        SchemaRefusal{"PatternProperties", R"({"type":"object","patternProperties":{"^x":{}}})",
                      kJson, Unsupported("patternProperties", "the root")},
        SchemaRefusal{"PropertyNames", R"({"type":"object","propertyNames":{"maxLength":3}})",
                      kJson, Unsupported("propertyNames", "the root")},
        SchemaRefusal{"MinProperties", R"({"type":"object","minProperties":1})", kJson,
                      Unsupported("minProperties", "the root")},
        SchemaRefusal{"PrefixItems", R"({"type":"array","prefixItems":[{"type":"string"}]})", kJson,
                      Unsupported("prefixItems", "the root")},
        SchemaRefusal{"UniqueItems", R"({"type":"array","uniqueItems":true})", kJson,
                      Unsupported("uniqueItems", "the root")},
        SchemaRefusal{"Contains", R"({"type":"array","contains":{"type":"string"}})", kJson,
                      Unsupported("contains", "the root")},
        SchemaRefusal{"DependentRequired", R"({"type":"object","dependentRequired":{}})", kJson,
                      Unsupported("dependentRequired", "the root")},
        SchemaRefusal{
            "InsideDefs",
            R"({"$defs":{"a b":{"type":"string","contentEncoding":"base64"}},"$ref":"#/$defs/a b"})",
            kJson, Unsupported("contentEncoding", "/$defs/a b")},
        SchemaRefusal{"InsideAnyOf", R"({"anyOf":[{"type":"null"},{"type":"number","maximum":1}]})",
                      kJson, Unsupported("maximum", "/anyOf/1")},
        SchemaRefusal{"EscapedPointer",
                      R"({"type":"object","properties":{"a/b~c":{"uniqueItems":true}}})", kJson,
                      Unsupported("uniqueItems", "/properties/a~1b~0c")},
        SchemaRefusal{"UnknownType", R"({"type":"strng"})", kJson,
                      "JSON Schema at the root: \"type\": unknown type \"strng\""},
        SchemaRefusal{"BadRequired", R"({"type":"object","required":"a"})", kJson,
                      "JSON Schema at the root: \"required\" must be a list of property names"},
        SchemaRefusal{
            "TupleItems", R"({"type":"array","items":[{"type":"string"}]})", kJson,
            "JSON Schema at the root: \"items\" must be a schema (an object or a boolean)"},
        SchemaRefusal{"NegativeMinItems", R"({"type":"array","minItems":-1})", kJson,
                      "JSON Schema at the root: \"minItems\" must be a non-negative integer"},
        SchemaRefusal{
            "MinAboveMax", R"({"type":"array","minItems":3,"maxItems":2})", kJson,
            "JSON Schema at the root: \"minItems\" is above \"maxItems\": nothing is valid"},
        SchemaRefusal{"EmptyEnum", R"({"enum":[]})", kJson,
                      "JSON Schema at the root: \"enum\" must be a non-empty list"},
        SchemaRefusal{"EnumWithoutTypedValue", R"({"type":"integer","enum":["a",1.5]})", kJson,
                      "JSON Schema at the root: no value of \"enum\" has the schema's type"},
        SchemaRefusal{
            "AnyOfWithType", R"({"type":"object","anyOf":[{"required":["a"]}]})", kJson,
            "JSON Schema at the root: \"anyOf\" combined with \"type\" is not supported (move "
            "\"type\" into each alternative)"},
        SchemaRefusal{
            "RefWithSibling",
            R"({"$defs":{"a":{}},"properties":{"x":{"$ref":"#/$defs/a","type":"string"}}})", kJson,
            "JSON Schema at /properties/x: \"$ref\" combined with \"type\" is not supported (move "
            "\"type\" into each alternative)"},
        SchemaRefusal{
            "RemoteRef", R"({"$ref":"https://example.com/s.json"})", kJson,
            "JSON Schema at the root: unsupported $ref \"https://example.com/s.json\" (supported: "
            "\"#\", \"#/$defs/NAME\", \"#/definitions/NAME\")"},
        SchemaRefusal{"MissingDefinition", R"({"properties":{"p":{"$ref":"#/$defs/nope"}}})", kJson,
                      "JSON Schema at /properties/p: $ref \"#/$defs/nope\": no such definition"},
        SchemaRefusal{"FalseSchema", R"({"type":"object","properties":{"never":false}})", kJson,
                      "JSON Schema at /properties/never: the schema false accepts no value"},
        SchemaRefusal{
            "RefCycleWithoutContent",
            R"({"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"anyOf":[{"$ref":"#/$defs/a"}]}},"$ref":"#/$defs/a"})",
            kJson,
            "JSON Schema: the grammar compiled from the JSON Schema:2:1: left recursion: rule "
            "\"root-ref-defs-a\" can reach itself before matching any input "
            "(root-ref-defs-a -> root-ref-defs-b -> root-ref-defs-a)"},
        SchemaRefusal{
            "XtmlTopNotObject", R"({"type":"array"})", kXtml,
            "JSON Schema at the root: tool-call arguments need an object schema at the top "
            "(\"type\": \"object\")"},
        SchemaRefusal{
            "XtmlTopAnyOf", R"({"anyOf":[{"type":"object"}]})", kXtml,
            "JSON Schema at the root: tool-call arguments need an object schema at the top "
            "(found \"anyOf\")"},
        SchemaRefusal{
            "XtmlTypeList", R"({"type":["object","null"]})", kXtml,
            "JSON Schema at the root: tool-call arguments need an object schema at the top "
            "(\"type\": \"object\")"},
        SchemaRefusal{"NotJson", R"({"type":)", kJson, "JSON Schema: not valid JSON"}),
    [](const ::testing::TestParamInfo<SchemaRefusal>& param_info) {
      return std::string(param_info.param.name);
    });

TEST(JsonSchemaRefusal, BadRootRuleName) {
  auto gbnf = JsonSchemaToGbnf(nlohmann::json::object(), SchemaForm::kJsonText, "has space");
  ASSERT_FALSE(gbnf.ok());
  EXPECT_EQ(gbnf.status().message(),
            "JSON Schema: root rule name \"has space\" is not a GBNF rule name ([a-zA-Z0-9_-]+)");
}

TEST(JsonSchemaRefusal, AnnotationsAreIgnored) {
  auto gbnf = JsonSchemaTextToGbnf(
      R"({"$schema":"https://json-schema.org/draft/2020-12/schema","$id":"x","title":"t",
          "description":"d","default":1,"examples":[1],"$comment":"c","type":"integer"})",
      SchemaForm::kJsonText);
  EXPECT_TRUE(gbnf.ok()) << gbnf.status().ToString();
}

TEST(JsonSchemaRefusal, NestingDepthIsBounded) {
  std::string schema;
  for (int i = 0; i < 300; ++i) schema += R"({"type":"array","items":)";
  schema += "{}";
  schema.append(300, '}');
  auto gbnf = JsonSchemaTextToGbnf(schema, SchemaForm::kJsonText);
  ASSERT_FALSE(gbnf.ok());
  EXPECT_NE(gbnf.status().message().find(": subschemas nested deeper than 256"), std::string::npos)
      << gbnf.status().message();
}

}  // namespace
}  // namespace k3::run::grammar
