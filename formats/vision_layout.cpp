#include "formats/vision_layout.h"

#include <map>
#include <string>

#include "common/align.h"

namespace k3::prepared {
namespace {

std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

Result<VisionLayout> BuildVisionLayout(const VisionConfig& v,
                                       const std::vector<TensorSpec>& tensors) {
  std::map<std::string_view, const TensorSpec*> given;
  std::vector<std::string> problems;
  for (const TensorSpec& t : tensors) {
    if (!IsVisionTensorName(t.name)) continue;
    if (!given.emplace(t.name, &t).second) problems.push_back(t.name + ": listed twice");
  }
  const std::vector<VisionTensor> want = VisionTensors(v);
  std::map<std::string_view, bool> wanted;
  for (const VisionTensor& w : want) wanted[w.name] = true;
  for (const auto& [name, spec] : given) {
    if (!wanted.count(name)) {
      problems.push_back(std::string(name) + ": not a tensor of this vision_config (" +
                         std::to_string(v.layers) + " blocks)");
    }
  }
  VisionLayout layout;
  uint64_t offset = 0;
  for (const VisionTensor& w : want) {
    const auto it = given.find(w.name);
    if (it == given.end()) {
      problems.push_back(w.name + ": missing");
      continue;
    }
    const TensorSpec& t = *it->second;
    if (t.dtype != DType::kBF16 && t.dtype != DType::kF32) {
      problems.push_back(w.name + ": dtype " + DTypeName(t.dtype) + ", expected BF16 or F32");
      continue;
    }
    if (t.shape != w.shape) {
      problems.push_back(w.name + ": shape " + ShapeText(t.shape) + ", vision_config implies " +
                         ShapeText(w.shape));
      continue;
    }
    Region r;
    r.name = w.name;
    r.file = std::string(kVisionFile);
    r.offset = AlignUp(offset, kVisionAlign);
    r.length = t.nbytes();
    r.dtype = t.dtype;
    r.shape = t.shape;
    offset = r.offset + r.length;
    layout.regions.push_back(std::move(r));
  }
  if (!problems.empty()) {
    std::string text = "vision tensors do not match vision_config: ";
    for (size_t i = 0; i < problems.size() && i < 16; ++i) text += (i ? "; " : "") + problems[i];
    if (problems.size() > 16) text += "; ... and " + std::to_string(problems.size() - 16) + " more";
    return Status::Invalid(text);
  }
  layout.bytes = AlignUp(offset, kVisionAlign);
  return layout;
}

}  // namespace k3::prepared
