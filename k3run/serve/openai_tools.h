// The tool-call and structured-output fields of an OpenAI chat request (docs/TOOLS.md):
// `tools`, `tool_choice`, `parallel_tool_calls`, `response_format`, and the messages that carry
// calls (assistant `tool_calls`) and their results (role `tool` with `tool_call_id`).
// Every refusal is a 400 naming the field (`param`), e.g. "'tool_choice' names function
// \"x\", which is not in 'tools'". Schemas are checked for the supported JSON-Schema subset
// later, when the constraint is built (structured_output.h), and refused there the same way.
// Thread safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3run/serve/openai_request.h"

namespace k3::run {

// tools, tool_choice, parallel_tool_calls and response_format of `body` into `r` (r->tools,
// r->tool_choice, ..., and r->tmpl's rendering fields). false with *error on a bad field.
bool ParseToolFields(const nlohmann::json& body, ApiRequest* r, ApiError* error);

// One message's tool parts: an assistant's `tool_calls` into msg->tool_calls; a `tool`
// message's `tool_call_id` (and `name`). `param` is "messages[i]". false with *error.
bool ParseMessageToolParts(const nlohmann::json& m, const std::string& param, ChatMessage* msg,
                           ApiError* error);

// Every `tool` message answers a call of the assistant message before it (other tool results
// may sit between): its tool_call_id must be one of that message's call ids. false with *error
// naming messages[i].tool_call_id otherwise.
bool CheckToolResults(const std::vector<ChatMessage>& messages, ApiError* error);

}  // namespace k3::run
