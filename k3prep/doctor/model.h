// What a directory holds, as far as `k3prep doctor` needs to know: nothing, a checkpoint
// (config.json + model.safetensors.index.json or *.safetensors shards) or a prepared directory
// (k3.json), and for the last two the smallest budget and the expert record size.
//
// Goals: the same readers the tools use (OpenPrepared, CheckpointIndex + BuildLayout), so a
// directory the doctor accepts is one pack/k3run accept. Non-goals: hashing (k3verify).
#pragma once

#include <string>

#include "common/env.h"
#include "k3prep/doctor/doctor.h"

namespace k3::prep {

inline constexpr const char* kConfigFile = "config.json";
inline constexpr const char* kIndexFile = "model.safetensors.index.json";

// Never fails: a directory that does not open is reported in ModelReport::problem.
ModelReport InspectModelDir(Env* env, const std::string& dir);

// The sizes of what `k3prep pack` writes for a laid-out model (ModelReport::sizes of a
// checkpoint; the released config's estimate when DIR holds no model).
ModelSizes SizesOfLayout(const ModelConfig& c, const prepared::Layout& layout, std::string basis);

}  // namespace k3::prep
