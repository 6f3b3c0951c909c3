#include "k3run/text/text_split.h"

namespace k3::tok {
namespace {

// Decodes the code point of the valid sequence at s[i] (length n).
char32_t CodePoint(std::string_view s, size_t i, size_t n) {
  const auto b = [&](size_t k) { return static_cast<char32_t>(static_cast<uint8_t>(s[i + k])); };
  switch (n) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

size_t SequenceLength(uint8_t lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

}  // namespace

bool IsPythonSpace(char32_t c) {
  if (c <= 0x20) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::vector<ByteRange> SplitForEncoding(std::string_view text, size_t max_piece_chars,
                                        size_t max_run_chars) {
  std::vector<ByteRange> out;
  if (text.empty()) return out;  // range(0, 0, 400000) is empty upstream
  size_t i = 0;
  do {
    // One piece of at most max_piece_chars characters: text[i:i+400000] upstream.
    size_t slice_start = i;
    size_t run_len = 0;
    bool run_is_space = false;
    size_t chars = 0;
    while (i < text.size() && chars < max_piece_chars) {
      const size_t n = SequenceLength(static_cast<uint8_t>(text[i]));
      const bool space = IsPythonSpace(CodePoint(text, i, n));
      if (chars == 0) run_is_space = space;  // upstream seeds the flag from s[0]
      if (space != run_is_space) {
        run_len = 1;
        run_is_space = space;
      } else if (++run_len > max_run_chars) {
        out.push_back({slice_start, i});
        slice_start = i;
        run_len = 1;
      }
      i += n;
      ++chars;
    }
    out.push_back({slice_start, i});
  } while (i < text.size());
  return out;
}

}  // namespace k3::tok
