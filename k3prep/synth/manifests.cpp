#include "k3prep/synth/manifests.h"

#include <algorithm>
#include <numeric>

#include <nlohmann/json.hpp>

namespace k3::synth {
namespace {

// Tensor and shard names are plain ASCII we generate ourselves; quoting through nlohmann keeps
// that an invariant rather than an assumption.
std::string Quote(const std::string& s) { return nlohmann::json(s).dump(); }

}  // namespace

std::string IndexJson(const Layout& layout) {
  std::vector<size_t> order(layout.tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return layout.tensors[a].name < layout.tensors[b].name;
  });
  std::string out = "{\n  \"metadata\": {\n    \"total_size\": " +
                    std::to_string(layout.total_tensor_bytes) + "\n  },\n  \"weight_map\": {\n";
  for (size_t k = 0; k < order.size(); ++k) {
    const TensorPlan& t = layout.tensors[order[k]];
    out += "    " + Quote(t.name) + ": " + Quote(layout.shards[t.shard].name) +
           (k + 1 < order.size() ? ",\n" : "\n");
  }
  out += "  }\n}\n";
  return out;
}

std::string LayoutJson(const Layout& layout, const std::string& preset, uint64_t seed,
                       const std::string& config_json) {
  std::string out = "{\n\"format\": \"k3-synth-layout\",\n\"version\": 1,\n";
  out += "\"preset\": " + Quote(preset) + ",\n";
  out += "\"seed\": " + std::to_string(seed) + ",\n";
  out += "\"small_dtype\": " + Quote(SmallDTypeName(layout.small)) + ",\n";
  out += "\"config\": " + nlohmann::json::parse(config_json).dump() + ",\n";
  out += "\"totals\": {\"tensor_bytes\": " + std::to_string(layout.total_tensor_bytes) +
         ", \"file_bytes\": " + std::to_string(layout.total_file_bytes) +
         ", \"trunk_bytes\": " + std::to_string(layout.trunk_bytes) +
         ", \"expert_bytes\": " + std::to_string(layout.expert_bytes) +
         ", \"expert_count\": " + std::to_string(layout.expert_count) +
         ", \"bytes_per_expert\": " + std::to_string(layout.bytes_per_expert) +
         ", \"embed_lm_head_bytes\": " + std::to_string(layout.embed_lm_head_bytes) +
         ", \"tensor_count\": " + std::to_string(layout.tensors.size()) + "},\n";
  out += "\"shards\": [\n";
  const int n_layers = layout.config.n_layers;
  for (size_t s = 0; s < layout.shards.size(); ++s) {
    const ShardPlan& sp = layout.shards[s];
    const bool model_level = sp.last_unit == n_layers;
    const int last_layer = model_level ? n_layers - 1 : sp.last_unit;
    const bool has_layers = sp.first_unit < n_layers;
    out += "{\"name\": " + Quote(sp.name) + ", \"file_size\": " + std::to_string(sp.file_size) +
           ", \"data_offset\": " + std::to_string(sp.data_offset) +
           ", \"data_bytes\": " + std::to_string(sp.data_bytes) +
           ", \"tensor_count\": " + std::to_string(sp.tensor_count) +
           ", \"first_layer\": " + (has_layers ? std::to_string(sp.first_unit) : "null") +
           ", \"last_layer\": " + (has_layers ? std::to_string(last_layer) : "null") +
           ", \"model_level\": " + (model_level ? "true" : "false") + "}" +
           (s + 1 < layout.shards.size() ? ",\n" : "\n");
  }
  out += "],\n\"tensors\": [\n";
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const TensorPlan& t = layout.tensors[i];
    std::string shape;
    for (uint64_t d : t.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    out += "{\"name\": " + Quote(t.name) + ", \"dtype\": \"" + DTypeName(t.dtype) +
           "\", \"shape\": [" + shape + "], \"shard\": " + Quote(layout.shards[t.shard].name) +
           ", \"begin\": " + std::to_string(t.begin) +
           ", \"end\": " + std::to_string(t.begin + t.nbytes) + "}" +
           (i + 1 < layout.tensors.size() ? ",\n" : "\n");
  }
  out += "]\n}\n";
  return out;
}

}  // namespace k3::synth
