#include "k3run/text/chat_history.h"

#include <set>

#include <cstdint>

#include <nlohmann/json.hpp>

#include "common/hex.h"

namespace k3::run {
namespace {

using nlohmann::json;

std::string Where(const std::string& source, size_t line) {
  return source + ":" + std::to_string(line) + ": ";
}

const char* const kFix = " (fix or delete the line; a missing file starts a new conversation)";

// "ids": the token ids an assistant message was generated as (so a resumed chat renders exactly
// what the model saw): an array of integers in [0, 2^31).
Result<std::vector<int32_t>> ParseIds(const json& value, const std::string& at) {
  if (!value.is_array()) return Status::Invalid(at + "\"ids\" must be an array of token ids" + kFix);
  std::vector<int32_t> ids;
  for (const json& v : value) {
    if (!v.is_number_unsigned() || v.get<uint64_t>() > uint64_t{INT32_MAX}) {
      return Status::Invalid(at + "\"ids\" item " + std::to_string(ids.size()) + " (" +
                             v.dump() + ") is not a token id in [0, 2147483647]" + kFix);
    }
    ids.push_back(static_cast<int32_t>(v.get<uint64_t>()));
  }
  return ids;
}

// "tool_calls": an assistant's calls, [{"id", "name", "arguments"}] with string values.
Result<std::vector<ToolCall>> ParseToolCalls(const json& value, const std::string& at) {
  if (!value.is_array()) {
    return Status::Invalid(at + "\"tool_calls\" must be an array of {\"id\", \"name\", "
                           "\"arguments\"}" + kFix);
  }
  std::vector<ToolCall> calls;
  for (const json& c : value) {
    const std::string which = at + "\"tool_calls\" item " + std::to_string(calls.size());
    if (!c.is_object() || c.size() != 3 || !c.contains("id") || !c.contains("name") ||
        !c.contains("arguments")) {
      return Status::Invalid(which + " must be {\"id\", \"name\", \"arguments\"} and nothing else" +
                             kFix);
    }
    for (const char* k : {"id", "name", "arguments"}) {
      if (!c[k].is_string()) return Status::Invalid(which + ": \"" + k + "\" must be a string" + kFix);
    }
    calls.push_back({c["id"].get<std::string>(), c["name"].get<std::string>(),
                     c["arguments"].get<std::string>()});
  }
  return calls;
}

// "images": a user message's images, [{"path", "width", "height", "tokens", "xxh3"[, "at"]}]:
// the file each was read from, its original size, its rows and the XXH3-128 of its bytes (hex),
// so a resumed chat re-reads the file and refuses one that changed (k3run/app/chat_images.h).
Result<std::vector<ChatImage>> ParseImages(const json& value, const std::string& at) {
  const char* const shape =
      " must be {\"path\", \"width\", \"height\", \"tokens\", \"xxh3\"[, \"at\"]}";
  if (!value.is_array()) return Status::Invalid(at + "\"images\" must be an array" + kFix);
  std::vector<ChatImage> images;
  for (const json& v : value) {
    const std::string which = at + "\"images\" item " + std::to_string(images.size());
    if (!v.is_object()) return Status::Invalid(which + shape + kFix);
    ChatImage image;
    for (const auto& [key, field] : v.items()) {
      if (key == "path" || key == "xxh3") {
        if (!field.is_string() || field.get_ref<const std::string&>().empty()) {
          return Status::Invalid(which + ": \"" + key + "\" must be a non-empty string" + kFix);
        }
        (key == "path" ? image.path : image.file_hash) = field.get<std::string>();
        continue;
      }
      if (key != "width" && key != "height" && key != "tokens" && key != "at") {
        return Status::Invalid(which + ": unknown key \"" + key + "\";" + shape + kFix);
      }
      const bool positive = key != "at";
      if (!field.is_number_unsigned() || field.get<uint64_t>() > uint64_t{INT32_MAX} ||
          (positive && field.get<uint64_t>() == 0)) {
        return Status::Invalid(which + ": \"" + key + "\" must be an integer in [" +
                               (positive ? "1" : "0") + ", 2147483647]" + kFix);
      }
      const auto n = field.get<uint64_t>();
      if (key == "width") image.width = static_cast<uint32_t>(n);
      if (key == "height") image.height = static_cast<uint32_t>(n);
      if (key == "tokens") image.tokens = static_cast<int64_t>(n);
      if (key == "at") image.at = static_cast<size_t>(n);
    }
    if (image.path.empty() || image.file_hash.empty() || image.width == 0 || image.height == 0 ||
        image.tokens == 0) {
      return Status::Invalid(which + shape + kFix);
    }
    images.push_back(std::move(image));
  }
  return images;
}

// Which keys a line had, for the rules that depend on its role.
struct Present {
  bool role, content, reasoning, ids, calls, call_id, name, images;
};

Status CheckKeysOfRole(const ChatMessage& m, const Present& p, const std::string& at) {
  if (!p.role) return Status::Invalid(at + "missing key \"role\"" + kFix);
  if (!p.content) return Status::Invalid(at + "missing key \"content\"" + kFix);
  if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool") {
    return Status::Invalid(at + "role \"" + m.role +
                           "\": must be system, user, assistant or tool" + kFix);
  }
  if (p.calls && m.role != "assistant") {
    return Status::Invalid(at + "tool_calls on a " + m.role +
                           " message; only assistant messages make calls" + kFix);
  }
  if ((p.call_id || p.name) && m.role != "tool") {
    return Status::Invalid(at + (p.call_id ? "tool_call_id" : "name") + " on a " + m.role +
                           " message; only tool messages carry it" + kFix);
  }
  if (m.role == "tool" && (!p.call_id || m.tool_call_id.empty())) {
    return Status::Invalid(at + "a tool message needs the \"tool_call_id\" of the call it "
                           "answers" + kFix);
  }
  if (p.ids && m.role != "assistant") {
    return Status::Invalid(at + "ids on a " + m.role +
                           " message; only assistant messages carry the ids they were generated as" +
                           kFix);
  }
  if (p.images && m.role != "user") {
    return Status::Invalid(at + "images on a " + m.role + " message; only user messages carry "
                           "images" + kFix);
  }
  if (p.reasoning && m.role != "assistant") {
    return Status::Invalid(at + "reasoning_content on a " + m.role +
                           " message; only assistant messages carry it" + kFix);
  }
  return Status::Ok();
}

Result<ChatMessage> ParseLine(std::string_view line, const std::string& source, size_t number,
                              uint64_t line_offset) {
  const std::string at = Where(source, number);
  if (line.empty()) return Status::Invalid(at + "blank line; one JSON object per line" + kFix);
  if (line.size() > kMaxHistoryLineBytes) {
    return Status::Invalid(at + "line of " + std::to_string(line.size()) +
                           " bytes exceeds the 16 MiB limit" + kFix);
  }
  for (size_t i = 0; i < line.size(); ++i) {
    const auto b = static_cast<unsigned char>(line[i]);
    if (b < 0x20) {
      std::string hex;
      AppendHexByte(hex, b);
      return Status::Invalid(at + "raw control byte 0x" + hex + " at byte offset " +
                             std::to_string(line_offset + i) +
                             " (column " + std::to_string(i + 1) +
                             "); control characters must be escaped" + kFix);
    }
  }
  // Duplicate keys: nlohmann keeps the last one silently, so the parser callback records them.
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  auto cb = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (ev == json::parse_event_t::object_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (ev == json::parse_event_t::key && !keys.empty()) {
      const std::string k = parsed.get<std::string>();
      if (!keys.back().insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(line.begin(), line.end(), cb);
  } catch (const json::parse_error& e) {
    return Status::Invalid(at + "invalid JSON at byte offset " +
                           std::to_string(line_offset + (e.byte > 0 ? e.byte - 1 : 0)) + ": " +
                           e.what() + kFix);
  } catch (const json::exception& e) {
    // out_of_range 406: a number beyond a double's range ("4e04471183"); no byte offset.
    return Status::Invalid(at + "invalid JSON: " + e.what() + kFix);
  }
  if (!duplicate.empty()) {
    return Status::Invalid(at + "duplicate key \"" + duplicate + "\"" + kFix);
  }
  if (!j.is_object()) {
    return Status::Invalid(at + "expected a JSON object {\"role\":…,\"content\":…}" + kFix);
  }
  ChatMessage m;
  bool has_role = false, has_content = false, has_reasoning = false, has_ids = false;
  bool has_calls = false, has_call_id = false, has_name = false, has_images = false;
  for (const auto& [key, value] : j.items()) {
    if (key != "role" && key != "content" && key != "reasoning_content" && key != "ids" &&
        key != "tool_calls" && key != "tool_call_id" && key != "name" && key != "images") {
      return Status::Invalid(at + "unknown key \"" + key +
                             "\"; allowed: role, content, reasoning_content, ids, tool_calls, "
                             "tool_call_id, name, images" + kFix);
    }
    if (key == "images") {
      K3_ASSIGN_OR_RETURN(m.images, ParseImages(value, at));
      has_images = true;
      continue;
    }
    if (key == "ids") {
      K3_ASSIGN_OR_RETURN(m.ids, ParseIds(value, at));
      has_ids = true;
      continue;
    }
    if (key == "tool_calls") {
      K3_ASSIGN_OR_RETURN(m.tool_calls, ParseToolCalls(value, at));
      has_calls = true;
      continue;
    }
    if (!value.is_string()) {
      return Status::Invalid(at + "\"" + key + "\" must be a string" + kFix);
    }
    const std::string& s = value.get_ref<const std::string&>();
    if (s.find('\0') != std::string::npos) {
      return Status::Invalid(at + "\"" + key + "\" contains NUL (\\u0000)" + kFix);
    }
    if (key == "role") {
      m.role = s;
      has_role = true;
    } else if (key == "content") {
      m.content = s;
      has_content = true;
    } else if (key == "tool_call_id") {
      m.tool_call_id = s;
      has_call_id = true;
    } else if (key == "name") {
      m.name = s;
      has_name = true;
    } else {
      m.reasoning = s;
      has_reasoning = true;
    }
  }
  K3_RETURN_IF_ERROR(CheckKeysOfRole(m, Present{has_role, has_content, has_reasoning, has_ids,
                                                  has_calls, has_call_id, has_name,
                                                  has_images},
                                      at));
  return m;
}

}  // namespace

Result<std::vector<ChatMessage>> ParseHistory(std::string_view text, const std::string& source) {
  std::vector<ChatMessage> out;
  size_t pos = 0, number = 0;
  while (pos < text.size()) {
    ++number;
    const size_t nl = text.find('\n', pos);
    const size_t end = nl == std::string_view::npos ? text.size() : nl;
    K3_ASSIGN_OR_RETURN(ChatMessage m, ParseLine(text.substr(pos, end - pos), source, number, pos));
    out.push_back(std::move(m));
    pos = end + 1;
  }
  K3_RETURN_IF_ERROR(CheckRoleOrder(out, source));
  return out;
}

Status CheckRoleOrder(const std::vector<ChatMessage>& messages, const std::string& source) {
  const size_t first = !messages.empty() && messages[0].role == "system" ? 1 : 0;
  std::string prev;  // the role before messages[i] ("" at the start)
  bool calls = false;  // the last assistant message made calls
  for (size_t i = first; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    const char* want = prev.empty()          ? "\"user\""
                       : prev == "user"      ? "\"assistant\""
                       : prev == "assistant" ? (calls ? "\"user\" or \"tool\"" : "\"user\"")
                                             : "\"tool\", \"assistant\" or \"user\"";
    const bool ok = prev.empty()          ? role == "user"
                    : prev == "user"      ? role == "assistant"
                    : prev == "assistant" ? role == "user" || (calls && role == "tool")
                                          : role != "system";
    if (!ok) {
      return Status::Invalid(Where(source, i + 1) + "role \"" + role + "\" where " + want +
                             " must come: an optional system message first, then user and "
                             "assistant alternating, starting with user; tool results only "
                             "after an assistant message with tool_calls" + kFix);
    }
    if (role == "assistant") calls = !messages[i].tool_calls.empty();
    prev = role;
  }
  return Status::Ok();
}

std::string SerializeHistory(const std::vector<ChatMessage>& messages) {
  std::string out;
  for (const ChatMessage& m : messages) {
    nlohmann::ordered_json line = {{"role", m.role}, {"content", m.content}};
    if (m.role == "assistant" && !m.reasoning.empty()) line["reasoning_content"] = m.reasoning;
    if (m.role == "assistant" && !m.ids.empty()) line["ids"] = m.ids;
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      nlohmann::ordered_json calls = nlohmann::ordered_json::array();
      for (const ToolCall& c : m.tool_calls) {
        calls.push_back({{"id", c.id}, {"name", c.name}, {"arguments", c.arguments}});
      }
      line["tool_calls"] = calls;
    }
    if (m.role == "user" && !m.images.empty()) {
      nlohmann::ordered_json images = nlohmann::ordered_json::array();
      for (const ChatImage& i : m.images) {
        nlohmann::ordered_json image = {{"path", i.path}, {"width", i.width},
                                        {"height", i.height}, {"tokens", i.tokens},
                                        {"xxh3", i.file_hash}};
        if (i.at != 0) image["at"] = i.at;
        images.push_back(std::move(image));
      }
      line["images"] = images;
    }
    if (m.role == "tool") {
      line["tool_call_id"] = m.tool_call_id;
      if (!m.name.empty()) line["name"] = m.name;
    }
    // Messages are sanitised UTF-8; `replace` keeps a stray invalid byte from throwing.
    out += line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    out += '\n';
  }
  return out;
}

Result<std::vector<ChatMessage>> LoadHistory(Env* env, const std::string& path) {
  if (!env->Exists(path)) return std::vector<ChatMessage>();
  // Bounded: a transcript may hold many 16 MiB lines, but not an unbounded file.
  K3_ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, path, uint64_t{1} << 32));
  return ParseHistory(text, path);
}

Status SaveHistory(Env* env, const std::string& path, const std::vector<ChatMessage>& messages) {
  K3_RETURN_IF_ERROR(CheckRoleOrder(messages, path));
  return WriteFileAtomic(env, path, SerializeHistory(messages));
}

}  // namespace k3::run
