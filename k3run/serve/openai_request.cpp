// OpenAI request bodies → ApiRequest (see openai_request.h).
#include "k3run/serve/openai_request.h"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "k3run/serve/openai_tools.h"

namespace k3::run {
namespace {

using json = nlohmann::json;

// A field read from a request object; every getter returns false with *error filled when the
// field is present but unusable. Absent and null fields leave the output untouched.
class Fields {
 public:
  Fields(const json& j, ApiError* error) : j_(j), error_(error) {}

  const json* Find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  bool Has(const char* key) const { return Find(key) != nullptr; }

  bool Bool(const char* key, bool* out) const {
    const json* v = Find(key);
    if (v == nullptr) return true;
    if (!v->is_boolean()) return Fail(key, "must be a boolean");
    *out = v->get<bool>();
    return true;
  }
  bool Number(const char* key, std::optional<double>* out) const {
    const json* v = Find(key);
    if (v == nullptr) return true;
    if (!v->is_number()) return Fail(key, "must be a number");
    const double d = v->get<double>();
    if (!std::isfinite(d)) return Fail(key, "must be finite");
    *out = d;
    return true;
  }
  bool Int(const char* key, std::optional<int64_t>* out) const {
    const json* v = Find(key);
    if (v == nullptr) return true;
    if (v->is_number_unsigned()) {
      if (v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
        return Fail(key, "is too large");
      }
      *out = static_cast<int64_t>(v->get<uint64_t>());
      return true;
    }
    if (!v->is_number_integer()) return Fail(key, "must be an integer");
    *out = v->get<int64_t>();
    return true;
  }
  bool String(const char* key, std::optional<std::string>* out) const {
    const json* v = Find(key);
    if (v == nullptr) return true;
    if (!v->is_string()) return Fail(key, "must be a string");
    *out = v->get<std::string>();
    return true;
  }
  ApiError* error() const { return error_; }
  bool Fail(const std::string& param, const std::string& what) const {
    *error_ = BadRequest("'" + param + "' " + what, param);
    return false;
  }

