#include "formats/tiktoken.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>

#include <nlohmann/json.hpp>

namespace k3::tiktoken {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int Base64Value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Decodes canonical padded base64. On failure returns false and a reason (which character or
// which padding rule), so the caller can name it.
bool Base64Decode(std::string_view in, std::string* out, std::string* why) {
  if (in.size() % 4 != 0) {
    *why = "length " + std::to_string(in.size()) + " is not a multiple of 4 (padding '=' missing?)";
    return false;
  }
  out->clear();
  out->reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    int v[4];
    int pad = 0;
    for (int j = 0; j < 4; ++j) {
      const auto c = static_cast<unsigned char>(in[i + static_cast<size_t>(j)]);
      if (c == '=' && last && j >= 2) {
        v[j] = 0;
        ++pad;
        continue;
      }
      if (pad > 0 || (v[j] = Base64Value(c)) < 0) {
        *why = "character " + std::to_string(i + static_cast<size_t>(j) + 1) +
               (pad > 0    ? " follows '=' padding"
                : c == '=' ? " is '=' before the end"
                           : " is not in the base64 alphabet");
        return false;
      }
    }
    const uint32_t n = (static_cast<uint32_t>(v[0]) << 18) | (static_cast<uint32_t>(v[1]) << 12) |
                       (static_cast<uint32_t>(v[2]) << 6) | static_cast<uint32_t>(v[3]);
    // Canonical form: the bits below the last encoded byte are zero, so each byte string has
    // exactly one spelling.
    if ((pad == 1 && (n & 0xFF) != 0) || (pad == 2 && (n & 0xFFFF) != 0)) {
      *why = "non-canonical padding (unused bits of the last character are not zero)";
      return false;
    }
    out->push_back(static_cast<char>(n >> 16));
    if (pad < 2) out->push_back(static_cast<char>((n >> 8) & 0xFF));
    if (pad < 1) out->push_back(static_cast<char>(n & 0xFF));
  }
  return true;
}

std::string Where(const std::string& source, size_t line, size_t offset) {
  return source + " line " + std::to_string(line) + " (byte " + std::to_string(offset) + ")";
}

constexpr char kModelHint[] =
    "each line must be \"<base64 token bytes> <rank>\" with ranks 0..N-1 in order; "
    "regenerate the file or fix that line";

struct RawLine {
  std::string bytes;
  int64_t rank = 0;
  size_t offset = 0;
};

// Parses one line (without its LF) into bytes and rank.
Status ParseLine(std::string_view line, const std::string& where, RawLine* out) {
  if (!line.empty() && line.back() == '\r') {
    return Status::Invalid(where + ": carriage return (CRLF line ending); " + kModelHint);
  }
  const size_t space = line.find(' ');
  if (space == std::string_view::npos) {
    return Status::Invalid(where + ": missing rank (no space after the base64 token); " +
                           kModelHint);
  }
  const std::string_view b64 = line.substr(0, space);
  const std::string_view rest = line.substr(space + 1);
  size_t digits = 0;
  while (digits < rest.size() && rest[digits] >= '0' && rest[digits] <= '9') ++digits;
  if (digits == 0) {
    return Status::Invalid(where + ": missing rank (expected decimal digits after the space); " +
                           kModelHint);
  }
  if (digits < rest.size()) {
    return Status::Invalid(where + ": trailing junk after the rank at column " +
                           std::to_string(space + 1 + digits + 1) + "; " + kModelHint);
  }
  if (digits > 1 && rest[0] == '0') {
    return Status::Invalid(where + ": rank has a leading zero; " + kModelHint);
  }
  if (digits > 18) {
    return Status::Invalid(where + ": rank too large; " + kModelHint);
  }
  int64_t rank = 0;
  for (size_t i = 0; i < digits; ++i) rank = rank * 10 + (rest[i] - '0');
  if (b64.empty()) {
    return Status::Invalid(where + ": empty token (no base64 before the rank); " + kModelHint);
  }
  std::string why;
  if (!Base64Decode(b64, &out->bytes, &why)) {
    return Status::Invalid(where + ": bad base64 token: " + why + "; " + kModelHint);
  }
  out->rank = rank;
  return Status::Ok();
}

}  // namespace

