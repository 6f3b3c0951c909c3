// Strict JSON for k3's own manifests (k3.json, k3-download.json): shared by the readers in
// formats/ and by nothing else.
//
// Goals: a manifest is a contract, so its reader accepts exactly the documented schema:
// duplicate keys are an error (nlohmann's DOM would silently keep the last one), unknown keys are
// an error (new keys mean a new format version), integers must be unsigned JSON integers (no
// 1e3, no -1, no 1.0), and every message names the file and the JSON path of the field.
// Non-goals: streaming (manifests are small: the released model's k3.json is ~1 MB), SAX,
// lenient modes.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace k3::mjson {

// Parses one JSON document. Syntax errors name `source` and the byte offset; a duplicate key
// names the key and the object's path.
Result<nlohmann::json> ParseStrict(std::string_view text, const std::string& source);

// Typed, path-naming access to one JSON object. Every accessor records the key as known, so
// CheckNoUnknownKeys() can reject the rest.
class ObjectReader {
 public:
  // Fails unless `value` is an object. `where` is the path used in messages, e.g.
  // "k3.json: regions[3]".
  static Result<ObjectReader> Make(const nlohmann::json& value, std::string where);

  bool Has(std::string_view key) const;
  Result<std::string> String(std::string_view key);
  Result<uint64_t> Unsigned(std::string_view key);
  Result<bool> Bool(std::string_view key);
  Result<const nlohmann::json*> Array(std::string_view key);
  Result<const nlohmann::json*> Object(std::string_view key);
  // Rejects every key no accessor asked for, naming the first one.
  Status CheckNoUnknownKeys() const;

  std::string Path(std::string_view key) const;
  const std::string& where() const { return where_; }

 private:
  ObjectReader(const nlohmann::json* obj, std::string where)
      : obj_(obj), where_(std::move(where)) {}
  Result<const nlohmann::json*> Get(std::string_view key);

  const nlohmann::json* obj_;
  std::string where_;
  std::set<std::string, std::less<>> known_;
};

// "a[3]" style element path.
std::string ElementPath(const std::string& array_path, size_t i);

}  // namespace k3::mjson