 private:
  const json& j_;
  ApiError* error_;
};

// Fields k3 does not implement: refused when they ask for something, accepted when they are the
// default (false, 0, an empty list), so generic clients that always send them still work.
bool RefuseUnsupported(const Fields& f, Endpoint endpoint) {
  if (endpoint == Endpoint::kCompletion) {
    for (const char* key : {"tools", "tool_choice", "response_format"}) {
      if (f.Has(key)) return f.Fail(key, "is for /v1/chat/completions only");
    }
  }
  if (const json* v = f.Find("functions"); v && !(v->is_array() && v->empty())) {
    return f.Fail("functions", "is not supported (the deprecated form of 'tools': use 'tools')");
  }
  if (const json* v = f.Find("logprobs"); v && !(v->is_boolean() && !v->get<bool>()) &&
                                            !(endpoint == Endpoint::kCompletion &&
                                              v->is_number_integer() && v->get<int64_t>() == 0)) {
    return f.Fail("logprobs", "is not supported");
  }
  if (f.Has("top_logprobs") && !(f.Find("top_logprobs")->is_number_integer() &&
                                 f.Find("top_logprobs")->get<int64_t>() == 0)) {
    return f.Fail("top_logprobs", "is not supported");
  }
  if (const json* v = f.Find("echo"); v && !(v->is_boolean() && !v->get<bool>())) {
    return f.Fail("echo", "is not supported");
  }
  if (const json* v = f.Find("best_of"); v && !(v->is_number_integer() && v->get<int64_t>() == 1)) {
    return f.Fail("best_of", "is not supported (only 1)");
  }
  if (const json* v = f.Find("suffix"); v && !(v->is_string() && v->get<std::string>().empty())) {
    return f.Fail("suffix", "is not supported");
  }
  std::optional<int64_t> n;
  if (!f.Int("n", &n)) return false;
  if (n && *n != 1) return f.Fail("n", "must be 1 (one choice per request)");
  return true;
}

// ValidateSamplerOptions names the CLI flag ("--top-p 2: must be in (0, 1]"); a client knows
// the field: "'top_p' 2: must be in (0, 1]", param top_p.
ApiError SamplerError(const std::string& message) {
  if (message.rfind("--", 0) != 0) return BadRequest(message);
  const size_t end = message.find_first_of(" :", 2);
  std::string param = message.substr(2, end == std::string::npos ? std::string::npos : end - 2);
  for (char& ch : param) ch = ch == '-' ? '_' : ch;
  const std::string rest = end == std::string::npos ? "" : message.substr(end);
  return BadRequest("'" + param + "'" + rest, param);
}

// temperature (default 1, as OpenAI), top_p, top_k, min_p, the penalties; seed.
bool ParseSampling(const Fields& f, ApiRequest* r) {
  SamplerOptions& s = r->sampling;
  std::optional<double> temperature, presence, frequency, repeat;
  std::optional<int64_t> last_n, seed;
  if (!f.Number("temperature", &temperature) || !f.Number("top_p", &s.top_p) ||
      !f.Int("top_k", &s.top_k) || !f.Number("min_p", &s.min_p) ||
      !f.Number("presence_penalty", &presence) || !f.Number("frequency_penalty", &frequency) ||
      !f.Number("repeat_penalty", &repeat) || !f.Int("repeat_last_n", &last_n)) {
    return false;
  }
  s.temperature = temperature.value_or(1.0);
  s.presence_penalty = presence.value_or(0.0);
  s.frequency_penalty = frequency.value_or(0.0);
  s.repeat_penalty = repeat.value_or(1.0);
  if (last_n) s.repeat_last_n = *last_n;
  if (const json* v = f.Find("seed")) {
    // OpenAI's seed is any integer; a negative one is taken modulo 2^64.
    if (v->is_number_unsigned()) {
      r->seed = v->get<uint64_t>();
    } else if (v->is_number_integer()) {
      r->seed = static_cast<uint64_t>(v->get<int64_t>());
    } else {
      return f.Fail("seed", "must be an integer");
    }
  }
  if (Status st = ValidateSamplerOptions(s); !st.ok()) {
    *f.error() = SamplerError(st.message());
    return false;
  }
  return true;
}

bool ParseStop(const Fields& f, std::vector<std::string>* stop) {
  const json* v = f.Find("stop");
  if (v == nullptr) return true;
  if (v->is_string()) {
    if (!v->get<std::string>().empty()) stop->push_back(v->get<std::string>());
    return true;
  }
  if (!v->is_array()) return f.Fail("stop", "must be a string or an array of strings");
  if (v->size() > kMaxStopStrings) {
    return f.Fail("stop", "has more than " + std::to_string(kMaxStopStrings) + " strings");
  }
  for (const json& s : *v) {
    if (!s.is_string()) return f.Fail("stop", "must be a string or an array of strings");
    if (!s.get<std::string>().empty()) stop->push_back(s.get<std::string>());
  }
  return true;
}

// "image K of message M" (both 1-based): how every refusal names an image part.
std::string ImageName(size_t message, int index) {
  return "image " + std::to_string(index) + " of message " + std::to_string(message + 1);
}

// A message's content: a string, or an array of {"type": "text", "text": ...} parts (joined)
// and, in a user message, {"type": "image_url", "image_url": {"url": ..., "detail": ...}} parts
// (each placed at the byte where it sits among the text; "detail" is accepted and ignored).
bool ParseContent(const json& m, size_t message, const std::string& role, std::string* out,
                  std::vector<ApiImagePart>* images, ApiError* error) {
  const std::string param = "messages[" + std::to_string(message) + "]";
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) return true;
  if (it->is_string()) {
    *out = it->get<std::string>();
    return true;
  }
  if (!it->is_array()) {
    *error = BadRequest("'" + param + ".content' must be a string or an array of content parts",
                        param + ".content");
    return false;
  }
  int count = 0;
  for (const json& part : *it) {
    const std::string type = part.is_object() ? part.value("type", std::string()) : "";
    if (type == "text" && part.contains("text") && part["text"].is_string()) {
      *out += part["text"].get<std::string>();
      continue;
    }
    if (type != "image_url") {
      *error = BadRequest("'" + param + ".content': only text parts ({\"type\": \"text\", "
                          "\"text\": ...}) and image parts ({\"type\": \"image_url\", "
                          "\"image_url\": {\"url\": \"data:image/png;base64,...\"}}) are "
                          "supported", param + ".content");
      return false;
    }
    const std::string name = ImageName(message, ++count);
    if (role != "user") {
      *error = BadRequest(name + ": images are accepted in user messages only (this one is " +
                          role + ")", param + ".content");
      return false;
    }
    const json* url = nullptr;
    if (auto iu = part.find("image_url"); iu != part.end()) {
      if (iu->is_string()) url = &*iu;  // a bare string, as some clients send
      if (iu->is_object() && iu->contains("url")) url = &(*iu)["url"];
    }
    if (url == nullptr || !url->is_string()) {
      *error = BadRequest(name + ": 'image_url' must be {\"url\": \"data:image/...;base64,...\"}",
                          param + ".content");
      return false;
    }
    const std::string u = url->get<std::string>();
    if (u.rfind("http://", 0) == 0 || u.rfind("https://", 0) == 0) {
      *error = BadRequest(name + ": remote images are not fetched; send the image itself as a "
                          "data URL (data:image/png;base64,... or data:image/jpeg;base64,...)",
                          param + ".content", "remote_image");
      return false;
    }
    images->push_back(ApiImagePart{message, count, out->size(), u});
  }
  return true;
}

bool ParseMessages(const Fields& f, const json& body, std::vector<ChatMessage>* out,
                   std::vector<ApiImagePart>* images, ApiError* error) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) return f.Fail("messages", "is required");
  if (!it->is_array() || it->empty()) return f.Fail("messages", "must be a non-empty array");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return f.Fail(param, "must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return f.Fail(param + ".role", "must be a string");
    ChatMessage msg;
    msg.role = role->get<std::string>();
    if (msg.role == "developer") msg.role = "system";  // OpenAI's newer name for it
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" &&
        msg.role != "tool") {
      return f.Fail(param + ".role", "must be system, developer, user, assistant or tool (\"" +
                                         role->get<std::string>() + "\" is not supported)");
    }
    if (!ParseContent(m, i, msg.role, &msg.content, images, error)) return false;
    if (!ParseMessageToolParts(m, param, &msg, error)) return false;
    if (msg.role == "assistant") {
      // A client re-sending our reply may keep its thinking; the template renders it back.
      if (auto rc = m.find("reasoning_content"); rc != m.end() && rc->is_string()) {
        msg.reasoning = rc->get<std::string>();
      }
    }
    out->push_back(std::move(msg));
  }
  return CheckToolResults(*out, error);
}

