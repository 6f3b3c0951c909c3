// Calling the float64 vision reference (tests/reference/vision_ref.py) from a test: the "dims"
// object of its cases.json, and the run itself (see the script's usage for the files).
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "k3run/vision/vision_tower.h"

namespace k3::vision::testing {

inline nlohmann::json VisionRefDims(const VisionDims& d) {
  return {{"hidden", d.hidden},
          {"heads", d.heads},
          {"head_dim", d.head_dim},
          {"mlp", d.mlp},
          {"layers", d.layers},
          {"pos_h", d.pos_h},
          {"pos_w", d.pos_w},
          {"patch", d.patch},
          {"text_hidden", d.text_hidden},
          {"norm_eps", static_cast<double>(d.norm_eps)},
          {"projector_eps", static_cast<double>(d.projector_eps)},
          {"rope_theta", d.rope_theta}};
}

// Runs vision_ref.py on `dir` (its cases.json written); true when it exited 0. `output` gets what
// it printed (stdout and stderr).
inline bool RunVisionRef(const std::string& dir, std::string* output) {
  const std::string cmd = "/usr/bin/python3 " + std::string(K3_SOURCE_DIR) +
                          "/tests/reference/vision_ref.py " + dir + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    *output = "popen failed: " + cmd;
    return false;
  }
  char buf[4096];
  while (size_t got = fread(buf, 1, sizeof(buf), pipe)) output->append(buf, got);
  const int status = pclose(pipe);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace k3::vision::testing
