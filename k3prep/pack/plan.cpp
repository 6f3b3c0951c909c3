// The pack plan: what goes where (see k3prep/pack/plan.h).
#include "k3prep/pack/plan.h"

#include <algorithm>
#include <map>
#include <optional>

#include "common/align.h"
#include "formats/download_manifest.h"
#include "formats/safetensors.h"

namespace k3::prep::pack_internal {
namespace {

// DESIGN.md §4: experts stored as U8 mean MXFP4 even when config.json (the flat fixture shape)
// has no quantization_config; the prepared format requires MXFP4 experts.
Status ResolveExpertsMxfp4(const st::CheckpointIndex& index, const std::string& config_path,
                           ModelConfig* c) {
  if (c->experts_mxfp4 || c->n_moe_layers() <= 0 || c->n_experts <= 0) {
    c->experts_mxfp4 = true;
    return c->n_moe_layers() > 0 ? ValidateMxfp4Dims(*c, config_path) : Status::Ok();
  }
  const std::string probe = prepared::ExpertTensorName(c->first_dense, 0, 0);
  const st::CheckpointIndex::Location* loc = index.Find(probe);
  if (loc == nullptr) {
    return Status::Invalid(index.dir() + ": expert tensor \"" + probe +
                           "\" is missing (the config says layer " +
                           std::to_string(c->first_dense) + " is a MoE layer)");
  }
  if (loc->tensor->dtype != DType::kU8) {
    return Status::Invalid(
        loc->shard->path + ": tensor \"" + probe + "\" is " + DTypeName(loc->tensor->dtype) +
        ": routed experts are not MXFP4, and prepared format version 1 stores only MXFP4 "
        "experts; this checkpoint cannot be packed");
  }
  c->experts_mxfp4 = true;
  c->mxfp4_group_size = kMxfp4GroupSize;
  return ValidateMxfp4Dims(*c, config_path + " (experts are U8, so MXFP4)");
}

// A file of whole tensors (resident.bin, vision.bin): one unit per tensor, its padding
// included. `regions` are appended to plan->regions (they may already be there: `base` is the
// index of the first).
template <typename PieceFor>
void PlanTensorFile(Plan* plan, const std::vector<prepared::Region>& regions, size_t base,
                    uint64_t size, std::string path, std::string label,
                    const PieceFor& piece_for) {
  Stream file;
  file.final_path = std::move(path);
  file.size = size;
  file.label = std::move(label);
  for (size_t i = 0; i < regions.size(); ++i) {
    const int32_t id = static_cast<int32_t>(base + i);
    Unit u;
    u.stream = plan->streams.size();
    u.begin = regions[i].offset;
    u.end = i + 1 < regions.size() ? regions[i + 1].offset : size;
    u.regions.push_back(id);
    file.pieces.push_back(piece_for(id));
    file.units.push_back(plan->units.size());
    plan->units.push_back(std::move(u));
  }
  plan->streams.push_back(std::move(file));
}

// The vision part: carried when config.json has a vision_config (and not --no-vision); then
// every vision tensor must be in the checkpoint with the config's shapes.
Status ResolveVision(Env* env, const PackOptions& o, const st::CheckpointIndex& index,
                     const std::string& config_path, Plan* plan) {
  if (!o.vision) return Status::Ok();
  K3_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(env, config_path, kMaxConfigBytes));
  K3_ASSIGN_OR_RETURN(plan->vision, ParseVisionConfig(text, config_path));
  if (!plan->vision) return Status::Ok();
  if (plan->vision->text_hidden != plan->config.hidden) {
    return Status::Invalid(config_path + ": vision_config.text_hidden_size " +
                           std::to_string(plan->vision->text_hidden) +
                           " differs from hidden_size " + std::to_string(plan->config.hidden));
  }
  Result<prepared::VisionLayout> layout =
      prepared::BuildVisionLayout(*plan->vision, prepared::TensorsOf(index));
  if (!layout.ok()) {
    return Status::Invalid(o.model_dir + ": " + layout.status().message() +
                           " (pack --no-vision makes a text-only directory)");
  }
  plan->vision_layout = std::move(layout).value();
  return Status::Ok();
}

// Trunk: one unit per layer run; resident: one unit per tensor (its padding included).
void PlanTensors(const st::CheckpointIndex& index, Plan* plan,
                 const std::map<std::string, uint32_t>& src_ids, const std::string& out) {
  const prepared::Layout& layout = plan->layout;
  for (const prepared::Region& r : layout.trunk) plan->regions.push_back(r);
  for (const prepared::Region& r : layout.resident) plan->regions.push_back(r);

  auto piece_for = [&](int32_t region_id) {
    const prepared::Region& r = plan->regions[static_cast<size_t>(region_id)];
    const st::CheckpointIndex::Location* loc = index.Find(r.name);
    Piece p;
    p.src = src_ids.at(loc->shard->path);
    p.src_off = loc->file_offset();
    p.len = r.length;
    p.dst = r.offset;
    p.region = region_id;
    return p;
  };

  Stream trunk;
  trunk.final_path = JoinPath(out, std::string(prepared::kTrunkFile));
  trunk.size = layout.trunk_bytes;
  trunk.label = "trunk";
  size_t next = 0;
  for (const prepared::TrunkRun& run : layout.runs) {
    Unit u;
    u.stream = plan->streams.size();
    u.begin = run.offset;
    u.end = run.offset + run.length;
    u.layer = run.layer;
    for (; next < layout.trunk.size() && layout.trunk[next].offset < u.end; ++next) {
      u.regions.push_back(static_cast<int32_t>(next));
      trunk.pieces.push_back(piece_for(static_cast<int32_t>(next)));
    }
    trunk.units.push_back(plan->units.size());
    plan->units.push_back(std::move(u));
  }
  plan->streams.push_back(std::move(trunk));

  PlanTensorFile(plan, layout.resident, layout.trunk.size(), layout.resident_bytes,
                 JoinPath(out, std::string(prepared::kResidentFile)), "resident", piece_for);
  if (plan->vision) {
    // vision.bin: its regions after trunk and resident in plan->regions (manifest order).
    const prepared::VisionLayout& v = plan->vision_layout;
    const size_t base = plan->regions.size();
    plan->regions.insert(plan->regions.end(), v.regions.begin(), v.regions.end());
    PlanTensorFile(plan, v.regions, base, v.bytes,
                   JoinPath(out, std::string(prepared::kVisionFile)), "vision", piece_for);
  }
}

// Link mode: records point into the shards; each expert must be one canonical run.
Status PlanLinkExperts(const st::CheckpointIndex& index, Plan* plan,
                       const std::map<std::string, uint32_t>& src_ids) {
  const ModelConfig& c = plan->config;
  const auto sub_sizes = prepared::ExpertSubSizes(c);
  std::map<std::string, uint32_t> file_ids;
  Stream link;
  link.label = "experts (hash)";
  uint64_t dst = 0;
  for (int layer = c.first_dense; layer < c.n_layers; ++layer) {
    for (int e = 0; e < c.n_experts; ++e) {
      const st::CheckpointIndex::Location* first = index.Find(prepared::ExpertTensorName(layer, e, 0));
      for (int s = 1; s < prepared::kExpertSubCount; ++s) {
        const st::CheckpointIndex::Location* prev = index.Find(prepared::ExpertTensorName(layer, e, s - 1));
        const st::CheckpointIndex::Location* cur = index.Find(prepared::ExpertTensorName(layer, e, s));
        if (cur->shard != first->shard || cur->tensor->begin != prev->tensor->end) {
          return Status::Invalid(
              "link mode: layer " + std::to_string(layer) + " expert " + std::to_string(e) +
              ": its six tensors are not one contiguous run in canonical order (\"" +
              cur->tensor->name + "\" in " + cur->shard->name + " at data offset " +
              std::to_string(cur->tensor->begin) + " does not directly follow \"" +
              prev->tensor->name + "\" in " + prev->shard->name + ", which ends at " +
              std::to_string(prev->tensor->end) +
              "); k3run reads an expert with one read, so use --experts copy");
        }
      }
      auto [it, added] = file_ids.emplace(first->shard->name,
                                          static_cast<uint32_t>(plan->expert_files.size()));
      if (added) {
        plan->expert_files.push_back(prepared::FileEntry{first->shard->name, first->shard->header.file_size});
      }
      const uint64_t rec = prepared::ExpertRecordIndex(c, layer, e);
      plan->records[rec] = prepared::MakeExpertRecord(it->second, first->file_offset(), sub_sizes, 0);
      Piece p;
      p.src = src_ids.at(first->shard->path);
      p.src_off = first->file_offset();
      p.len = plan->expert_bytes;
      p.dst = dst;
      p.expert = static_cast<int32_t>(rec);
      link.pieces.push_back(p);
      Unit u;
      u.stream = plan->streams.size();
      u.begin = dst;
      u.end = dst + plan->expert_bytes;
      u.layer = layer;
      u.experts.push_back(static_cast<int32_t>(rec));
      link.units.push_back(plan->units.size());
      plan->units.push_back(std::move(u));
      dst += plan->expert_bytes;
    }
  }
  link.size = dst;
  plan->streams.push_back(std::move(link));
  return Status::Ok();
}

// Copy mode: PlanCopyExperts decides placement; each expert (with its padding) is a unit.
void PlanCopyExpertStreams(const st::CheckpointIndex& index, Plan* plan,
                           const std::map<std::string, uint32_t>& src_ids,
                           const std::vector<std::string>& stripe_dirs, const std::string& out) {
  const ModelConfig& c = plan->config;
  const prepared::ExpertPlan ep = prepared::PlanCopyExperts(c, stripe_dirs);
  PlaceCopyExperts(c, ep, &plan->expert_files, &plan->records);
  const size_t first_stream = plan->streams.size();
  for (size_t f = 0; f < ep.files.size(); ++f) {
    Stream s;
    s.final_path = stripe_dirs.empty() ? JoinPath(out, ep.files[f]) : ep.files[f];
    s.size = ep.file_sizes[f];
    plan->streams.push_back(std::move(s));
  }
  for (int layer = c.first_dense; layer < c.n_layers; ++layer) {
    for (int e = 0; e < c.n_experts; ++e) {
      const uint64_t rec = prepared::ExpertRecordIndex(c, layer, e);
      const prepared::ExpertSlot& slot = ep.slots[rec];
      Stream& s = plan->streams[first_stream + slot.file_id];
      s.label = "experts";
      uint64_t dst = slot.offset;
      for (int sub = 0; sub < prepared::kExpertSubCount; ++sub) {
        const st::CheckpointIndex::Location* loc = index.Find(prepared::ExpertTensorName(layer, e, sub));
        Piece p;
        p.src = src_ids.at(loc->shard->path);
        p.src_off = loc->file_offset();
        p.len = loc->tensor->nbytes();
        p.dst = dst;
        p.expert = static_cast<int32_t>(rec);
        s.pieces.push_back(p);
        dst += p.len;
      }
      Unit u;
      u.stream = first_stream + slot.file_id;
      u.begin = slot.offset;
      u.end = AlignUp(dst, prepared::kExpertAlign);
      u.layer = layer;
      u.experts.push_back(static_cast<int32_t>(rec));
      s.units.push_back(plan->units.size());
      plan->units.push_back(std::move(u));
    }
  }
  // Experts of one file were appended in ascending e, which is ascending offset: already sorted.
}

Status LoadSourceInfo(Env* env, const PackOptions& o, const st::CheckpointIndex& index,
                      prepared::SourceInfo* source) {
  source->model_dir_given = o.model_dir;
  K3_ASSIGN_OR_RETURN(source->model_dir_abs, env->CanonicalPath(o.model_dir));
  const std::string dl_path = JoinPath(o.model_dir, std::string(dl::kFileName));
  std::optional<dl::DownloadManifest> dm;
  if (env->Exists(dl_path)) {
    Result<dl::DownloadManifest> r = dl::LoadDownloadManifest(env, dl_path);
    if (!r.ok()) {
      return r.status().WithContext("reading the download manifest (fix or remove it; pack "
                                    "takes shard SHA-256 only from it)");
    }
    dm = std::move(r).value();
  }
  for (const auto& shard : index.shards()) {
    prepared::SourceShard s{shard->name, shard->header.file_size, ""};
    if (dm) {
      if (const dl::DownloadFile* f = dm->Find(shard->name)) {
        if (f->size != s.size) {
          return Status::Integrity(shard->path + ": shard is " + std::to_string(s.size) +
                                   " bytes, but " + dl_path + " records " +
                                   std::to_string(f->size) +
                                   " as downloaded and verified; run k3verify shards " +
                                   o.model_dir + " or download it again");
        }
        s.sha256 = f->sha256;
      }
    }
    source->shards.push_back(std::move(s));
  }
  return Status::Ok();
}

}  // namespace

