#include "k3run/serve/openai_tools.h"

#include <set>

namespace k3::run {
namespace {

using json = nlohmann::json;

ApiError Bad(const std::string& param, const std::string& what) {
  return BadRequest("'" + param + "' " + what, param);
}

// OpenAI's rule for function names: 1–64 of a-z, A-Z, 0-9, '_' and '-'.
bool ValidFunctionName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

bool ParseTools(const json& body, ApiRequest* r, ApiError* error) {
  auto it = body.find("tools");
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_array()) {
    *error = Bad("tools", "must be an array of {\"type\": \"function\", \"function\": {...}}");
    return false;
  }
  std::set<std::string> names;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    const std::string param = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) {
      *error = Bad(param, "must be an object");
      return false;
    }
    if (t.value("type", std::string()) != "function") {
      *error = Bad(param + ".type", "must be \"function\" (the only tool type)");
      return false;
    }
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) {
      *error = Bad(param + ".function", "must be an object with a name");
      return false;
    }
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || !ValidFunctionName(name->get<std::string>())) {
      *error = Bad(param + ".function.name",
                   "must be 1-64 characters of a-z, A-Z, 0-9, '_' and '-'");
      return false;
    }
    if (!names.insert(name->get<std::string>()).second) {
      *error = Bad(param + ".function.name",
                   "repeats \"" + name->get<std::string>() + "\" (names must be unique)");
      return false;
    }
    if (auto d = fn->find("description"); d != fn->end() && !d->is_null() && !d->is_string()) {
      *error = Bad(param + ".function.description", "must be a string");
      return false;
    }
    ToolSpec spec;
    spec.name = name->get<std::string>();
    auto params = fn->find("parameters");
    if (params == fn->end() || params->is_null()) {
      spec.parameters = R"({"type":"object","properties":{}})";
    } else if (!params->is_object()) {
      *error = Bad(param + ".function.parameters", "must be a JSON Schema object");
      return false;
    } else {
      spec.parameters = params->dump();
    }
    r->tools.push_back(std::move(spec));
  }
  if (!it->empty()) r->tmpl.tools_json = it->dump(-1, ' ', false, json::error_handler_t::replace);
  return true;
}

bool ParseToolChoice(const json& body, ApiRequest* r, ApiError* error) {
  auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) {
    r->tool_choice = r->tools.empty() ? "none" : "auto";  // OpenAI's defaults
  } else if (it->is_string()) {
    const std::string c = it->get<std::string>();
    if (c != "none" && c != "auto" && c != "required") {
      *error = Bad("tool_choice", "must be \"none\", \"auto\", \"required\" or "
                                  "{\"type\": \"function\", \"function\": {\"name\": ...}}");
      return false;
    }
    r->tool_choice = c;
  } else if (it->is_object()) {
    auto fn = it->find("function");
    if (it->value("type", std::string()) != "function" || fn == it->end() || !fn->is_object() ||
        !fn->contains("name") || !(*fn)["name"].is_string()) {
      *error = Bad("tool_choice", "must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
      return false;
    }
    r->tool_choice = "function";
    r->tool_choice_name = (*fn)["name"].get<std::string>();
    bool known = false;
    for (const ToolSpec& t : r->tools) known = known || t.name == r->tool_choice_name;
    if (!known) {
      *error = Bad("tool_choice", "names function \"" + r->tool_choice_name +
                                      "\", which is not in 'tools'");
      return false;
    }
  } else {
    *error = Bad("tool_choice", "must be a string or an object");
    return false;
  }
  if (r->tools.empty() && (r->tool_choice == "required" || r->tool_choice == "function")) {
    *error = Bad("tool_choice", "is \"" + r->tool_choice + "\" but 'tools' is empty");
    return false;
  }
  if (auto p = body.find("parallel_tool_calls"); p != body.end() && !p->is_null()) {
    if (!p->is_boolean()) {
      *error = Bad("parallel_tool_calls", "must be a boolean");
      return false;
    }
    r->parallel_tool_calls = p->get<bool>();
  }
  // The template renders required and none (the released encoder's words); a named function
  // is enforced by the grammar alone, as upstream.
  r->tmpl.tool_choice = r->tools.empty() ? "" : r->tool_choice;
  return true;
}

