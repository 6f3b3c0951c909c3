#include "k3prep/doctor/model.h"

#include <algorithm>

#include "formats/download_manifest.h"
#include "formats/expert_share.h"
#include "formats/prepared_manifest.h"
#include "formats/vision_layout.h"
#include "k3prep/doctor/budget.h"

namespace k3::prep {

// What `k3prep pack` would write for this layout (k3.json estimated as pack estimates it).
ModelSizes SizesOfLayout(const ModelConfig& c, const prepared::Layout& layout, std::string basis) {
  ModelSizes z;
  z.config = c;
  z.trunk_file = layout.trunk_bytes;
  z.resident_file = layout.resident_bytes;
  z.manifest_bytes = (uint64_t{64} << 10) + 512 * (layout.trunk.size() + layout.resident.size() + 4);
  z.basis = std::move(basis);
  return z;
}

namespace {

std::string Parent(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string ModelShape(const ModelConfig& c) {
  return std::to_string(c.n_layers) + " layers, hidden " + std::to_string(c.hidden) + ", " +
         std::to_string(c.n_experts) + " experts × " + std::to_string(c.n_moe_layers()) +
         " MoE layers, top-" + std::to_string(c.topk);
}

// vision.bin as pack would write it (BF16, as released), 0 without a vision_config.
uint64_t CheckpointVisionBytes(Env* env, const std::string& dir) {
  Result<std::string> text = ReadFileToString(env, JoinPath(dir, kConfigFile), kMaxConfigBytes);
  if (!text.ok()) return 0;
  Result<std::optional<VisionConfig>> v = ParseVisionConfig(*text, kConfigFile);
  if (!v.ok() || !v->has_value()) return 0;
  std::vector<prepared::TensorSpec> tensors;
  for (const VisionTensor& t : VisionTensors(**v)) {
    tensors.push_back(prepared::TensorSpec{t.name, DType::kBF16, t.shape});
  }
  Result<prepared::VisionLayout> layout = prepared::BuildVisionLayout(**v, tensors);
  return layout.ok() ? layout->bytes : 0;
}

void InspectPrepared(Env* env, const std::string& dir, ModelReport* m) {
  m->kind = ModelKind::kPrepared;
  prepared::OpenOptions open;
  // Link-mode shards may sit on another disk or be unmounted right now; the doctor still
  // reports what it can, and k3verify prepared checks the files.
  open.check_expert_files = false;
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(env, dir, open);
  if (!p.ok()) {
    m->problem = p.status().ToString();
    m->summary = "prepared directory (k3.json) that does not open";
    return;
  }
  const ModelConfig& c = p->manifest.config;
  uint64_t largest = 0;
  for (const prepared::ExpertRecord& r : p->experts.records) largest = std::max(largest, r.length);
  m->expert_bytes = largest;
  m->floor = FloorOf(p->manifest.runs, largest, c.topk, !p->experts.records.empty());
  if (!p->expert_paths.empty()) m->expert_dir = Parent(p->expert_paths.front());
  m->summary = "prepared directory (format " + std::to_string(prepared::kManifestVersion) + ", experts " +
               prepared::ExpertsModeName(p->manifest.experts_mode) + "): " + ModelShape(c);
  if (p->manifest.share) {
    m->share = prepared::DescribeShare(*p->manifest.share);
    m->summary += "; the share of " + m->share;
  }
  ModelSizes z;
  z.config = c;
  z.basis = "the prepared directory";
  for (const prepared::FileEntry& f : p->manifest.files) {
    if (f.path == prepared::kTrunkFile) z.trunk_file = f.size;
    if (f.path == prepared::kResidentFile) z.resident_file = f.size;
    if (f.path == prepared::kVisionFile) z.vision_file = f.size;
    if (f.path.rfind(std::string(prepared::kTokenizerDir) + "/", 0) == 0) z.tokenizer_bytes += f.size;
  }
  m->summary += p->manifest.vision ? "; vision tower and projector " + DecimalGb(z.vision_file)
                                   : std::string("; no vision");
  // A share's k3.json is this one with "share" added and its own expert file list: close enough.
  Result<uint64_t> json = env->FileSize(JoinPath(dir, std::string(prepared::kManifestFile)));
  z.manifest_bytes = (json.ok() ? *json : 0) + 4096;
  m->sizes = std::move(z);
}


void InspectCheckpoint(Env* env, const std::string& dir, ModelReport* m) {
  m->kind = ModelKind::kCheckpoint;
  m->expert_dir = dir;
  Result<ModelConfig> c = LoadModelConfig(env, JoinPath(dir, kConfigFile));
  if (!c.ok()) {
    m->problem = c.status().ToString();
    m->summary = "checkpoint whose config.json does not load";
    return;
  }
  m->summary = "checkpoint: " + ModelShape(*c);
  if (c->n_experts > 0 && c->n_moe_layers() > 0) m->expert_bytes = prepared::ExpertBytes(*c);
  Result<prepared::Layout> layout = LayoutFromCheckpoint(env, dir, *c);
  if (!layout.ok()) {
    m->problem = layout.status().ToString();
    return;
  }
  m->floor = FloorOfLayout(*layout, *c);
  ModelSizes z = SizesOfLayout(*c, *layout, "the checkpoint's tensors");
  z.vision_file = CheckpointVisionBytes(env, dir);
  m->summary += z.vision_file ? "; vision tower and projector " + DecimalGb(z.vision_file)
                              : std::string("; no vision");
  for (const char* name : {"tiktoken.model", "tokenizer_config.json"}) {
    Result<uint64_t> size = env->FileSize(JoinPath(dir, name));
    if (size.ok()) z.tokenizer_bytes += *size;
  }
  m->sizes = std::move(z);
}

bool HasShards(Env* env, const std::string& dir) {
  Result<std::vector<DirEntry>> entries = env->ListDir(dir);
  if (!entries.ok()) return false;
  return std::any_of(entries->begin(), entries->end(), [](const DirEntry& e) {
    const std::string ext = ".safetensors";
    return !e.is_dir && e.name.size() > ext.size() &&
           e.name.compare(e.name.size() - ext.size(), ext.size(), ext) == 0;
  });
}

}  // namespace

ModelReport InspectModelDir(Env* env, const std::string& dir) {
  ModelReport m;
  const std::string download = JoinPath(dir, std::string(dl::kFileName));
  if (env->Exists(download)) {
    Result<dl::DownloadManifest> d = dl::LoadDownloadManifest(env, download);
    if (d.ok()) m.download_repo = d->repo;
  }
  if (env->Exists(JoinPath(dir, std::string(prepared::kManifestFile)))) {
    InspectPrepared(env, dir, &m);
  } else if (env->Exists(JoinPath(dir, kConfigFile)) &&
             (env->Exists(JoinPath(dir, kIndexFile)) || HasShards(env, dir))) {
    InspectCheckpoint(env, dir, &m);
  } else {
    m.summary = "no model (neither k3.json nor config.json with safetensors shards)";
    if (!m.download_repo.empty()) m.summary += "; an unfinished download of " + m.download_repo;
  }
  return m;
}

}  // namespace k3::prep
