// TensorsOf and FindMissingTensors live apart from prepared_layout.cpp so code that only
// validates a prepared directory (k3run) does not link the checkpoint-side code.
#include <unordered_set>

#include "formats/prepared_layout.h"
#include "formats/safetensors.h"

namespace k3::prepared {

std::vector<TensorSpec> TensorsOf(const st::CheckpointIndex& index) {
  std::vector<TensorSpec> out;
  out.reserve(index.tensor_count());
  for (const st::CheckpointIndex::Location& loc : index.All()) {
    out.push_back(TensorSpec{loc.tensor->name, loc.tensor->dtype, loc.tensor->shape});
  }
  return out;
}

std::vector<MissingTensors> FindMissingTensors(const ModelConfig& c,
                                               const std::vector<TensorSpec>& tensors) {
  std::unordered_set<std::string_view> have;
  have.reserve(tensors.size());
  // A checkpoint whose experts are stored unquantised names them differently; only MXFP4 names
  // are known (MODEL.md §2.6), so experts are looked for when the config says MXFP4 or any
  // MXFP4 expert tensor is present (in any layer: whole layers may be what is missing).
  bool mxfp4 = c.experts_mxfp4;
  for (const TensorSpec& t : tensors) {
    have.insert(t.name);
    mxfp4 = mxfp4 || (t.dtype == DType::kU8 && t.name.ends_with(kExpertSubNames[0]) &&
                      t.name.find(".block_sparse_moe.experts.") != std::string::npos);
  }
  std::vector<MissingTensors> out;
  auto check = [&](MissingTensors& unit, const std::string& name) {
    ++unit.expected;
    if (have.count(name) != 0) return;
    if (unit.missing++ == 0) unit.first = name;
  };
  for (int layer = 0; layer <= c.n_layers; ++layer) {
    const bool model_level = layer == c.n_layers;  // last, as in the released shard order
    MissingTensors unit;
    unit.layer = model_level ? -1 : layer;
    const std::vector<ExpectedTensor> wanted =
        model_level ? ExpectedResidentTensors(c) : ExpectedLayerTensors(c, layer);
    for (const ExpectedTensor& want : wanted) {
      if (!want.optional) check(unit, want.name);
    }
    if (!model_level && !c.is_dense(layer) && mxfp4) {
      for (int e = 0; e < c.n_experts; ++e) {
        for (int sub = 0; sub < kExpertSubCount; ++sub) check(unit, ExpertTensorName(layer, e, sub));
      }
    }
    if (unit.missing != 0) out.push_back(std::move(unit));
  }
  return out;
}

}  // namespace k3::prepared
