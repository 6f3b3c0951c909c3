// The constraint of a chat request that asks for structured output (docs/TOOLS.md):
// `response_format` json_object / json_schema, `tool_choice` required / a named function, and
// `tool_choice` none with tools declared (no tools section may be written). The grammar is
// k3run/grammar/completion_grammar.h's, over the whole completion. tool_choice auto, no tools,
// and response_format text add no constraint: those requests keep today's bits exactly. A schema outside the supported subset is a 400 naming the keyword and the field.
// Thread safety: pure functions (the library is thread-safe).
#pragma once

#include <memory>
#include <string>

#include "k3run/engine/token_constraint.h"
#include "k3run/serve/openai_request.h"
#include "k3run/serve/server_context.h"

namespace k3::run {

inline constexpr int kMaxParallelCalls = 8;

// The GBNF of `r`'s completion, or "" when `r` is unconstrained. false with *error (400
// naming response_format.json_schema.schema or tools[i].function.parameters).
bool CompletionGrammar(const ApiRequest& r, std::string* gbnf, ApiError* error);

// The constraint for one request (its own state), or null when unconstrained. false + *error.
bool BuildConstraint(const ServerContext& ctx, const ApiRequest& r,
                     std::shared_ptr<TokenConstraint>* out, ApiError* error);

}  // namespace k3::run
