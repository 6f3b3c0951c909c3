// Fuzz target for k3.json (formats/prepared_manifest.h): ParseManifest must never crash and
// refuse only with kInvalid; a manifest it accepts renders, and the rendering is a fixed point
// (parse(render(m)) renders to the same text), so a pack's k3.json reads back as written. A
// violated property aborts, which libFuzzer and the replay driver both report as a failure.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "formats/prepared_manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  k3::Result<k3::prepared::Manifest> m = k3::prepared::ParseManifest(text, "fuzz/k3.json");
  if (!m.ok()) {
    if (m.status().code() != k3::Code::kInvalid) std::abort();
    return 0;
  }
  k3::Result<std::string> rendered = k3::prepared::RenderManifest(*m);
  if (!rendered.ok()) std::abort();
  k3::Result<k3::prepared::Manifest> again = k3::prepared::ParseManifest(*rendered, "rendered");
  if (!again.ok()) std::abort();
  k3::Result<std::string> twice = k3::prepared::RenderManifest(*again);
  if (!twice.ok() || *twice != *rendered) std::abort();
  return 0;
}
