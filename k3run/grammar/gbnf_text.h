// Writing GBNF text: literals and character-class members, escaped so that Grammar::Parse reads
// back exactly the given UTF-8. Internal to k3run/grammar.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace k3::run::grammar {

// "…" with " \ and control characters escaped; other UTF-8 copied as is (`utf8` must be valid).
std::string GbnfLiteral(std::string_view utf8);
// One code point as a class member: \uHHHH or \UHHHHHHHH (never special inside [ ]).
std::string GbnfClassChar(uint32_t cp);
// An XTML attribute value as the K3 template writes it: & as &amp;, then " as &quot;.
std::string XtmlAttributeEscape(std::string_view value);
// Whether `name` is a valid rule name ([a-zA-Z0-9_-]+).
bool IsGbnfRuleName(std::string_view name);

}  // namespace k3::run::grammar
