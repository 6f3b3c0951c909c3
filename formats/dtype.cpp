#include "formats/dtype.h"

#include <array>

namespace k3 {
namespace {

struct DTypeRow {
  DType type;
  std::string_view name;
  uint32_t size;
};

// One row per enumerator, in enum order, so DTypeName/DTypeSize index it directly.
constexpr std::array<DTypeRow, 16> kDTypes = {{
    {DType::kBOOL, "BOOL", 1},
    {DType::kU8, "U8", 1},
    {DType::kI8, "I8", 1},
    {DType::kF8_E4M3, "F8_E4M3", 1},
    {DType::kF8_E5M2, "F8_E5M2", 1},
    {DType::kF8_E8M0, "F8_E8M0", 1},
    {DType::kI16, "I16", 2},
    {DType::kU16, "U16", 2},
    {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},
    {DType::kI32, "I32", 4},
    {DType::kU32, "U32", 4},
    {DType::kF32, "F32", 4},
    {DType::kF64, "F64", 8},
    {DType::kI64, "I64", 8},
    {DType::kU64, "U64", 8},
}};

constexpr bool TableMatchesEnum() {
  for (size_t i = 0; i < kDTypes.size(); ++i) {
    if (static_cast<size_t>(kDTypes[i].type) != i) return false;
  }
  return true;
}
static_assert(TableMatchesEnum(), "kDTypes rows must follow the DType enumerator order");

}  // namespace

std::optional<DType> ParseDType(std::string_view s) {
  for (const DTypeRow& row : kDTypes) {
    if (row.name == s) return row.type;
  }
  return std::nullopt;
}

const char* DTypeName(DType t) {
  const auto i = static_cast<size_t>(t);
  return i < kDTypes.size() ? kDTypes[i].name.data() : "?";
}

uint32_t DTypeSize(DType t) {
  const auto i = static_cast<size_t>(t);
  return i < kDTypes.size() ? kDTypes[i].size : 0;
}

std::string_view SupportedDTypeList() {
  return "BOOL, U8, I8, F8_E4M3, F8_E5M2, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, F64, "
         "I64, U64";
}

}  // namespace k3
