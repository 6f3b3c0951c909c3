// Fuzz target for the safetensors header reader (DESIGN.md §10). The input is a whole file:
// 8-byte length prefix, header, data. The parser must never crash, and whatever it accepts must
// satisfy the invariants its callers rely on; a violation aborts so the fuzzer reports it.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "formats/safetensors.h"

namespace {

void Require(bool ok) {
  if (!ok) std::abort();
}

void CheckAccepted(const k3::st::Header& h, size_t file_size) {
  Require(h.data_offset == 8 + h.header_len && h.file_size == file_size);
  uint64_t cursor = 0;
  for (const k3::st::TensorInfo& t : h.tensors) {
    Require(!t.name.empty() && t.name.size() <= k3::st::kMaxNameBytes);
    Require(t.shape.size() <= k3::st::kMaxRank);
    Require(t.begin == cursor && t.end >= t.begin);
    const std::optional<uint64_t> bytes = k3::st::CheckedByteSize(t.dtype, t.shape);
    Require(bytes.has_value() && *bytes == t.nbytes());
    cursor = t.end;
  }
  Require(h.data_offset + cursor == file_size);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view file(reinterpret_cast<const char*>(data), size);
  const k3::Result<k3::st::Header> h = k3::st::ParseFileBytes(file, "fuzz.safetensors");
  if (h.ok()) {
    CheckAccepted(*h, size);
  } else {
    Require(h.status().code() == k3::Code::kInvalid && !h.status().message().empty());
  }
  return 0;
}
