#include "k3run/serve/structured_output.h"

#include <nlohmann/json.hpp>

#include "k3run/engine/grammar_constraint.h"
#include "k3run/grammar/completion_grammar.h"

namespace k3::run {

bool CompletionGrammar(const ApiRequest& r, std::string* gbnf, ApiError* error) {
  gbnf->clear();
  const bool forced = r.tool_choice == "required" || r.tool_choice == "function";
  // tool_choice none with tools declared: whatever the model writes, no tools section.
  const bool no_tools = r.tool_choice == "none" && !r.tools.empty();
  if (r.endpoint != Endpoint::kChat || (r.response_format.empty() && !forced && !no_tools)) {
    return true;
  }
  grammar::CompletionSpec spec;
  spec.thinking = r.tmpl.thinking;
  spec.answer = forced             ? grammar::AnswerKind::kToolCall
                : r.response_format.empty() ? grammar::AnswerKind::kNoTools
                                            : grammar::AnswerKind::kJson;
  std::string param;  // the field a schema error names
  if (forced) {
    for (size_t t = 0; t < r.tools.size(); ++t) {
      if (r.tool_choice == "function" && r.tools[t].name != r.tool_choice_name) continue;
      const std::string where = "tools[" + std::to_string(t) + "].function.parameters";
      spec.tools.push_back({r.tools[t].name, nlohmann::json::parse(r.tools[t].parameters), where});
    }
    spec.max_calls = r.parallel_tool_calls ? kMaxParallelCalls : 1;
  } else if (r.response_format == "json_schema") {
    spec.schema = nlohmann::json::parse(r.response_schema);
    spec.schema_where = "response_format.json_schema.schema";
    param = spec.schema_where;
  }
  Result<std::string> g = grammar::CompletionGbnf(spec);
  if (!g.ok()) {
    // The message starts with the field it names ("tools[1].function.parameters: …").
    const std::string& m = g.status().message();
    const size_t colon = m.find(':');
    *error = BadRequest(m, colon == std::string::npos ? param : m.substr(0, colon));
    return false;
  }
  *gbnf = std::move(g).value();
  return true;
}

bool BuildConstraint(const ServerContext& ctx, const ApiRequest& r,
                     std::shared_ptr<TokenConstraint>* out, ApiError* error) {
  out->reset();
  std::string gbnf;
  if (!CompletionGrammar(r, &gbnf, error)) return false;
  if (gbnf.empty()) return true;
  if (ctx.grammars == nullptr) {
    *error = BadRequest("this model has no tokenizer: constrained output needs one",
                        r.response_format.empty() ? "tool_choice" : "response_format");
    return false;
  }
  Result<std::shared_ptr<TokenConstraint>> c =
      MakeGrammarConstraint(ctx.grammars.get(), gbnf, "the request's completion grammar");
  if (!c.ok()) {
    ApiError e;
    e.http = 500;
    e.type = "server_error";
    e.message = "the completion grammar did not compile: " + c.status().message();
    *error = e;
    return false;
  }
  *out = std::move(c).value();
  return true;
}

}  // namespace k3::run
