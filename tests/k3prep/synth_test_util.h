// Helpers shared by the synth tests (test-only).
#pragma once

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace k3::synth::test {

// The released index (tests/data/kimi-k3/model.safetensors.index.json.gz), decompressed with
// gzip(1) so the tests need no zlib binding.
inline nlohmann::json ReleasedIndex() {
  const std::string cmd =
      std::string("gzip -dc '") + K3_SOURCE_DIR + "/tests/data/kimi-k3/model.safetensors.index.json.gz'";
  std::string text;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
    pclose(p);
  }
  return nlohmann::json::parse(text);
}

}  // namespace k3::synth::test
