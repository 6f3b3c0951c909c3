#include "k3prep/synth/manifests.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "formats/json_listing.h"

namespace k3::synth {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

ojson ShardJson(const ShardPlan& sp, int n_layers) {
  // Units: layers 0..n_layers−1, the model-level tensors (n_layers), then the vision units.
  const bool model_level = sp.first_unit <= n_layers && sp.last_unit >= n_layers;
  const bool has_layers = sp.first_unit < n_layers;
  ojson j;
  j["name"] = sp.name;
  j["file_size"] = sp.file_size;
  j["data_offset"] = sp.data_offset;
  j["data_bytes"] = sp.data_bytes;
  j["tensor_count"] = sp.tensor_count;
  j["first_layer"] = has_layers ? ojson(sp.first_unit) : ojson(nullptr);
  j["last_layer"] = has_layers ? ojson(std::min(sp.last_unit, n_layers - 1)) : ojson(nullptr);
  j["model_level"] = model_level;
  j["vision"] = sp.last_unit > n_layers;
  return j;
}

ojson TensorJson(const Layout& layout, const TensorPlan& t) {
  ojson j;
  j["name"] = t.name;
  j["dtype"] = std::string(DTypeName(t.dtype));
  j["shape"] = t.shape;
  j["shard"] = layout.shards[t.shard].name;
  j["begin"] = t.begin;
  j["end"] = t.begin + t.nbytes;
  return j;
}

}  // namespace

// nlohmann's json keeps object keys sorted (std::map, byte order), which is the released
// index's weight_map order; dump(2) gives the released layout byte for byte (the reference
// fixtures hash this file).
std::string IndexJson(const Layout& layout) {
  json weight_map = json::object();
  for (const TensorPlan& t : layout.tensors) weight_map[t.name] = layout.shards[t.shard].name;
  json doc;
  doc["metadata"]["total_size"] = layout.total_tensor_bytes;
  doc["weight_map"] = std::move(weight_map);
  return doc.dump(2) + "\n";
}

std::string LayoutJson(const Layout& layout, const std::string& preset, uint64_t seed,
                       const std::string& config_json) {
  ojson doc;
  doc["format"] = "k3-synth-layout";
  doc["version"] = 1;
  doc["preset"] = preset;
  doc["seed"] = seed;
  doc["small_dtype"] = std::string(SmallDTypeName(layout.small));
  doc["config"] = ojson::parse(config_json);
  ojson& totals = doc["totals"];
  totals["tensor_bytes"] = layout.total_tensor_bytes;
  totals["file_bytes"] = layout.total_file_bytes;
  totals["trunk_bytes"] = layout.trunk_bytes;
  totals["expert_bytes"] = layout.expert_bytes;
  totals["expert_count"] = layout.expert_count;
  totals["bytes_per_expert"] = layout.bytes_per_expert;
  totals["embed_lm_head_bytes"] = layout.embed_lm_head_bytes;
  totals["vision_bytes"] = layout.vision_bytes;
  totals["tensor_count"] = layout.tensors.size();
  ojson shards = ojson::array();
  for (const ShardPlan& sp : layout.shards) shards.push_back(ShardJson(sp, layout.config.n_layers));
  doc["shards"] = std::move(shards);
  ojson tensors = ojson::array();
  for (const TensorPlan& t : layout.tensors) tensors.push_back(TensorJson(layout, t));
  doc["tensors"] = std::move(tensors);
  return listing::Dump(doc);
}

}  // namespace k3::synth
