// The Kimi pre-tokenizer pattern and its translation into a PCRE2 pattern with the same meaning.
//
// Why a translation: the released pattern is written for tiktoken's Rust core (fancy_regex over
// the regex crate). Three constructs mean something else, or nothing, in PCRE2 10.42:
//   `[X&&[^Y]]`  class intersection: PCRE2 has none → `(?:(?!Y)[X])` (RewriteClassIntersections).
//   `\p{Han}`    Rust: the Script property. PCRE2 ≥ 10.40: Script_Extensions, which adds shared
//                CJK punctuation (、。「」…) → `\p{sc:Han}`.
//   `\s`, `\S`   Rust: the White_Space property. PCRE2 with UCP: its own definition (\h, \v
//                and the Z categories), which has drifted from White_Space across Unicode
//                versions (U+180E) → an explicit White_Space class, so the meaning is pinned.
// Non-goals: a general Rust-regex → PCRE2 translator; anything not listed is refused, so a
// changed pattern fails loudly instead of being matched with a different meaning.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace k3::tok {

// The released pattern with all three rewrites applied; what the pre-tokenizer compiles.
Result<std::string> KimiPatternForPcre2(std::string_view pattern);

}  // namespace k3::tok
