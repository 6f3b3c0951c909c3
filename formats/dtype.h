// Element types of tensors on disk (safetensors dtype strings), with their sizes.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace k3 {

enum class DType : uint8_t {
  kBOOL, kU8, kI8, kF8_E4M3, kF8_E5M2, kF8_E8M0, kI16, kU16, kF16, kBF16,
  kI32, kU32, kF32, kF64, kI64, kU64,
};

// "BF16" → kBF16; nullopt for an unknown string.
std::optional<DType> ParseDType(std::string_view s);
// kBF16 → "BF16".
const char* DTypeName(DType t);
// Bytes per element (all supported dtypes are whole bytes).
uint32_t DTypeSize(DType t);
// "BOOL, U8, …, U64": every accepted dtype string, for error messages.
std::string_view SupportedDTypeList();

}  // namespace k3
