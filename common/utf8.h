// UTF-8 decoding steps shared by everything that checks or repairs text: the tokenizer (input
// repair before encoding), the engine's output (JSON text, stdout chunking).
//
// Rules: Unicode Table 3-7 well-formed sequences (no overlong forms, no surrogates, nothing above
// U+10FFFF); an ill-formed sequence is replaced per *maximal subpart* — the rule Python's
// bytes.decode("utf-8", errors="replace") and the WHATWG decoder follow.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace k3 {

// One decoder step at s[i] (i < s.size()): `len` bytes form a valid sequence (`valid`), or the
// maximal invalid subpart is `len` bytes long; `truncated` when s ended inside a sequence that
// was valid so far (it might still complete).
struct Utf8Step {
  size_t len = 1;
  bool valid = false;
  bool truncated = false;
};
Utf8Step DecodeUtf8Step(std::string_view s, size_t i);

// Each maximal invalid subpart → U+FFFD; valid text is returned unchanged.
std::string ReplaceInvalidUtf8(std::string_view s);
bool IsValidUtf8(std::string_view s);

}  // namespace k3
