#include "common/printable.h"

#include "common/hex.h"
#include "common/utf8.h"

namespace k3 {

void AppendByteEscape(std::string& out, unsigned char byte) {
  out += "\\x";
  AppendHexByte(out, byte, HexCase::kUpper);
}

std::string Printable(std::string_view s, std::string_view also) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7F || c == '\\' || also.find(static_cast<char>(c)) != also.npos) {
        AppendByteEscape(out, c);
      } else {
        out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    const Utf8Step step = DecodeUtf8Step(s, i);
    // U+0080-U+009F are encoded C2 80 .. C2 9F.
    const bool c1 = step.valid && c == 0xC2 && static_cast<unsigned char>(s[i + 1]) <= 0x9F;
    if (step.valid && !c1) {
      out.append(s.substr(i, step.len));
    } else {
      for (size_t k = 0; k < step.len; ++k) {
        AppendByteEscape(out, static_cast<unsigned char>(s[i + k]));
      }
    }
    i += step.len;
  }
  return out;
}

}  // namespace k3
