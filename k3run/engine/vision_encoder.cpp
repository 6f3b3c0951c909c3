#include "k3run/engine/vision_encoder.h"

#include <chrono>
#include <cstring>
#include <map>

#include "common/hash.h"
#include "formats/vision_layout.h"
#include "k3run/kernels/matmul.h"
#include "k3run/weights/weights.h"

namespace k3::run {
namespace {

vision::VisionDims DimsOf(const VisionConfig& v) {
  vision::VisionDims d;
  d.hidden = v.hidden;
  d.heads = v.heads;
  d.head_dim = v.head_dim();
  d.mlp = v.inter;
  d.layers = v.layers;
  d.pos_h = v.pos_h;
  d.pos_w = v.pos_w;
  d.patch = v.patch;
  d.merge = v.merge;
  d.text_hidden = v.text_hidden;
  d.projector_eps = v.projector_eps;
  return d;
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Result<std::unique_ptr<VisionEncoder>> VisionEncoder::Open(Env* env,
                                                           const prepared::PreparedDir& p) {
  const prepared::Manifest& m = p.manifest;
  if (!m.vision) {
    return Status::Invalid(p.dir + ": no vision: this prepared directory has no vision tower (its "
                           "checkpoint has no vision_config, or it was packed with --no-vision); "
                           "re-pack the checkpoint without --no-vision to give it images");
  }
  std::unique_ptr<VisionEncoder> e(new VisionEncoder());
  e->env_ = env;
  e->path_ = JoinPath(p.dir, std::string(prepared::kVisionFile));
  e->file_bytes_ = m.FindFile(prepared::kVisionFile)->size;
  for (const prepared::Region& r : m.regions) {
    if (r.file == prepared::kVisionFile) e->regions_.push_back(r);
  }
  e->dims_ = DimsOf(*m.vision);
  K3_RETURN_IF_ERROR(e->dims_.Validate());
  return e;
}

Status VisionEncoder::Load() {
  const auto t0 = std::chrono::steady_clock::now();
  K3_ASSIGN_OR_RETURN(AlignedBuffer buf, AlignedBuffer::AllocateLarge(file_bytes_));
  K3_ASSIGN_OR_RETURN(std::unique_ptr<File> f, env_->Open(path_, OpenMode::kRead));
  K3_RETURN_IF_ERROR(f->ReadExact(0, file_bytes_, buf.data()));
  // k3.json holds every tensor's hash: a changed byte is named here, not computed with.
  std::map<std::string, const prepared::Region*> by_name;
  for (const prepared::Region& r : regions_) {
    const Hash128 h = Xxh3_128(buf.data() + r.offset, r.length);
    if (!(h == r.xxh3_128)) {
      return Status::Integrity(path_ + ": tensor \"" + r.name + "\" at offset " +
                               std::to_string(r.offset) + " does not match its XXH3-128 in "
                               "k3.json (" + r.xxh3_128.Hex() + "); the file changed after "
                               "packing: run k3verify prepared --deep and re-pack");
    }
    by_name[r.name] = &r;
  }
  const auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
    const prepared::Region& r = *by_name.at(name);
    kernels::Matrix m{r.dtype == DType::kF32 ? kernels::WeightType::kF32
                                             : kernels::WeightType::kBF16,
                      rows, cols, buf.data() + r.offset, nullptr};
    return m;
  };
  norms_.clear();
  norms_.reserve(static_cast<size_t>(2 * dims_.layers + 2));
  // The norms' gains widened to fp32 (held here; the matrices stay in the file's buffer).
  const auto norm = [&](const std::string& name, const float** out) -> Status {
    const prepared::Region& r = *by_name.at(name);
    std::vector<float> v;
    K3_RETURN_IF_ERROR(WidenInto(r, buf.data() + r.offset, &v));
    norms_.push_back(std::move(v));
    *out = norms_.back().data();
    return Status::Ok();
  };
  const vision::VisionDims& d = dims_;
  vision::VisionWeights w;
  w.patch_proj = matrix("vision_tower.patch_embed.proj.weight", d.hidden, d.patch_dim());
  w.pos_emb = matrix("vision_tower.patch_embed.pos_emb.weight", d.pos_h * d.pos_w, d.hidden);
  for (int64_t b = 0; b < d.layers; ++b) {
    vision::VisionBlockWeights bw;
    K3_RETURN_IF_ERROR(norm(vision::VisionBlockTensorName(b, "norm0"), &bw.norm0));
    K3_RETURN_IF_ERROR(norm(vision::VisionBlockTensorName(b, "norm1"), &bw.norm1));
    bw.wqkv = matrix(vision::VisionBlockTensorName(b, "wqkv"), 3 * d.qkv(), d.hidden);
    bw.wo = matrix(vision::VisionBlockTensorName(b, "wo"), d.hidden, d.qkv());
    bw.fc0 = matrix(vision::VisionBlockTensorName(b, "mlp.fc0"), d.mlp, d.hidden);
    bw.fc1 = matrix(vision::VisionBlockTensorName(b, "mlp.fc1"), d.hidden, d.mlp);
    w.blocks.push_back(bw);
  }
  K3_RETURN_IF_ERROR(norm("vision_tower.encoder.final_layernorm.weight", &w.final_norm));
  w.proj0 = matrix("mm_projector.proj.0.weight", d.merged(), d.merged());
  w.proj2 = matrix("mm_projector.proj.2.weight", d.text_hidden, d.merged());
  K3_RETURN_IF_ERROR(norm("mm_projector.post_norm.weight", &w.post_norm));
  K3_RETURN_IF_ERROR(w.Validate(d));
  buffer_ = std::move(buf);
  weights_ = std::move(w);
  load_seconds_ = Since(t0);
  return Status::Ok();
}

uint64_t VisionEncoder::PlanBytesFor(const vision::VisionDims& dims, uint64_t weight_bytes,
                                     int64_t tokens) {
  // VisionScratchBytes is linear in gh·gw: a 2 × (2·tokens) grid has the patches of any image
  // of `tokens` rows.
  const int64_t scratch = vision::VisionScratchBytes(dims, 2, 2 * tokens);
  return weight_bytes + static_cast<uint64_t>(scratch) +
         static_cast<uint64_t>(tokens) * static_cast<uint64_t>(dims.text_hidden) * 4;
}

void VisionEncoder::Release() {
  buffer_ = AlignedBuffer();
  norms_.clear();
  weights_ = vision::VisionWeights();
}

Result<MediaSpan> VisionEncoder::Encode(const vision::ImagePatches& image, int64_t first,
                                        double* seconds) {
  if (!loaded()) K3_RETURN_IF_ERROR(Load());
  const auto t0 = std::chrono::steady_clock::now();
  const int gh = static_cast<int>(image.grid.grid_h), gw = static_cast<int>(image.grid.grid_w);
  const int64_t rows = static_cast<int64_t>(gh / 2) * (gw / 2);
  auto data = std::make_shared<std::vector<float>>(static_cast<size_t>(rows * dims_.text_hidden));
  K3_RETURN_IF_ERROR(
      vision::RunVisionTower(weights_, dims_, image.patches.data(), gh, gw, data->data()));
  MediaSpan s;
  s.first = first;
  s.rows = rows;
  s.id = Xxh3_128(data->data(), data->size() * sizeof(float));
  s.data = std::move(data);
  if (seconds != nullptr) *seconds = Since(t0);
  return s;
}

}  // namespace k3::run
