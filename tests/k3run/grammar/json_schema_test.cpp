// JSON Schema → GBNF, end to end: for each schema, 50 seeded random walks through its grammar
// (choices among the allowed tokens of a synthetic vocabulary) must finish, give valid UTF-8
// that nlohmann parses, and validate against the schema under python3-jsonschema (Draft
// 2020-12, validate_outputs.py). The same for the XTML tool-call form (each argument list
// turned into a JSON object) and for json_object.
#include "k3run/grammar/json_schema.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/utf8.h"
#include "grammar_walk.h"
#include "k3run/grammar/grammar.h"
#include "k3run/grammar/matcher.h"
#include "k3run/grammar/token_masker.h"

namespace k3::run::grammar {
namespace {

using Json = nlohmann::ordered_json;
constexpr int kWalksPerSchema = 50;

struct SchemaCase {
  const char* name;
  const char* schema;
  bool object_at_top;  // also checked in the XTML form
};

const SchemaCase kCases[] = {
    {"flat", R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},
       "required":["name","age"]})",
     true},
    {"nested", R"({"type":"object","properties":{"person":{"type":"object","properties":{
       "first":{"type":"string","minLength":1,"maxLength":8},
       "address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},
       "zip":{"type":"integer"}},"required":["city"]}},"required":["first","address"]},
       "active":{"type":"boolean"}},"required":["person"]})",
     true},
    {"arrays", R"({"type":"object","properties":{
       "tags":{"type":"array","items":{"type":"string","maxLength":6},"minItems":1,"maxItems":3},
       "scores":{"type":"array","items":{"type":"number"},"maxItems":5},
       "exactly2":{"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":2},
       "none":{"type":"array","maxItems":0}},"required":["tags","exactly2","none"]})",
     true},
    {"enums", R"({"type":"object","properties":{"color":{"enum":["red","green","blue"]},
       "size":{"enum":[1,2.5,"XL",null,true,{"a":[1,"x"]}]},"typed":{"type":"string","enum":["a","b",3]}},
       "required":["color","size","typed"]})",
     true},
    {"consts", R"({"type":"object","properties":{"version":{"const":2},
       "kind":{"const":"fixed \"quoted\" \\ sl\u00e9sh"},"obj":{"const":{"a":[1,2],"b":null}}},
       "required":["version","kind","obj"]})",
     true},
    {"any_of", R"({"type":"object","properties":{"v":{"anyOf":[{"type":"string","maxLength":4},
       {"type":"integer"},{"type":"object","properties":{"x":{"type":"number"}},"required":["x"]}]}},
       "required":["v"]})",
     true},
    {"defs_ref", R"({"$defs":{"point":{"type":"object","properties":{"x":{"type":"number"},
       "y":{"type":"number"}},"required":["x","y"]}},"type":"object","properties":{
       "a":{"$ref":"#/$defs/point"},"path":{"type":"array","items":{"$ref":"#/$defs/point"},"maxItems":4}},
       "required":["a","path"]})",
     true},
    {"recursive_tree",
     R"({"$defs":{"node":{"type":"object","properties":{"value":{"type":"integer"},
       "children":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":3}},
       "required":["value","children"]}},"$ref":"#/$defs/node"})",
     true},
    {"recursive_root", R"({"type":"object","properties":{"v":{"type":"integer"},
       "next":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},"required":["v","next"]})",
     true},
    {"primitives", R"({"type":"object","properties":{"i":{"type":"integer"},"n":{"type":"number"},
       "b":{"type":"boolean"},"z":{"type":"null"}},"required":["i","n","b","z"]})",
     true},
    {"optional_only_closed",
     R"({"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"},
       "c":{"type":"boolean"},"d":{"type":"null"},"e":{"type":"number"}},"additionalProperties":false})",
     true},
    {"additional_true",
     R"({"type":"object","properties":{"a":{"type":"integer"},"ab":{"type":"boolean"}},
       "required":["a"],"additionalProperties":true})",
     true},
    {"additional_schema",
     R"({"type":"object","properties":{"name":{"type":"string"}},"required":["name"],
       "additionalProperties":{"type":"integer"}})",
     true},
    {"type_lists", R"({"type":"object","properties":{"s":{"type":["string","null"]},
       "m":{"type":["integer","boolean","array"],"items":{"type":"string"}},"nt":{"type":["number","integer"]}},
       "required":["s","m","nt"]})",
     true},
    {"top_array", R"({"type":"array","items":{"type":"object","properties":{"id":{"type":"integer"},
       "ok":{"type":"boolean"}},"required":["id"]},"minItems":2,"maxItems":4})",
     false},
    {"top_string",
     R"({"type":"string","minLength":2,"maxLength":5,"description":"annotations are ignored"})",
     false},
    {"anything", R"({})", false},
    {"definitions_oneof",
     R"({"definitions":{"name":{"type":"string"}},"type":"object","properties":{
       "who":{"$ref":"#/definitions/name"},"what":{"oneOf":[{"type":"string"},{"type":"integer"}]}},
       "required":["who","what"]})",
     true},
    {"deep",
     R"({"type":"object","properties":{"l1":{"type":"array","maxItems":2,"items":{"type":"object",
       "properties":{"l2":{"type":"array","maxItems":2,"items":{"enum":["x","y"]}},
       "l2b":{"type":"object","properties":{"l3":{"type":"boolean"}}}},"required":["l2"]}}},"required":["l1"]})",
     true},
    {"unicode_keys",
     R"({"type":"object","properties":{"名前":{"type":"string"},"emoji 😀":{"enum":["é","日本"]},
       "a\"b":{"type":"integer"},"c\\d":{"type":"boolean"},"x&y":{"type":"null"}},
       "required":["名前","a\"b"],"additionalProperties":{"type":"boolean"}})",
     true},
    {"required_without_property", R"({"type":"object","properties":{"a":{"type":"integer"}},
       "required":["a","b"]})",
     true},
    {"mixed_optional",
     R"({"type":"object","properties":{"o1":{"type":"integer"},"r1":{"type":"string","enum":["k"]},
       "o2":{"type":"boolean"},"r2":{"type":"null"},"o3":{"type":"string"}},"required":["r1","r2"]})",
     true},
};

