#include "k3run/grammar/completion_grammar.h"

#include "k3run/grammar/gbnf_text.h"
#include "k3run/grammar/json_schema.h"

namespace k3::run::grammar {
namespace {

Status Where(const std::string& where, const Status& s) {
  return Status::Invalid(where + ": " + s.message());
}

Result<std::string> JsonAnswer(const CompletionSpec& spec) {
  std::string body;
  if (spec.schema.is_null()) {
    body = JsonObjectGbnf("k3-json");
  } else {
    Result<std::string> s = JsonSchemaToGbnf(spec.schema, SchemaForm::kJsonText, "k3-json");
    if (!s.ok()) return Where(spec.schema_where, s.status());
    body = s.value();
  }
  return "k3-answer ::= k3-json <|close|> \"response\" <|sep|> k3-end\n" + body;
}

Result<std::string> ToolAnswer(const CompletionSpec& spec) {
  if (spec.tools.empty()) return Status::Invalid("a forced tool call needs at least one tool");
  std::string g = "k3-answer ::= <|close|> \"response\" <|sep|> <|open|> \"tools\" <|sep|> "
                  "k3-call-1 <|close|> \"tools\" <|sep|> k3-end\n";
  std::string arg_rules;
  for (size_t t = 0; t < spec.tools.size(); ++t) {
    Result<std::string> s = JsonSchemaToGbnf(spec.tools[t].parameters, SchemaForm::kXtmlArguments,
                                             "k3-args" + std::to_string(t));
    if (!s.ok()) return Where(spec.tools[t].where, s.status());
    arg_rules += s.value();
  }
  // Call i (1-based, as the template numbers calls) of any allowed tool, then maybe call i + 1.
  for (int i = 1; i <= spec.max_calls; ++i) {
    std::string alts;
    for (size_t t = 0; t < spec.tools.size(); ++t) {
      if (!alts.empty()) alts += " | ";
      const std::string header = "call tool=\"" + XtmlAttributeEscape(spec.tools[t].name) +
                                 "\" index=\"" + std::to_string(i) + "\"";
      alts += GbnfLiteral(header) + " <|sep|> k3-args" + std::to_string(t);
    }
    g += "k3-call-" + std::to_string(i) + " ::= <|open|> ( " + alts +
         " ) <|close|> \"call\" <|sep|>";
    if (i < spec.max_calls) g += " k3-call-" + std::to_string(i + 1) + "?";
    g += "\n";
  }
  return g + arg_rules;
}

}  // namespace

Result<std::string> CompletionGbnf(const CompletionSpec& spec) {
  std::string g;
  if (spec.thinking) {
    g = "root ::= k3-reasoning <|close|> \"think\" <|sep|> <|open|> \"response\" <|sep|> "
        "k3-answer\nk3-reasoning ::= .*\n";
  } else {
    g = "root ::= k3-answer\n";
  }
  g += "k3-end ::= <|close|> \"message\" <|sep|> ( <|end_of_msg|> | <[EOS]> )\n";
  if (spec.answer == AnswerKind::kNoTools) {
    return g + "k3-answer ::= .* <|close|> \"response\" <|sep|> k3-end\n";
  }
  K3_ASSIGN_OR_RETURN(std::string answer, spec.answer == AnswerKind::kToolCall
                                              ? ToolAnswer(spec)
                                              : JsonAnswer(spec));
  return g + answer;
}

}  // namespace k3::run::grammar
