// What happens to text before the regex: UTF-8 repair and upstream's length splitting.
//
// Goals: exactly tokenization_kimi.py's behaviour on a Python str: bytes.decode("utf-8",
// errors="replace") (one U+FFFD per maximal invalid subpart), then pieces of at most 400,000
// characters, each cut further so that no run of str.isspace() / non-space characters inside a
// piece exceeds 25,000 characters (upstream's _split_whitespaces_or_nonwhitespaces: it cuts
// only inside an over-long run, never at ordinary run boundaries).
// Non-goals: streaming; this works on whole strings in memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/utf8.h"

namespace k3::tok {

inline constexpr size_t kMaxEncodeChars = 400'000;
inline constexpr size_t kMaxRunChars = 25'000;

// Python errors="replace" repair and the validity check (common/utf8.h).
using k3::IsValidUtf8;
using k3::ReplaceInvalidUtf8;

// Python's str.isspace() for one code point.
bool IsPythonSpace(char32_t cp);

// Byte ranges [begin, end) of the substrings upstream encodes separately, in order, for valid
// UTF-8 `text`; none for empty text.
struct ByteRange {
  size_t begin = 0;
  size_t end = 0;
};
std::vector<ByteRange> SplitForEncoding(std::string_view text, size_t max_piece_chars = kMaxEncodeChars,
                                        size_t max_run_chars = kMaxRunChars);

}  // namespace k3::tok
