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
  for (const auto& [key, value] : j.items()) {
    if (key != "role" && key != "content" && key != "reasoning_content" && key != "ids") {
      return Status::Invalid(at + "unknown key \"" + key +
                             "\"; allowed: role, content, reasoning_content, ids" + kFix);
    }
    if (key == "ids") {
      K3_ASSIGN_OR_RETURN(m.ids, ParseIds(value, at));
      has_ids = true;
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
    } else {
      m.reasoning = s;
      has_reasoning = true;
    }
  }
  if (!has_role) return Status::Invalid(at + "missing key \"role\"" + kFix);
  if (!has_content) return Status::Invalid(at + "missing key \"content\"" + kFix);
  if (m.role != "system" && m.role != "user" && m.role != "assistant") {
    return Status::Invalid(at + "role \"" + m.role + "\": must be system, user or assistant" +
                           kFix);
  }
  if (has_ids && m.role != "assistant") {
    return Status::Invalid(at + "ids on a " + m.role +
                           " message; only assistant messages carry the ids they were generated as" +
                           kFix);
  }
  if (has_reasoning && m.role != "assistant") {
    return Status::Invalid(at + "reasoning_content on a " + m.role +
                           " message; only assistant messages carry it" + kFix);
  }
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
  for (size_t i = first; i < messages.size(); ++i) {
    const char* want = (i - first) % 2 == 0 ? "user" : "assistant";
    if (messages[i].role != want) {
      return Status::Invalid(Where(source, i + 1) + "role \"" + messages[i].role + "\" where \"" +
                             want + "\" must come: an optional system message first, then user "
                             "and assistant alternating, starting with user" + kFix);
    }
  }
  return Status::Ok();
}

std::string SerializeHistory(const std::vector<ChatMessage>& messages) {
  std::string out;
  for (const ChatMessage& m : messages) {
    nlohmann::ordered_json line = {{"role", m.role}, {"content", m.content}};
    if (m.role == "assistant" && !m.reasoning.empty()) line["reasoning_content"] = m.reasoning;
    if (m.role == "assistant" && !m.ids.empty()) line["ids"] = m.ids;
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
