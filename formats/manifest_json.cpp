#include "formats/manifest_json.h"

#include <vector>

namespace k3::mjson {

using nlohmann::json;

Result<json> ParseStrict(std::string_view text, const std::string& source) {
  // nlohmann keeps the last of two equal keys; the callback sees every key event first, so a
  // stack of per-object key sets finds duplicates without a SAX DOM builder of our own.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  size_t duplicate_depth = 0;
  json::parser_callback_t callback = [&](int /*depth*/, json::parse_event_t event,
                                         json& parsed) -> bool {
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
          duplicate = parsed.get<std::string>();
          duplicate_depth = open_objects.size();
        }
        break;
      default:
        break;
    }
    return true;
  };
  json doc;
  try {
    doc = json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true,
                      /*ignore_comments=*/false);
  } catch (const json::parse_error& e) {
    return Status::Invalid(source + ": malformed JSON at byte offset " + std::to_string(e.byte) +
                           " (" + e.what() + "); the file is damaged or not JSON");
  } catch (const json::exception& e) {
    // out_of_range 406: a number beyond a double's range ("1e999"); it has no byte offset.
    return Status::Invalid(source + ": malformed JSON (" + std::string(e.what()) +
                           "); the file is damaged or not JSON");
  }
  if (!duplicate.empty()) {
    return Status::Invalid(source + ": duplicate key \"" + duplicate + "\" in an object at depth " +
                           std::to_string(duplicate_depth) +
                           " (each key may appear once; the file was edited or is corrupt)");
  }
  return doc;
}

Result<ObjectReader> ObjectReader::Make(const json& value, std::string where) {
  if (!value.is_object()) {
    return Status::Invalid(where + ": expected a JSON object, found " +
                           std::string(value.type_name()));
  }
  return ObjectReader(&value, std::move(where));
}

std::string ObjectReader::Path(std::string_view key) const {
  return where_ + "." + std::string(key);
}

bool ObjectReader::Has(std::string_view key) const { return obj_->contains(key); }

Result<const json*> ObjectReader::Get(std::string_view key) {
  known_.insert(std::string(key));
  auto it = obj_->find(key);
  if (it == obj_->end()) return Status::Invalid(Path(key) + ": required field is missing");
  return &*it;
}

Result<std::string> ObjectReader::String(std::string_view key) {
  K3_ASSIGN_OR_RETURN(const json* v, Get(key));
  if (!v->is_string()) {
    return Status::Invalid(Path(key) + ": expected a string, found " +
                           std::string(v->type_name()));
  }
  return v->get<std::string>();
}

Result<uint64_t> ObjectReader::Unsigned(std::string_view key) {
  K3_ASSIGN_OR_RETURN(const json* v, Get(key));
  if (!v->is_number_unsigned()) {
    return Status::Invalid(Path(key) + ": expected an unsigned integer, found " +
                           (v->is_number() ? v->dump() : std::string(v->type_name())));
  }
  return v->get<uint64_t>();
}

Result<bool> ObjectReader::Bool(std::string_view key) {
  K3_ASSIGN_OR_RETURN(const json* v, Get(key));
  if (!v->is_boolean()) {
    return Status::Invalid(Path(key) + ": expected true or false, found " +
                           std::string(v->type_name()));
  }
  return v->get<bool>();
}

Result<const json*> ObjectReader::Array(std::string_view key) {
  K3_ASSIGN_OR_RETURN(const json* v, Get(key));
  if (!v->is_array()) {
    return Status::Invalid(Path(key) + ": expected an array, found " +
                           std::string(v->type_name()));
  }
  return v;
}

Result<const json*> ObjectReader::Object(std::string_view key) {
  K3_ASSIGN_OR_RETURN(const json* v, Get(key));
  if (!v->is_object()) {
    return Status::Invalid(Path(key) + ": expected an object, found " +
                           std::string(v->type_name()));
  }
  return v;
}

Status ObjectReader::CheckNoUnknownKeys() const {
  for (auto it = obj_->begin(); it != obj_->end(); ++it) {
    if (known_.find(it.key()) == known_.end()) {
      return Status::Invalid(Path(it.key()) +
                             ": unknown field (not part of this format version; was the file "
                             "written by a newer k3 or edited by hand?)");
    }
  }
  return Status::Ok();
}

std::string ElementPath(const std::string& array_path, size_t i) {
  return array_path + "[" + std::to_string(i) + "]";
}

}  // namespace k3::mjson
