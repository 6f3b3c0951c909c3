// k3.json and experts.idx of a pack, and the same built in memory (see k3prep/pack/manifest.h).
#include "k3prep/pack/manifest.h"

#include <utility>

#include "common/env.h"
#include "common/hash.h"
#include "k3prep/pack/output.h"
#include "k3prep/pack/plan.h"

namespace k3::prep {

prepared::ExpertsIndex MakeExpertsIndex(const ModelConfig& c,
                                        const std::vector<prepared::FileEntry>& expert_files,
                                        const std::vector<prepared::ExpertRecord>& records) {
  prepared::ExpertsIndex idx;
  idx.n_layers = static_cast<uint32_t>(c.n_layers);
  idx.first_moe_layer = static_cast<uint32_t>(c.first_dense);
  idx.n_experts = static_cast<uint32_t>(c.n_experts);
  for (const prepared::FileEntry& f : expert_files) idx.files.push_back(f.path);
  idx.records = records;
  return idx;
}

Result<prepared::Manifest> AssembleManifest(const ModelConfig& c,
                                            const prepared::SourceInfo& source,
                                            prepared::ExpertsMode mode,
                                            const ManifestParts& parts) {
  prepared::Manifest m;
  m.config = c;
  m.source = source;
  m.experts_mode = mode;
  m.files = {
      prepared::FileEntry{std::string(prepared::kTrunkFile), parts.layout->trunk_bytes},
      prepared::FileEntry{std::string(prepared::kResidentFile), parts.layout->resident_bytes}};
  if (parts.vision) {
    m.vision = parts.vision;
    m.files.push_back(prepared::FileEntry{std::string(prepared::kVisionFile), parts.vision_bytes});
  }
  m.files.insert(m.files.end(), parts.small_files.begin(), parts.small_files.end());
  m.expert_files = *parts.expert_files;
  m.runs = parts.layout->runs;
  m.regions = *parts.regions;
  m.regions.insert(m.regions.end(), parts.small_regions.begin(), parts.small_regions.end());
  K3_RETURN_IF_ERROR(prepared::ValidateManifest(m, "k3.json being written"));
  return m;
}

Result<prepared::PreparedDir> PreparedForTensors(const ModelConfig& c,
                                                 const std::vector<prepared::TensorSpec>& tensors,
                                                 const std::string& label) {
  Result<prepared::Layout> built = prepared::BuildLayout(c, tensors);
  if (!built.ok()) return built.status().WithContext(label);
  const prepared::Layout layout = std::move(built).value();
  // As MakePlan: trunk then resident regions, copy-mode experts without stripe directories.
  std::vector<prepared::Region> regions = layout.trunk;
  regions.insert(regions.end(), layout.resident.begin(), layout.resident.end());
  std::vector<prepared::FileEntry> expert_files;
  std::vector<prepared::ExpertRecord> records;
  pack_internal::PlaceCopyExperts(c, prepared::PlanCopyExperts(c, {}), &expert_files, &records);

  prepared::PreparedDir p;
  p.dir = label;
  p.experts = MakeExpertsIndex(c, expert_files, records);
  const std::string idx_name(prepared::kExpertsIndexFile);
  const std::string idx_bytes = prepared::EncodeExpertsIndex(p.experts);
  ManifestParts parts{&layout, &regions, &expert_files, {}, {}, {}, 0};
  parts.small_regions.push_back(pack_internal::WholeFileRegion(idx_name, idx_bytes));
  parts.small_files.push_back(prepared::FileEntry{idx_name, idx_bytes.size()});
  // No checkpoint and no shard; k3.json requires an absolute model_dir_abs, the root stands in.
  prepared::SourceInfo source;
  source.model_dir_abs = "/";
  source.model_dir_given = label;
  K3_ASSIGN_OR_RETURN(p.manifest,
                      AssembleManifest(c, source, prepared::ExpertsMode::kCopy, parts));
  K3_ASSIGN_OR_RETURN(const std::string text, prepared::RenderManifest(p.manifest));
  p.manifest_hash = Xxh3_128(text.data(), text.size());
  for (const std::string& f : p.experts.files) {
    p.expert_paths.push_back(prepared::ResolveExpertPath(p.manifest, label, f));
  }
  return p;
}

}  // namespace k3::prep
