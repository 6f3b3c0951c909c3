// Hexadecimal text: lowercase by default (hashes, commits, sample bits, JSON \u00XX escapes),
// uppercase where a convention wants it (URL %XX escapes, \xNN in messages).
//
// Decoding accepts lowercase only, with an exact digit count: every hex field k3 reads (hashes,
// oids, fixture sample bits) is written lowercase with a fixed width, so anything else is a
// damaged or foreign file rather than another spelling of the same value.
//
// Thread safety: all functions are reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace k3 {

enum class HexCase { kLower, kUpper };

// Appends the two hex digits of `byte`, high nibble first.
void AppendHexByte(std::string& out, uint8_t byte, HexCase hex_case = HexCase::kLower);

// 2·n lowercase hex digits of the n bytes at `data`, in memory order.
std::string HexEncode(const void* data, size_t n);

// The low 4·digits bits of `v` as exactly `digits` lowercase hex digits, most significant first
// (zero-padded). digits is 0..16.
std::string HexUint(uint64_t v, int digits);

// True when `s` is exactly `digits` characters of [0-9a-f].
bool IsLowerHex(std::string_view s, size_t digits);

// Parses exactly `digits` (1..16) lowercase hex digits into *out; false (out untouched) on any
// other length or character.
bool ParseHexUint(std::string_view s, size_t digits, uint64_t* out);

}  // namespace k3