void PlaceCopyExperts(const ModelConfig& c, const prepared::ExpertPlan& ep,
                      std::vector<prepared::FileEntry>* files,
                      std::vector<prepared::ExpertRecord>* records) {
  const auto sub_sizes = prepared::ExpertSubSizes(c);
  for (size_t f = 0; f < ep.files.size(); ++f) {
    files->push_back(prepared::FileEntry{ep.files[f], ep.file_sizes[f]});
  }
  records->resize(ep.slots.size());
  for (size_t rec = 0; rec < ep.slots.size(); ++rec) {
    const prepared::ExpertSlot& slot = ep.slots[rec];
    (*records)[rec] = prepared::MakeExpertRecord(slot.file_id, slot.offset, sub_sizes, 0);
  }
}

Result<Plan> MakePlan(Env* env, const PackOptions& o, const std::vector<std::string>& stripe_abs) {
  if (!env->IsDirectory(o.model_dir)) {
    return Status::Invalid(o.model_dir + ": MODEL_DIR is not a directory");
  }
  const std::string config_path = JoinPath(o.model_dir, "config.json");
  if (!env->Exists(config_path)) {
    return Status::Invalid(config_path +
                           ": missing; a checkpoint directory needs its config.json (nested "
                           "released shape or flat fixture shape) next to the shards");
  }
  Plan plan;
  K3_ASSIGN_OR_RETURN(plan.config, LoadModelConfig(env, config_path));
  K3_ASSIGN_OR_RETURN(st::CheckpointIndex index, st::CheckpointIndex::Open(env, o.model_dir));
  if (index.shards().empty()) {
    return Status::Invalid(o.model_dir + ": no *.safetensors shards found");
  }
  K3_RETURN_IF_ERROR(ResolveExpertsMxfp4(index, config_path, &plan.config));
  Result<prepared::Layout> layout = prepared::BuildLayout(plan.config, prepared::TensorsOf(index));
  if (!layout.ok()) return layout.status().WithContext(o.model_dir);
  plan.layout = std::move(layout).value();
  K3_RETURN_IF_ERROR(ResolveVision(env, o, index, config_path, &plan));
  plan.expert_bytes = prepared::ExpertBytes(plan.config);
  plan.records.resize(static_cast<size_t>(plan.config.n_moe_layers()) *
                      static_cast<size_t>(plan.config.n_experts));
  plan.expert_hashed.assign(plan.records.size(), false);

  std::map<std::string, uint32_t> src_ids;
  for (const auto& shard : index.shards()) {
    src_ids.emplace(shard->path, static_cast<uint32_t>(plan.sources.size()));
    plan.sources.push_back(shard->path);
    plan.source_sizes.push_back(shard->header.file_size);
  }
  PlanTensors(index, &plan, src_ids, o.out);
  if (o.experts == prepared::ExpertsMode::kLink) {
    K3_RETURN_IF_ERROR(PlanLinkExperts(index, &plan, src_ids));
  } else {
    PlanCopyExpertStreams(index, &plan, src_ids, stripe_abs, o.out);
  }
  K3_RETURN_IF_ERROR(LoadSourceInfo(env, o, index, &plan.source));
  for (const char* name : {"tiktoken.model", "tokenizer_config.json"}) {
    if (env->Exists(JoinPath(o.model_dir, name))) plan.tokenizer_files.push_back(name);
  }
  return plan;
}

