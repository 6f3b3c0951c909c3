// The __metadata__ every synthetic shard carries: {"format": "pt"}, as the release's shards
// (written by PyTorch's safetensors) do. Shared by the layout (to size headers) and the writer.
#pragma once

#include <map>
#include <string>

namespace k3::synth {

inline std::map<std::string, std::string> ShardMetadata() { return {{"format", "pt"}}; }

}  // namespace k3::synth
