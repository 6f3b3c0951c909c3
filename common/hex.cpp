#include "common/hex.h"

namespace k3 {
namespace {

constexpr char kLowerDigits[] = "0123456789abcdef";
constexpr char kUpperDigits[] = "0123456789ABCDEF";

int LowerHexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

void AppendHexByte(std::string& out, uint8_t byte, HexCase hex_case) {
  const char* digits = hex_case == HexCase::kUpper ? kUpperDigits : kLowerDigits;
  out += digits[byte >> 4];
  out += digits[byte & 15];
}

std::string HexEncode(const void* data, size_t n) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) AppendHexByte(out, bytes[i]);
  return out;
}

std::string HexUint(uint64_t v, int digits) {
  std::string out(static_cast<size_t>(digits), '0');
  for (int i = digits - 1; i >= 0; --i) {
    out[static_cast<size_t>(i)] = kLowerDigits[v & 15];
    v >>= 4;
  }
  return out;
}

bool IsLowerHex(std::string_view s, size_t digits) {
  if (s.size() != digits) return false;
  for (char c : s) {
    if (LowerHexValue(c) < 0) return false;
  }
  return true;
}

bool ParseHexUint(std::string_view s, size_t digits, uint64_t* out) {
  if (digits == 0 || digits > 16 || !IsLowerHex(s, digits)) return false;
  uint64_t v = 0;
  for (char c : s) v = (v << 4) | static_cast<uint64_t>(LowerHexValue(c));
  *out = v;
  return true;
}

}  // namespace k3
