// The JSON files `k3prep synth` writes besides the shards: model.safetensors.index.json (as
// released: metadata.total_size = sum of tensor bytes, weight_map name → shard, names sorted)
// and the --dry-run layout.json (format "k3-synth-layout", version 1; docs/SYNTH.md):
//
//   {"format": "k3-synth-layout", "version": 1, "preset": ..., "seed": ..., "small_dtype": ...,
//    "config": <the config.json that would be written>,
//    "totals": {"tensor_bytes", "file_bytes", "trunk_bytes", "expert_bytes", "expert_count",
//               "bytes_per_expert", "embed_lm_head_bytes", "tensor_count"},
//    "shards": [{"name", "file_size", "data_offset", "data_bytes", "tensor_count",
//                "first_layer", "last_layer", "model_level"}],
//    "tensors": [{"name", "dtype", "shape", "shard", "begin", "end"}]}
//
// begin/end are offsets in the shard's data section (safetensors "data_offsets"); the file
// offset of a byte is the shard's data_offset + begin. Both files are written by nlohmann: the
// index as the release lays it out (dump(2)), layout.json one shard or tensor per line
// (formats/json_listing.h).
#pragma once

#include <cstdint>
#include <string>

#include "k3prep/synth/layout.h"

namespace k3::synth {

std::string IndexJson(const Layout& layout);
std::string LayoutJson(const Layout& layout, const std::string& preset, uint64_t seed,
                       const std::string& config_json);

}  // namespace k3::synth