std::string Base64Encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t v = static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << 16;
    if (n > 1) v |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8;
    if (n > 2) v |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 2]));
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(n > 1 ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back(n > 2 ? kAlphabet[v & 63] : '=');
  }
  return out;
}

Result<Vocab> ParseTiktokenModel(std::string_view text, const std::string& source) {
  if (text.empty()) {
    return Status::Invalid(source + ": empty tiktoken.model (no ranks); " + kModelHint);
  }
  std::vector<RawLine> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string where = Where(source, lines.size() + 1, pos);
    if (end == pos) {
      return Status::Invalid(where + ": empty line; " + kModelHint);
    }
    RawLine raw;
    raw.offset = pos;
    K3_RETURN_IF_ERROR(ParseLine(text.substr(pos, end - pos), where, &raw));
    lines.push_back(std::move(raw));
    pos = end + 1;
  }

  // Rank rules. A rank below the expected one repeats an earlier rank; above it, the expected
  // rank is either later in the file (out of order) or nowhere (a gap). Only the error path
  // pays for the lookups that tell these apart.
  for (size_t i = 0; i < lines.size(); ++i) {
    const int64_t expected = static_cast<int64_t>(i);
    const int64_t rank = lines[i].rank;
    if (rank == expected) continue;
    const std::string where = Where(source, i + 1, lines[i].offset);
    if (rank < expected) {
      return Status::Invalid(where + ": duplicate rank " + std::to_string(rank) +
                             " (first on line " + std::to_string(rank + 1) + "); " + kModelHint);
    }
    for (size_t j = i + 1; j < lines.size(); ++j) {
      if (lines[j].rank == expected) {
        return Status::Invalid(where + ": rank out of order: found " + std::to_string(rank) +
                               " where rank " + std::to_string(expected) + " belongs (rank " +
                               std::to_string(expected) + " is on line " +
                               std::to_string(j + 1) + "); " + kModelHint);
      }
    }
    return Status::Invalid(where + ": rank gap: rank " + std::to_string(expected) +
                           " is missing (found " + std::to_string(rank) + "); " + kModelHint);
  }

  std::unordered_map<std::string_view, size_t> seen;
  seen.reserve(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto [it, inserted] = seen.emplace(lines[i].bytes, i);
    if (!inserted) {
      return Status::Invalid(Where(source, i + 1, lines[i].offset) +
                             ": duplicate token bytes (same as rank " +
                             std::to_string(it->second) + " on line " +
                             std::to_string(it->second + 1) + "); " + kModelHint);
    }
  }
  Vocab vocab;
  vocab.tokens.reserve(lines.size());
  for (RawLine& l : lines) vocab.tokens.push_back(std::move(l.bytes));
  return vocab;
}

std::string SerializeTiktokenModel(const Vocab& vocab) {
  std::string out;
  for (size_t r = 0; r < vocab.tokens.size(); ++r) {
    out += Base64Encode(vocab.tokens[r]);
    out += ' ';
    out += std::to_string(r);
    out += '\n';
  }
  return out;
}

Status ValidateVocab(const Vocab& vocab, const std::string& source) {
  if (vocab.tokens.empty()) return Status::Invalid(source + ": vocabulary has no tokens");
  std::unordered_map<std::string_view, size_t> seen;
  seen.reserve(vocab.tokens.size());
  for (size_t r = 0; r < vocab.tokens.size(); ++r) {
    if (vocab.tokens[r].empty()) {
      return Status::Invalid(source + ": rank " + std::to_string(r) + " has empty token bytes");
    }
    const auto [it, inserted] = seen.emplace(vocab.tokens[r], r);
    if (!inserted) {
      return Status::Invalid(source + ": rank " + std::to_string(r) +
                             " duplicates the token bytes of rank " + std::to_string(it->second));
    }
  }
  return Status::Ok();
}

// ---- tokenizer_config.json ---------------------------------------------------------------

namespace {

using nlohmann::json;

constexpr char kConfigHint[] =
    "fix tokenizer_config.json (released shape: \"added_tokens_decoder\": {\"<id>\": "
    "{\"content\": ..., \"special\": ...}})";

// Records the first duplicate key while nlohmann parses; the parser itself keeps the last one
// silently, which would let a file say two different things about one id.
struct DuplicateKeyFinder {
  std::vector<std::set<std::string>> keys;  // one per open object
  std::vector<std::string> path;            // key of each open object in its parent
  std::string current_key;
  std::string duplicate;  // "key" at "path", empty while none found

