// Little-endian integers in byte buffers, field by field (no struct punning, so host layout and
// padding never matter): the binary formats of formats/ (experts.idx, sequence state files).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace k3::le {

inline void Put32(std::string& out, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[at + static_cast<size_t>(i)] = static_cast<char>(v >> (8 * i));
}
inline void Put64(std::string& out, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[at + static_cast<size_t>(i)] = static_cast<char>(v >> (8 * i));
}
inline void Append32(std::string& out, uint32_t v) {
  out.append(4, '\0');
  Put32(out, out.size() - 4, v);
}
inline void Append64(std::string& out, uint64_t v) {
  out.append(8, '\0');
  Put64(out, out.size() - 8, v);
}
inline uint32_t Get32(std::string_view in, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(in[at + static_cast<size_t>(i)]);
  return v;
}
inline uint64_t Get64(std::string_view in, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(in[at + static_cast<size_t>(i)]);
  return v;
}

}  // namespace k3::le