// prompt: a string, an array of ids, or a one-element array of either.
bool ParsePrompt(const Fields& f, ApiRequest* r) {
  const json* v = f.Find("prompt");
  if (v == nullptr) return f.Fail("prompt", "is required");
  if (v->is_array() && v->size() == 1 && ((*v)[0].is_string() || (*v)[0].is_array())) {
    v = &(*v)[0];
  }
  if (v->is_string()) {
    if (v->get<std::string>().empty()) return f.Fail("prompt", "is empty");
    r->prompt = v->get<std::string>();
    return true;
  }
  if (!v->is_array() || v->empty()) {
    return f.Fail("prompt", "must be a string or a non-empty array of token ids (one prompt)");
  }
  for (const json& id : *v) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return f.Fail("prompt", "must be a string or an array of non-negative token ids");
    }
    r->prompt_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return true;
}

bool ParseEffort(const Fields& f, ApiRequest* r) {
  std::optional<std::string> effort;
  if (!f.String("reasoning_effort", &effort)) return false;
  if (!effort) return true;
  std::optional<TemplateOptions> t = MapReasoningEffort(*effort);
  if (!t) return f.Fail("reasoning_effort", "must be none, minimal, low, medium, high or max");
  r->tmpl = *t;
  return true;
}

bool ParseLimits(const Fields& f, ApiRequest* r) {
  std::optional<int64_t> max_tokens, max_completion;
  if (!f.Int("max_tokens", &max_tokens) || !f.Int("max_completion_tokens", &max_completion)) {
    return false;
  }
  const char* param = max_tokens ? "max_tokens" : "max_completion_tokens";
  r->max_tokens = max_tokens ? max_tokens : max_completion;
  if (r->max_tokens && *r->max_tokens < 1) return f.Fail(param, "must be at least 1");
  if (!f.Bool("stream", &r->stream) || !f.Bool("ignore_eos", &r->ignore_eos)) return false;
  if (const json* so = f.Find("stream_options")) {
    if (!so->is_object()) return f.Fail("stream_options", "must be an object");
    if (!Fields(*so, f.error()).Bool("include_usage", &r->include_usage)) return false;
  }
  return true;
}

}  // namespace

std::string ErrorBody(const ApiError& e) {
  json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  return json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

ApiError BadRequest(std::string message, std::string param, std::string code) {
  ApiError e;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

std::optional<TemplateOptions> MapReasoningEffort(std::string_view effort) {
  TemplateOptions t;
  if (effort == "none" || effort == "minimal") {
    t.thinking = false;
  } else if (effort == "low") {
    t.effort = "low";
  } else if (effort == "medium" || effort == "high") {
    t.effort = "high";
  } else if (effort == "max") {
    t.effort = "max";
  } else {
    return std::nullopt;
  }
  return t;
}

bool ParseApiRequest(std::string_view body, Endpoint endpoint, ApiRequest* out, ApiError* error) {
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    *error = BadRequest("the request body is not valid JSON", "", "invalid_json");
    return false;
  }
  if (!j.is_object()) {
    *error = BadRequest("the request body must be a JSON object");
    return false;
  }
  ApiRequest r;
  r.endpoint = endpoint;
  const Fields f(j, error);
  std::optional<std::string> model;
  if (!f.String("model", &model) || !RefuseUnsupported(f, endpoint) || !ParseSampling(f, &r) ||
      !ParseStop(f, &r.stop) || !ParseLimits(f, &r)) {
    return false;
  }
  r.model = model.value_or("");
  if (endpoint == Endpoint::kChat) {
    if (!ParseMessages(f, j, &r.messages, &r.images, error) || !ParseEffort(f, &r) ||
        !ParseToolFields(j, &r, error)) {
      return false;
    }
  } else if (!ParsePrompt(f, &r)) {
    return false;
  }
  *out = std::move(r);
  return true;
}

}  // namespace k3::run