  bool operator()(int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        keys.emplace_back();
        path.push_back(current_key);
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        if (!path.empty()) path.pop_back();
        break;
      case json::parse_event_t::key:
        current_key = parsed.get<std::string>();
        if (!keys.empty() && !keys.back().insert(current_key).second && duplicate.empty()) {
          std::string where;
          for (size_t i = 1; i < path.size(); ++i) where += "." + path[i];
          duplicate = "\"" + current_key + "\" in object " + (where.empty() ? "(top level)" : where);
        }
        break;
      default:
        break;
    }
    return true;
  }
};

bool CanonicalId(const std::string& key, int64_t* id) {
  if (key.empty() || key.size() > 18) return false;
  if (key.size() > 1 && key[0] == '0') return false;
  int64_t v = 0;
  for (char c : key) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *id = v;
  return true;
}

const char* TypeName(const json& j) { return j.type_name(); }

// JSON text is UTF-8, so a content that is not could not be written faithfully.
bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    size_t len = 1;
    uint32_t v = b0, min = 0;
    if (b0 >= 0x80) {
      if ((b0 & 0xE0) == 0xC0) len = 2, v = b0 & 0x1Fu, min = 0x80;
      else if ((b0 & 0xF0) == 0xE0) len = 3, v = b0 & 0x0Fu, min = 0x800;
      else if ((b0 & 0xF8) == 0xF0) len = 4, v = b0 & 0x07u, min = 0x10000;
      else return false;
      if (i + len > s.size()) return false;
      for (size_t k = 1; k < len; ++k) {
        const auto b = static_cast<unsigned char>(s[i + k]);
        if ((b & 0xC0) != 0x80) return false;
        v = (v << 6) | (b & 0x3Fu);
      }
      if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return false;
    }
    i += len;
  }
  return true;
}

Status ReadSpecialName(const json& root, const char* key, const std::string& source,
                       std::string* out) {
  const auto it = root.find(key);
  if (it == root.end() || it->is_null()) return Status::Ok();
  if (it->is_string()) {
    *out = it->get<std::string>();
    return Status::Ok();
  }
  if (it->is_object()) {
    const auto c = it->find("content");
    if (c != it->end() && c->is_string()) {
      *out = c->get<std::string>();
      return Status::Ok();
    }
  }
  return Status::Invalid(source + ": " + key + " must be a string (or an object with a string "
                         "\"content\"), found " + TypeName(*it) + "; " + kConfigHint);
}

Status ReadBoolField(const json& entry, const char* name, bool required, const std::string& at,
                     bool* out) {
  const auto it = entry.find(name);
  if (it == entry.end()) {
    if (!required) return Status::Ok();
    return Status::Invalid(at + ": missing \"" + name + "\" (must be true or false); " +
                           kConfigHint);
  }
  if (!it->is_boolean()) {
    return Status::Invalid(at + "." + name + " must be a boolean, found " + TypeName(*it) + "; " +
                           kConfigHint);
  }
  *out = it->get<bool>();
  return Status::Ok();
}

}  // namespace