std::vector<std::string> XtmlSpecials() {
  return {kXtmlSpecialNames.begin(), kXtmlSpecialNames.end()};
}

std::shared_ptr<const Vocabulary> WalkVocabulary() {
  static const std::shared_ptr<const Vocabulary> v = [] {
    test::SyntheticVocabularyOptions o;
    o.seed = 2024;
    o.random_tokens = 3000;
    return test::SyntheticVocabulary(o);
  }();
  return v;
}

// Walks `gbnf` kWalksPerSchema times; returns the walks (each checked to finish).
std::vector<test::WalkResult> Walks(const std::string& name, const std::string& gbnf,
                                    std::vector<int> closing_symbols) {
  std::vector<test::WalkResult> out;
  auto g = Grammar::Parse(gbnf, XtmlSpecials(), name);
  EXPECT_TRUE(g.ok()) << g.status().ToString() << "\n" << gbnf;
  if (!g.ok()) return out;
  auto vocab = WalkVocabulary();
  TokenMasker masker(*g, vocab);
  for (int w = 0; w < kWalksPerSchema; ++w) {
    test::WalkOptions o;
    o.seed = 1000 * static_cast<uint64_t>(w) + name.size();
    o.soft_length = 4 + (w * 37) % 160;
    o.closing_symbols = closing_symbols;
    test::WalkResult r = test::RandomWalk(masker, *vocab, *g, o);
    EXPECT_TRUE(r.finished) << name << " walk " << w << ": " << r.failure << "\nso far: " << r.bytes
                            << "\n"
                            << gbnf;
    EXPECT_TRUE(IsValidUtf8(r.bytes)) << name << " walk " << w;
    if (r.finished) out.push_back(std::move(r));
  }
  return out;
}

