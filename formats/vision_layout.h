// vision.bin: the vision tower and projector of a prepared directory (docs/FORMATS.md
// "vision.bin"). Every vision tensor, in the canonical order of VisionTensors
// (formats/vision_config.h), each at a 4096-aligned offset so one O_DIRECT read fetches it.
//
// Goals: one function decides the placement; pack writes by it and the manifest reader
// recomputes it and requires equality ("recompute, never trust"), as for trunk.bin.
// Non-goals: reading bytes (k3run loads vision.bin through Env), the tower math.
// Evolution: changing the order or the alignment is a new format version.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "formats/prepared_layout.h"
#include "formats/vision_config.h"

namespace k3::prepared {

inline constexpr std::string_view kVisionFile = "vision.bin";
// Tensors start on 4096: each is one direct read into page-aligned memory.
inline constexpr uint64_t kVisionAlign = 4096;

struct VisionLayout {
  std::vector<Region> regions;  // vision.bin, file order (= VisionTensors order)
  uint64_t bytes = 0;           // vision.bin size: the last tensor's end rounded up to 4096
};

// Checks that the vision names among `tensors` ("vision_tower.", "mm_projector."; others are
// ignored) are exactly VisionTensors(v), each BF16 or F32 with its shape, then places them.
// kInvalid listing up to 16 problems (missing, unexpected, dtype, shape), each naming the tensor.
Result<VisionLayout> BuildVisionLayout(const VisionConfig& v,
                                       const std::vector<TensorSpec>& tensors);

}  // namespace k3::prepared