Result<TokenizerConfig> ParseTokenizerConfig(std::string_view text, const std::string& source) {
  DuplicateKeyFinder finder;
  json root;
  try {
    root = json::parse(text.begin(), text.end(), std::ref(finder));
  } catch (const json::parse_error& e) {
    return Status::Invalid(source + ": not valid JSON at byte " + std::to_string(e.byte) + ": " +
                           e.what() + "; " + kConfigHint);
  } catch (const json::exception& e) {
    return Status::Invalid(source + ": not valid JSON: " + e.what() + "; " + kConfigHint);
  }
  if (!finder.duplicate.empty()) {
    return Status::Invalid(source + ": duplicate JSON key " + finder.duplicate +
                           " (a repeated added-token id or setting is ambiguous); " + kConfigHint);
  }
  if (!root.is_object()) {
    return Status::Invalid(source + ": top level must be a JSON object, found " +
                           TypeName(root) + "; " + kConfigHint);
  }
  TokenizerConfig config;
  const auto dec = root.find("added_tokens_decoder");
  if (dec == root.end()) {
    return Status::Invalid(source + ": missing \"added_tokens_decoder\"; " + kConfigHint);
  }
  if (!dec->is_object()) {
    return Status::Invalid(source + ": added_tokens_decoder must be an object, found " +
                           TypeName(*dec) + "; " + kConfigHint);
  }
  for (const auto& [key, entry] : dec->items()) {
    const std::string at = source + ": added_tokens_decoder[\"" + key + "\"]";
    AddedToken token;
    if (!CanonicalId(key, &token.id)) {
      return Status::Invalid(at + ": id must be a non-negative decimal integer without sign or "
                             "leading zeros; " + kConfigHint);
    }
    if (!entry.is_object()) {
      return Status::Invalid(at + " must be an object, found " + TypeName(entry) + "; " +
                             kConfigHint);
    }
    const auto content = entry.find("content");
    if (content == entry.end() || !content->is_string()) {
      return Status::Invalid(at + ".content must be a string, found " +
                             (content == entry.end() ? std::string("nothing")
                                                     : TypeName(*content)) +
                             "; " + kConfigHint);
    }
    token.content = content->get<std::string>();
    K3_RETURN_IF_ERROR(ReadBoolField(entry, "special", true, at, &token.special));
    K3_RETURN_IF_ERROR(ReadBoolField(entry, "lstrip", false, at, &token.lstrip));
    K3_RETURN_IF_ERROR(ReadBoolField(entry, "normalized", false, at, &token.normalized));
    K3_RETURN_IF_ERROR(ReadBoolField(entry, "rstrip", false, at, &token.rstrip));
    K3_RETURN_IF_ERROR(ReadBoolField(entry, "single_word", false, at, &token.single_word));
    config.added_tokens.push_back(std::move(token));
  }
  std::sort(config.added_tokens.begin(), config.added_tokens.end(),
            [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });
  K3_RETURN_IF_ERROR(ReadSpecialName(root, "bos_token", source, &config.bos_token));
  K3_RETURN_IF_ERROR(ReadSpecialName(root, "eos_token", source, &config.eos_token));
  K3_RETURN_IF_ERROR(ReadSpecialName(root, "unk_token", source, &config.unk_token));
  K3_RETURN_IF_ERROR(ReadSpecialName(root, "pad_token", source, &config.pad_token));
  if (const auto it = root.find("tokenizer_class"); it != root.end()) {
    if (!it->is_string() || it->get<std::string>() != "TikTokenTokenizer") {
      return Status::Invalid(source + ": tokenizer_class must be \"TikTokenTokenizer\", found " +
                             it->dump(-1, ' ', false, json::error_handler_t::replace) + "; " +
                             kConfigHint);
    }
  }
  if (const auto it = root.find("model_max_length"); it != root.end()) {
    if (it->is_number_unsigned()) {
      config.model_max_length = it->get<uint64_t>();
    } else if (it->is_number_float() && it->get<double>() >= 0) {
      const double v = it->get<double>();
      config.model_max_length = v >= 18446744073709551615.0 ? std::numeric_limits<uint64_t>::max()
                                                            : static_cast<uint64_t>(v);
    } else {
      return Status::Invalid(source + ": model_max_length must be a non-negative number, found " +
                             it->dump(-1, ' ', false, json::error_handler_t::replace) + "; " +
                             kConfigHint);
    }
  }
  K3_RETURN_IF_ERROR(ValidateTokenizerConfig(config, source));
  return config;
}

