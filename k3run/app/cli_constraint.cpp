#include "k3run/app/cli_constraint.h"

#include <nlohmann/json.hpp>

#include "k3run/engine/stop_rules.h"
#include "k3run/grammar/json_schema.h"
#include "k3run/serve/openai_tools.h"
#include "k3run/serve/structured_output.h"

namespace k3::run {
namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxConstraintFileBytes = uint64_t{16} << 20;

Result<std::string> ReadFlagFile(Env* env, const std::string& flag, const std::string& path) {
  Result<std::string> text = ReadFileToString(env, path, kMaxConstraintFileBytes);
  if (!text.ok()) {
    return Status::Invalid(flag + " " + path + ": cannot read it: " + text.status().message());
  }
  return text;
}

Result<json> ReadJsonFile(Env* env, const std::string& flag, const std::string& path) {
  K3_ASSIGN_OR_RETURN(std::string text, ReadFlagFile(env, flag, path));
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    return Status::Invalid(flag + " " + path + ": not JSON (byte " + std::to_string(e.byte) +
                           "): " + e.what());
  }
}

// The chat flags as the server's request fields: one parser, one set of rules.
Result<CliConstraint> LoadChat(Env* env, const tok::Tokenizer* tok, const RunOptions& o) {
  json body = json::object();
  std::string what;  // the files, for messages
  if (!o.tools_file.empty()) {
    K3_ASSIGN_OR_RETURN(body["tools"], ReadJsonFile(env, "--tools", o.tools_file));
    what = "--tools " + o.tools_file;
  }
  if (o.tool_choice) {
    if (o.tools_file.empty()) return Status::Invalid("--tool-choice needs --tools FILE");
    const std::string& c = *o.tool_choice;
    body["tool_choice"] = c == "auto" || c == "none" || c == "required"
                              ? json(c)
                              : json{{"type", "function"}, {"function", {{"name", c}}}};
  }
  if (!o.json_schema_file.empty()) {
    K3_ASSIGN_OR_RETURN(json schema, ReadJsonFile(env, "--json-schema", o.json_schema_file));
    body["response_format"] = {{"type", "json_schema"},
                               {"json_schema", {{"name", "cli"}, {"schema", schema}}}};
    what += (what.empty() ? "" : ", ") + std::string("--json-schema ") + o.json_schema_file;
  }
  ApiRequest r;
  r.endpoint = Endpoint::kChat;
  r.tmpl.thinking = !o.no_think;
  ApiError error;
  std::string gbnf;
  if (!ParseToolFields(body, &r, &error) || !CompletionGrammar(r, &gbnf, &error)) {
    return Status::Invalid(what + ": " + error.message);
  }
  CliConstraint c;
  c.tmpl = r.tmpl;
  c.tools = !r.tools.empty();
  c.gbnf = std::move(gbnf);
  c.source = what;
  if (!c.gbnf.empty()) {
    c.library = std::make_unique<GrammarLibrary>(MakeGrammarVocabulary(*tok, {}));
    K3_RETURN_IF_ERROR(c.library->Compile(c.gbnf, c.source).status());
  }
  return c;
}

}  // namespace

Result<std::shared_ptr<TokenConstraint>> CliConstraint::Make() const {
  if (library == nullptr || gbnf.empty()) return std::shared_ptr<TokenConstraint>();
  return MakeGrammarConstraint(library.get(), gbnf, source);
}

bool AnyConstraintFlag(const RunOptions& o) {
  return !o.grammar_file.empty() || !o.json_schema_file.empty() || !o.tools_file.empty() ||
         o.tool_choice.has_value();
}

Result<CliConstraint> LoadCliConstraint(Env* env, const tok::Tokenizer* tok, const RunOptions& o) {
  if (!AnyConstraintFlag(o)) return CliConstraint();
  if (!o.grammar_file.empty() && !o.json_schema_file.empty()) {
    return Status::Invalid("--grammar and --json-schema are exclusive: give one");
  }
  if (tok == nullptr) {
    return Status::Invalid("--grammar, --json-schema and --tools need the prepared directory's "
                           "tokenizer, and this one has none");
  }
  if (o.chat) {
    if (!o.grammar_file.empty()) {
      return Status::Invalid("--grammar is for prompt runs and --batch; in --chat use "
                             "--json-schema or --tools");
    }
    return LoadChat(env, tok, o);
  }
  if (!o.tools_file.empty() || o.tool_choice) {
    return Status::Invalid("--tools and --tool-choice are for --chat (prompt runs take "
                           "--grammar or --json-schema)");
  }
  CliConstraint c;
  if (!o.grammar_file.empty()) {
    K3_ASSIGN_OR_RETURN(c.gbnf, ReadFlagFile(env, "--grammar", o.grammar_file));
    c.source = "--grammar " + o.grammar_file;
  } else {
    K3_ASSIGN_OR_RETURN(json schema, ReadJsonFile(env, "--json-schema", o.json_schema_file));
    c.source = "--json-schema " + o.json_schema_file;
    Result<std::string> g = grammar::JsonSchemaToGbnf(schema, grammar::SchemaForm::kJsonText);
    if (!g.ok()) return Status::Invalid(c.source + ": " + g.status().message());
    c.gbnf = std::move(g).value();
  }
  // The text's grammar names no end token: the model's end tokens may follow a complete one.
  c.library = std::make_unique<GrammarLibrary>(MakeGrammarVocabulary(*tok, EndTokenIds(tok)));
  K3_RETURN_IF_ERROR(c.library->Compile(c.gbnf, c.source).status());
  return c;
}

}  // namespace k3::run