std::vector<Window> MakeWindows(const Plan& plan, uint64_t window_bytes) {
  std::vector<Window> out;
  for (size_t si = 0; si < plan.streams.size(); ++si) {
    const Stream& s = plan.streams[si];
    size_t pi = 0;
    size_t uk = 0;
    while (uk < s.units.size()) {
      if (plan.units[s.units[uk]].reused) {
        ++uk;
        continue;
      }
      // A maximal run of units to (re)do: [a, b).
      const uint64_t a = plan.units[s.units[uk]].begin;
      size_t last = uk;
      while (last + 1 < s.units.size() && !plan.units[s.units[last + 1]].reused) ++last;
      const uint64_t b = plan.units[s.units[last]].end;
      for (uint64_t ws = a; ws < b;) {
        const uint64_t we = std::min(b, ws + window_bytes);
        Window w;
        w.stream = si;
        w.begin = ws;
        w.end = we;
        uint64_t pos = ws;
        while (pi < s.pieces.size() && s.pieces[pi].dst + s.pieces[pi].len <= pos) ++pi;
        while (pos < we) {
          while (plan.units[s.units[uk]].end <= pos) ++uk;
          const uint64_t unit_end = plan.units[s.units[uk]].end;
          if (pi < s.pieces.size() && s.pieces[pi].dst <= pos) {
            const Piece& p = s.pieces[pi];
            const uint64_t end = std::min({p.dst + p.len, we, unit_end});
            w.segs.push_back(Seg{pos, end - pos, static_cast<int64_t>(pi)});
            pos = end;
            if (pos == p.dst + p.len) ++pi;
          } else {
            uint64_t end = std::min(we, unit_end);
            if (pi < s.pieces.size()) end = std::min(end, s.pieces[pi].dst);
            w.segs.push_back(Seg{pos, end - pos, -1});
            pos = end;
          }
        }
        out.push_back(std::move(w));
        ws = we;
      }
      uk = last + 1;
    }
  }
  return out;
}


}  // namespace k3::prep::pack_internal
