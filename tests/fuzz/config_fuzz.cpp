// Fuzz target for formats/config (DESIGN.md §10): ParseModelConfig must never crash, and every
// config it accepts must serialise and read back unchanged. A violated property aborts, which
// libFuzzer and the replay driver both report as a failure.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "formats/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  k3::Result<k3::ModelConfig> parsed = k3::ParseModelConfig(text, "fuzz/config.json");
  if (!parsed.ok()) {
    // A refusal is always invalid input (exit 2), never an I/O or integrity failure.
    if (parsed.status().code() != k3::Code::kInvalid) std::abort();
    return 0;
  }
  const k3::ModelConfig& c = *parsed;
  const std::string canonical = k3::CanonicalConfigJson(c);
  if (canonical != k3::CanonicalConfigJson(c)) std::abort();

  // The released shape reads back as the same config.
  k3::Result<k3::ModelConfig> again = k3::ParseModelConfig(k3::ReleasedConfigJson(c), "written");
  if (!again.ok() || !(*again == c)) std::abort();

  // The canonical JSON is itself a flat config; it carries no quantization_config, so it reads
  // back equal when the experts are not MXFP4.
  if (!c.experts_mxfp4) {
    k3::Result<k3::ModelConfig> flat = k3::ParseModelConfig(canonical, "canonical");
    if (!flat.ok() || !(*flat == c)) std::abort();
  }
  for (int L = 0; L < c.n_layers; ++L) (void)c.is_mla(L);
  return 0;
}
