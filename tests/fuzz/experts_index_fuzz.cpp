// Fuzz target for experts.idx (formats/experts_index.h): DecodeExpertsIndex must never crash,
// refuse only with kInvalid, and decode strictly enough that re-encoding what it accepts gives
// back the very same bytes (no field it ignores, no padding it lets differ). A violated property
// aborts, which libFuzzer and the replay driver both report as a failure.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "formats/experts_index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  k3::Result<k3::prepared::ExpertsIndex> idx = k3::prepared::DecodeExpertsIndex(bytes, "fuzz/experts.idx");
  if (!idx.ok()) {
    if (idx.status().code() != k3::Code::kInvalid) std::abort();
    return 0;
  }
  if (k3::prepared::EncodeExpertsIndex(*idx) != bytes) std::abort();
  for (const k3::prepared::ExpertRecord& r : idx->records) {
    if (r.file_id >= idx->files.size()) std::abort();
  }
  return 0;
}
