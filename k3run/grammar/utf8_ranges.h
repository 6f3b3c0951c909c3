// Code-point classes as UTF-8 byte-range sequences, so that the grammar's pushdown automaton
// reads bytes only and can never accept a byte string that is not valid UTF-8.
//
// Why bytes and not code points: token byte strings split characters anywhere (a token may end
// after the first byte of a 3-byte character, or hold a lone 0xFF). A byte automaton whose
// terminals are UTF-8 sequences handles that with no partial-decoding state: a byte that could
// never start or continue a well-formed sequence simply matches no terminal.
// Rules: Unicode Table 3-7 (no overlong forms, no surrogates U+D800..U+DFFF, nothing above
// U+10FFFF), the same rules as common/utf8.h.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace k3::run::grammar {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;
inline constexpr uint32_t kSurrogateLo = 0xD800;
inline constexpr uint32_t kSurrogateHi = 0xDFFF;

struct CodePointRange {
  uint32_t lo = 0;
  uint32_t hi = 0;  // inclusive
};

// One UTF-8 sequence shape: byte i lies in [lo[i], hi[i]] for i < length. Every byte string
// matching it is the encoding of one code point of the range it came from, and vice versa.
struct ByteRangeSeq {
  int length = 0;  // 1..4
  std::array<uint8_t, 4> lo{};
  std::array<uint8_t, 4> hi{};
};

// Sorts, merges and removes the surrogates from `ranges` (each range must have lo <= hi <=
// kMaxCodePoint); with `negate`, the complement within [0, kMaxCodePoint] minus the surrogates.
std::vector<CodePointRange> NormalizeClass(std::vector<CodePointRange> ranges, bool negate);

// The UTF-8 sequence shapes whose union encodes exactly the code points of `ranges` (normalized,
// surrogate-free); the shapes are disjoint.
std::vector<ByteRangeSeq> Utf8Sequences(const std::vector<CodePointRange>& ranges);

// Appends the UTF-8 encoding of `cp` (cp <= kMaxCodePoint, not a surrogate).
void AppendUtf8(uint32_t cp, std::vector<uint8_t>* out);
std::string Utf8Of(uint32_t cp);
// The code points of `utf8`, which must be valid UTF-8.
std::vector<uint32_t> CodePointsOf(std::string_view utf8);

}  // namespace k3::run::grammar