bool ParseResponseFormat(const json& body, ApiRequest* r, ApiError* error) {
  auto it = body.find("response_format");
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string()) {
    *error = Bad("response_format", "must be {\"type\": \"text\" | \"json_object\" | "
                                    "\"json_schema\", ...}");
    return false;
  }
  const std::string type = (*it)["type"].get<std::string>();
  if (type == "text") return true;
  if (type == "json_object") {
    r->response_format = type;
  } else if (type == "json_schema") {
    auto js = it->find("json_schema");
    if (js == it->end() || !js->is_object()) {
      *error = Bad("response_format.json_schema", "must be an object with a 'schema'");
      return false;
    }
    auto schema = js->find("schema");
    if (schema == js->end() || !schema->is_object()) {
      *error = Bad("response_format.json_schema.schema", "must be a JSON Schema object");
      return false;
    }
    r->response_format = type;
    r->response_schema = schema->dump();
    r->tmpl.response_schema_json = r->response_schema;
  } else {
    *error = Bad("response_format.type", "must be \"text\", \"json_object\" or \"json_schema\"");
    return false;
  }
  r->tmpl.response_format = r->response_format;
  return true;
}

}  // namespace

bool ParseToolFields(const json& body, ApiRequest* r, ApiError* error) {
  if (!ParseTools(body, r, error) || !ParseToolChoice(body, r, error) ||
      !ParseResponseFormat(body, r, error)) {
    return false;
  }
  if (!r->response_format.empty() &&
      (r->tool_choice == "required" || r->tool_choice == "function")) {
    *error = Bad("response_format", "cannot be combined with a tool_choice that forces a call");
    return false;
  }
  return true;
}

bool ParseMessageToolParts(const json& m, const std::string& param, ChatMessage* msg,
                           ApiError* error) {
  if (msg->role == "tool") {
    auto id = m.find("tool_call_id");
    if (id == m.end() || !id->is_string() || id->get<std::string>().empty()) {
      *error = Bad(param + ".tool_call_id", "is required for a tool message (a string)");
      return false;
    }
    msg->tool_call_id = id->get<std::string>();
    if (auto n = m.find("name"); n != m.end() && n->is_string()) msg->name = n->get<std::string>();
    return true;
  }
  auto calls = m.find("tool_calls");
  if (calls == m.end() || calls->is_null()) return true;
  if (msg->role != "assistant") {
    *error = Bad(param + ".tool_calls", "is only allowed on assistant messages");
    return false;
  }
  if (!calls->is_array()) {
    *error = Bad(param + ".tool_calls", "must be an array");
    return false;
  }
  for (size_t k = 0; k < calls->size(); ++k) {
    const json& c = (*calls)[k];
    const std::string p = param + ".tool_calls[" + std::to_string(k) + "]";
    auto fn = c.is_object() ? c.find("function") : c.end();
    if (!c.is_object() || fn == c.end() || !fn->is_object() || !fn->contains("name") ||
        !(*fn)["name"].is_string()) {
      *error = Bad(p, "must be {\"id\", \"type\": \"function\", \"function\": {\"name\", "
                      "\"arguments\"}}");
      return false;
    }
    ToolCall call;
    if (auto id = c.find("id"); id != c.end() && id->is_string()) call.id = id->get<std::string>();
    call.name = (*fn)["name"].get<std::string>();
    if (auto a = fn->find("arguments"); a != fn->end() && !a->is_null()) {
      if (a->is_string()) {
        call.arguments = a->get<std::string>();
      } else if (a->is_object()) {  // lenient: some clients send the object itself
        call.arguments = a->dump(-1, ' ', false, json::error_handler_t::replace);
      } else {
        *error = Bad(p + ".function.arguments", "must be a string of JSON");
        return false;
      }
    }
    msg->tool_calls.push_back(std::move(call));
  }
  return true;
}

bool CheckToolResults(const std::vector<ChatMessage>& messages, ApiError* error) {
  const ChatMessage* caller = nullptr;  // the assistant message the current tool run answers
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "assistant") {
      caller = m.tool_calls.empty() ? nullptr : &m;
      continue;
    }
    if (m.role != "tool") {
      caller = nullptr;
      continue;
    }
    const std::string param = "messages[" + std::to_string(i) + "].tool_call_id";
    if (caller == nullptr) {
      *error = Bad(param, "\"" + m.tool_call_id + "\": a tool message must follow an assistant "
                          "message with tool_calls");
      return false;
    }
    bool found = false;
    for (const ToolCall& c : caller->tool_calls) found = found || c.id == m.tool_call_id;
    if (!found) {
      *error = Bad(param, "\"" + m.tool_call_id + "\" matches no tool call of the preceding "
                          "assistant message");
      return false;
    }
  }
  return true;
}

}  // namespace k3::run