Status ValidateTokenizerConfig(const TokenizerConfig& config, const std::string& source) {
  std::map<int64_t, size_t> ids;
  std::map<std::string, int64_t> contents;
  for (size_t i = 0; i < config.added_tokens.size(); ++i) {
    const AddedToken& t = config.added_tokens[i];
    if (t.id < 0) {
      return Status::Invalid(source + ": added token \"" + t.content + "\" has negative id " +
                             std::to_string(t.id) + "; " + kConfigHint);
    }
    if (!ids.emplace(t.id, i).second) {
      return Status::Invalid(source + ": duplicate added token id " + std::to_string(t.id) +
                             "; " + kConfigHint);
    }
    if (t.content.empty()) {
      return Status::Invalid(source + ": added token id " + std::to_string(t.id) +
                             " has empty content; " + kConfigHint);
    }
    if (!IsValidUtf8(t.content)) {
      return Status::Invalid(source + ": added token id " + std::to_string(t.id) +
                             " has content that is not valid UTF-8; " + kConfigHint);
    }
    const auto [it, inserted] = contents.emplace(t.content, t.id);
    if (!inserted) {
      return Status::Invalid(source + ": duplicate added token content \"" + t.content +
                             "\" (ids " + std::to_string(it->second) + " and " +
                             std::to_string(t.id) + "); " + kConfigHint);
    }
  }
  const std::pair<const char*, const std::string*> names[] = {
      {"bos_token", &config.bos_token}, {"eos_token", &config.eos_token},
      {"unk_token", &config.unk_token}, {"pad_token", &config.pad_token}};
  for (const auto& [key, value] : names) {
    if (!value->empty() && contents.count(*value) == 0) {
      return Status::Invalid(source + ": " + key + " \"" + *value +
                             "\" is not in added_tokens_decoder; " + kConfigHint);
    }
  }
  return Status::Ok();
}

std::string SerializeTokenizerConfig(const TokenizerConfig& config) {
  nlohmann::ordered_json root = nlohmann::ordered_json::object();
  nlohmann::ordered_json dec = nlohmann::ordered_json::object();
  std::vector<const AddedToken*> sorted;
  for (const AddedToken& t : config.added_tokens) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const AddedToken* a, const AddedToken* b) { return a->id < b->id; });
  for (const AddedToken* t : sorted) {
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["content"] = t->content;
    e["lstrip"] = t->lstrip;
    e["normalized"] = t->normalized;
    e["rstrip"] = t->rstrip;
    e["single_word"] = t->single_word;
    e["special"] = t->special;
    dec[std::to_string(t->id)] = std::move(e);
  }
  root["added_tokens_decoder"] = std::move(dec);
  if (!config.bos_token.empty()) root["bos_token"] = config.bos_token;
  root["clean_up_tokenization_spaces"] = false;
  if (!config.eos_token.empty()) root["eos_token"] = config.eos_token;
  if (config.model_max_length != 0) root["model_max_length"] = config.model_max_length;
  if (!config.pad_token.empty()) root["pad_token"] = config.pad_token;
  root["tokenizer_class"] = config.tokenizer_class;
  if (!config.unk_token.empty()) root["unk_token"] = config.unk_token;
  return root.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

Status CheckAddedTokensOutsideVocab(const Vocab& vocab, const TokenizerConfig& config,
                                    const std::string& source) {
  const auto n = static_cast<int64_t>(vocab.tokens.size());
  for (const AddedToken& t : config.added_tokens) {
    if (t.id < n) {
      return Status::Invalid(source + ": added token \"" + t.content + "\" has id " +
                             std::to_string(t.id) + ", which is a rank of tiktoken.model (ranks "
                             "0.." + std::to_string(n - 1) + "); added tokens must come after "
                             "the vocabulary");
    }
  }
  return Status::Ok();
}

int64_t FindAddedToken(const TokenizerConfig& config, std::string_view content) {
  for (const AddedToken& t : config.added_tokens) {
    if (t.content == content) return t.id;
  }
  return -1;
}

Result<Vocab> LoadTiktokenModel(Env* env, const std::string& path) {
  K3_ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, path, kMaxModelFileBytes));
  return ParseTiktokenModel(text, path);
}

Result<TokenizerConfig> LoadTokenizerConfig(Env* env, const std::string& path) {
  K3_ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, path, kMaxConfigFileBytes));
  return ParseTokenizerConfig(text, path);
}

Status WriteTiktokenModel(Env* env, const std::string& path, const Vocab& vocab) {
  K3_RETURN_IF_ERROR(ValidateVocab(vocab, path));
  return WriteFileAtomic(env, path, SerializeTiktokenModel(vocab));
}

Status WriteTokenizerConfig(Env* env, const std::string& path, const TokenizerConfig& config) {
  K3_RETURN_IF_ERROR(ValidateTokenizerConfig(config, path));
  return WriteFileAtomic(env, path, SerializeTokenizerConfig(config));
}

}  // namespace k3::tiktoken