// XTML argument list → JSON object: string values as JSON strings, others parsed as JSON.
std::string XtmlToJson(const std::vector<test::Piece>& p, std::string* error) {
  enum { kOpen = 0, kClose = 1, kSep = 2 };
  Json obj = Json::object();
  size_t i = 0;
  auto fail = [&](const std::string& what) {
    *error = what + " at piece " + std::to_string(i);
    return std::string();
  };
  while (i < p.size()) {
    if (p[i].symbol != kOpen) return fail("expected <|open|>");
    ++i;
    if (i >= p.size() || p[i].symbol != -1) return fail("expected the argument header");
    const std::string& head = p[i].bytes;
    const std::string prefix = "argument key=\"";
    const size_t key_end = head.find('"', prefix.size());
    const size_t type_at = key_end + std::string("\" type=\"").size();
    if (head.rfind(prefix, 0) != 0 || key_end == std::string::npos ||
        head.compare(key_end, 8, "\" type=\"") != 0 || head.back() != '"') {
      return fail("bad header " + head);
    }
    std::string key;
    const std::string raw_key = head.substr(prefix.size(), key_end - prefix.size());
    for (size_t k = 0; k < raw_key.size();) {
      if (raw_key.compare(k, 6, "&quot;") == 0) {
        key += '"';
        k += 6;
      } else if (raw_key.compare(k, 5, "&amp;") == 0) {
        key += '&';
        k += 5;
      } else {
        key += raw_key[k++];
      }
    }
    const std::string type = head.substr(type_at, head.size() - 1 - type_at);
    ++i;
    if (i >= p.size() || p[i].symbol != kSep) return fail("expected <|sep|>");
    ++i;
    std::string value;
    if (i < p.size() && p[i].symbol == -1) value = p[i++].bytes;
    if (i >= p.size() || p[i].symbol != kClose) return fail("expected <|close|>");
    ++i;
    if (i >= p.size() || p[i].bytes != "argument") return fail("expected argument");
    ++i;
    if (i >= p.size() || p[i].symbol != kSep) return fail("expected the final <|sep|>");
    ++i;
    if (type == "string") {
      obj[key] = value;
      continue;
    }
    Json v = Json::parse(value, nullptr, false);
    if (v.is_discarded()) return fail("value of type " + type + " is not JSON: " + value);
    const bool type_ok = (type == "number" && v.is_number()) ||
                         (type == "boolean" && v.is_boolean()) || (type == "null" && v.is_null()) ||
                         (type == "object" && v.is_object()) || (type == "array" && v.is_array());
    if (!type_ok) return fail("type=\"" + type + "\" but the value is " + value);
    obj[key] = std::move(v);
  }
  return obj.dump();
}

// Runs validate_outputs.py on `cases`; fails the test if it exits non-zero; skips (visibly)
// when /usr/bin/python3 has no jsonschema.
void Validate(const Json& cases, const std::string& what) {
  if (std::system("/usr/bin/python3 -c 'import jsonschema' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3-jsonschema is missing (apt-get install python3-jsonschema): " << what
                 << " outputs were generated and parsed, but not validated";
  }
  char dir_template[] = "/tmp/k3-grammar-XXXXXX";
  const char* dir = mkdtemp(dir_template);
  ASSERT_NE(dir, nullptr);
  const std::string path = std::string(dir) + "/cases.json";
  {
    std::ofstream f(path, std::ios::binary);
    f << cases.dump(1);
  }
  const std::string cmd = "/usr/bin/python3 " + std::string(K3_SOURCE_DIR) +
                          "/tests/k3run/grammar/validate_outputs.py " + path + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), pipe)) output.append(buf, n);
  const int status = pclose(pipe);
  std::printf("%s: %s", what.c_str(), output.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  // K3_GRAMMAR_KEEP_OUTPUTS=1 keeps the cases file (its path is printed) for a look at them.
  if (std::getenv("K3_GRAMMAR_KEEP_OUTPUTS") != nullptr) {
    std::printf("%s: cases kept in %s\n", what.c_str(), path.c_str());
    return;
  }
  std::remove(path.c_str());
  rmdir(dir);
}

