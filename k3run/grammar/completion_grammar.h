// The grammar of a whole K3 chat completion whose answer is constrained (docs/TOOLS.md): a JSON
// value (response_format json_object / json_schema, --json-schema in chat) or a forced tool
// call (tool_choice required or a named function, --tool-choice). It spans the completion after
// the generation prompt, in the template's channels, so the mandatory markers stay where the
// model expects them:
//   thinking on : free reasoning, <|close|>think<|sep|><|open|>response<|sep|>, then the answer;
//   thinking off: the answer directly (the generation prompt opened the response);
//   JSON answer : the value, <|close|>response<|sep|><|close|>message<|sep|>, an end token;
//   no tools    : free text, <|close|>response<|sep|><|close|>message<|sep|>, an end token;
//   tool answer : an empty response, <|close|>response<|sep|><|open|>tools<|sep|>, one call (or
//                 up to max_calls) of the allowed tools, each call's arguments in XTML form
//                 matching its parameters schema, <|close|>tools<|sep|><|close|>message<|sep|>,
//                 an end token ([EOS] or <|end_of_msg|>).
// The response before a forced call is empty by construction: free text there could run to
// max_tokens before the call the client asked for.
// Each schema's rules are named after a start rule of their own (json_schema.h), so several
// schemas share one grammar.
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace k3::run::grammar {

struct ToolGrammar {
  std::string name;            // the function's name (escaped here as the template escapes it)
  nlohmann::json parameters;   // its parameters schema (an object schema)
  std::string where;           // names it in errors, e.g. "tools[2].function.parameters"
};

enum class AnswerKind {
  kJson,      // a JSON value (schema, or any object)
  kToolCall,  // an empty response, then the tools section
  kNoTools,   // free text, and no tools section (tool_choice none with tools declared)
};

struct CompletionSpec {
  bool thinking = true;
  AnswerKind answer = AnswerKind::kJson;
  nlohmann::json schema;           // JSON answer: the schema; null: any JSON object
  std::string schema_where;        // names the schema in errors
  std::vector<ToolGrammar> tools;  // tool answer: the tools the call may use (≥ 1)
  int max_calls = 1;               // tool answer: calls in the message (1 or more)
};

// GBNF for Grammar::Parse. kInvalid "WHERE: unsupported JSON Schema keyword …" for a schema
// outside the subset (json_schema.h).
Result<std::string> CompletionGbnf(const CompletionSpec& spec);

}  // namespace k3::run::grammar
