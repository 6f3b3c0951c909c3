// JSON listings: documents whose arrays hold one entry per tensor (tensor fixtures, the synth
// --dry-run layout), up to ~10^5 entries for the released model.
//
// Goals: the text stays diffable and greppable (one entry per line) and about half the size of
// a fully indented dump; every key and value is written by nlohmann, only line breaks are placed
// here. Non-goals: any other shape (nested arrays inside entries are written compactly on their
// entry's line), streaming (the document is built in memory first).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace k3::listing {

// `doc`, an object, as:
//   {
//    "key": <value, compact>,
//    "array_key": [
//     <element, compact>,
//     <element, compact>
//    ]
//   }
// with a final newline. Members keep their order; an empty array is written `[]`. Invalid UTF-8
// in a string is replaced by U+FFFD rather than throwing.
std::string Dump(const nlohmann::ordered_json& doc);

}  // namespace k3::listing