TEST(JsonSchema, JsonTextOutputsValidate) {
  Json cases = Json::array();
  for (const SchemaCase& c : kCases) {
    const Json schema = Json::parse(c.schema);
    auto gbnf = JsonSchemaToGbnf(schema, SchemaForm::kJsonText);
    ASSERT_TRUE(gbnf.ok()) << c.name << ": " << gbnf.status().ToString();
    Json outputs = Json::array();
    for (const test::WalkResult& r : Walks(c.name, *gbnf, {})) {
      EXPECT_FALSE(Json::parse(r.bytes, nullptr, false).is_discarded())
          << c.name << ": " << r.bytes;
      outputs.push_back(r.bytes);
    }
    EXPECT_EQ(outputs.size(), static_cast<size_t>(kWalksPerSchema)) << c.name;
    cases.push_back({{"name", c.name}, {"schema", schema}, {"outputs", outputs}});
  }
  Validate(cases, "kJsonText");
}

TEST(JsonSchema, XtmlArgumentOutputsValidate) {
  Json cases = Json::array();
  for (const SchemaCase& c : kCases) {
    if (!c.object_at_top) continue;
    const Json schema = Json::parse(c.schema);
    auto gbnf = JsonSchemaToGbnf(schema, SchemaForm::kXtmlArguments);
    ASSERT_TRUE(gbnf.ok()) << c.name << ": " << gbnf.status().ToString();
    Json outputs = Json::array();
    for (const test::WalkResult& r : Walks(std::string(c.name) + "-xtml", *gbnf, {1, 2})) {
      std::string error;
      const std::string object = XtmlToJson(r.pieces, &error);
      EXPECT_TRUE(error.empty()) << c.name << ": " << error;
      if (error.empty()) outputs.push_back(object);
    }
    EXPECT_EQ(outputs.size(), static_cast<size_t>(kWalksPerSchema)) << c.name;
    cases.push_back(
        {{"name", std::string(c.name) + "-xtml"}, {"schema", schema}, {"outputs", outputs}});
  }
  Validate(cases, "kXtmlArguments");
}

TEST(JsonSchema, JsonObjectOutputsAreObjects) {
  const std::string gbnf = JsonObjectGbnf();
  int nonempty = 0;
  for (const test::WalkResult& r : Walks("json_object", gbnf, {})) {
    const Json v = Json::parse(r.bytes, nullptr, false);
    EXPECT_TRUE(v.is_object()) << r.bytes;
    nonempty += v.is_object() && !v.empty();
  }
  EXPECT_GT(nonempty, kWalksPerSchema / 4);
}

TEST(JsonSchema, XtmlArgumentGrammarText) {
  // The exact text for a small schema: the argument syntax, key escaping, per-type alternatives.
  const Json schema = Json::parse(
      R"({"type":"object","properties":{"q&\"":{"type":["string","integer"]}},"required":["q&\""]})");
  auto gbnf = JsonSchemaToGbnf(schema, SchemaForm::kXtmlArguments, "call");
  ASSERT_TRUE(gbnf.ok()) << gbnf.status().ToString();
  EXPECT_EQ(*gbnf,
            "call ::= call-arg-q-argument\n"
            "call-integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"
            "call-raw ::= .*\n"
            "call-arg-q-argument ::= <|open|> \"argument key=\\\"q&amp;&quot;\\\" type=\\\"\" "
            "(\"string\\\"\" <|sep|> (call-raw) | \"number\\\"\" <|sep|> (call-integer)) <|close|> "
            "\"argument\" <|sep|>\n");
}

