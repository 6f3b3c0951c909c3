#include "formats/json_listing.h"

namespace k3::listing {
namespace {

using ojson = nlohmann::ordered_json;

std::string Compact(const ojson& v) {
  return v.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

}  // namespace

std::string Dump(const ojson& doc) {
  std::string out = "{";
  bool first_member = true;
  for (const auto& [key, value] : doc.items()) {
    out += first_member ? "\n " : ",\n ";
    first_member = false;
    out += Compact(ojson(key)) + ": ";
    if (!value.is_array() || value.empty()) {
      out += Compact(value);
      continue;
    }
    out += "[";
    bool first_element = true;
    for (const ojson& element : value) {
      out += first_element ? "\n  " : ",\n  ";
      first_element = false;
      out += Compact(element);
    }
    out += "\n ]";
  }
  out += first_member ? "}\n" : "\n}\n";
  return out;
}

}  // namespace k3::listing