TEST(JsonSchema, PropertyOrderFollowsTheSchemaText) {
  auto gbnf = JsonSchemaTextToGbnf(
      R"({"type":"object","properties":{"zeta":{"type":"null"},"alpha":{"type":"null"}},
          "required":["zeta","alpha"]})",
      SchemaForm::kJsonText);
  ASSERT_TRUE(gbnf.ok()) << gbnf.status().ToString();
  auto g = Grammar::Parse(*gbnf, {}, "order");
  ASSERT_TRUE(g.ok());
  Matcher m(*g);
  EXPECT_TRUE(m.AcceptBytes("{\"zeta\": null, \"alpha\":null}"));
  EXPECT_TRUE(m.Finished());
  Matcher sorted(*g);
  EXPECT_FALSE(sorted.AcceptBytes("{\"alpha\""));
}

TEST(JsonSchema, ExtraMembersNeverRepeatADeclaredName) {
  const Json schema = Json::parse(
      R"({"type":"object","properties":{"a":{"type":"integer"},"ab":{"type":"boolean"}},
          "required":["a"],"additionalProperties":{"type":"null"}})");
  auto gbnf = JsonSchemaToGbnf(schema, SchemaForm::kJsonText);
  ASSERT_TRUE(gbnf.ok()) << gbnf.status().ToString();
  auto g = Grammar::Parse(*gbnf, {}, "extras");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto accepts = [&](std::string_view s) {
    Matcher m(*g);
    return m.AcceptBytes(s) && m.CanEnd();
  };
  EXPECT_TRUE(accepts(R"({"a":1,"abc":null,"":null,"b":null, "A":null})"));
  EXPECT_TRUE(accepts(R"({"a":1,"ab":true,"x":null})"));
  EXPECT_FALSE(accepts(R"({"a":1,"a":null})"));  // a declared name as an extra
  EXPECT_FALSE(accepts(R"({"a":1,"ab":true,"ab":null})"));
  EXPECT_FALSE(accepts(R"({"a":1,"x":null,"ab":null})"));  // declared ones come first
  EXPECT_FALSE(accepts(R"({"a":1,"\u0061b":null})"));      // extra keys have no escapes
  EXPECT_FALSE(accepts(R"({"a":1,"x":1})"));               // extras follow their schema
  std::string nine = R"({"a":1)";
  for (int i = 0; i < 9; ++i) nine += ",\"k" + std::to_string(i) + "\":null";
  EXPECT_TRUE(accepts(nine.substr(0, nine.rfind(',')) + "}"));  // 8 extras
  EXPECT_FALSE(accepts(nine + "}"));                            // 9 extras

  auto xtml = JsonSchemaToGbnf(schema, SchemaForm::kXtmlArguments);
  ASSERT_TRUE(xtml.ok()) << xtml.status().ToString();
  auto gx = Grammar::Parse(*xtml, XtmlSpecials(), "extras-xtml");
  ASSERT_TRUE(gx.ok()) << gx.status().ToString();
  auto argument = [](Matcher* m, std::string_view key, std::string_view type,
                     std::string_view value) {
    return m->AcceptSpecial(0) &&
           m->AcceptBytes("argument key=\"" + std::string(key) + "\" type=\"" + std::string(type) +
                          "\"") &&
           m->AcceptSpecial(2) && m->AcceptBytes(value) && m->AcceptSpecial(1) &&
           m->AcceptBytes("argument") && m->AcceptSpecial(2);
  };
  Matcher ok(*gx);
  EXPECT_TRUE(argument(&ok, "a", "number", "7") && argument(&ok, "abc", "null", "null") &&
              ok.CanEnd());
  Matcher repeat(*gx);
  ASSERT_TRUE(argument(&repeat, "a", "number", "7"));
  EXPECT_FALSE(argument(&repeat, "a", "null", "null"));
  Matcher empty_key(*gx);
  ASSERT_TRUE(argument(&empty_key, "a", "number", "7"));
  EXPECT_FALSE(argument(&empty_key, "", "null", "null"));
}

}  // namespace
}  // namespace k3::run::grammar
