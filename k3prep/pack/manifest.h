// The k3.json a pack writes, from the parts that follow from the config and the checkpoint's
// tensor list alone (the layout, the copy-mode expert placement, experts.idx), so that a pack
// and a prepared directory built in memory (PreparedForTensors) cannot disagree.
//
// Goals: RunPack and PreparedForTensors assemble the manifest and experts.idx with the same
// functions; the in-memory directory is what `k3prep pack --experts copy` writes for a checkpoint
// with these tensors, except the hashes (regions and experts are zero; no byte is read), the
// source (no shards) and the tokenizer (none).
// Non-goals: reading or writing bytes (pack.h), the layout rules (formats/prepared_layout.h).
// Thread safety: plain functions.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "formats/config.h"
#include "formats/experts_index.h"
#include "formats/prepared_layout.h"
#include "formats/prepared_manifest.h"

namespace k3::prep {

// What k3.json lists besides the config, the source and the experts mode.
struct ManifestParts {
  const prepared::Layout* layout = nullptr;                    // runs, file sizes
  const std::vector<prepared::Region>* regions = nullptr;      // trunk then resident
  const std::vector<prepared::FileEntry>* expert_files = nullptr;  // experts.idx path table
  std::vector<prepared::Region> small_regions;                 // experts.idx, tokenizer files
  std::vector<prepared::FileEntry> small_files;                // the same files
  std::optional<VisionConfig> vision;                          // with vision.bin (its regions are
  uint64_t vision_bytes = 0;                                   // in `regions`, after resident)
};

// experts.idx of a pack: header fields from the config, the path table, the records.
prepared::ExpertsIndex MakeExpertsIndex(const ModelConfig& c,
                                        const std::vector<prepared::FileEntry>& expert_files,
                                        const std::vector<prepared::ExpertRecord>& records);

// k3.json of a pack, validated (ValidateManifest).
Result<prepared::Manifest> AssembleManifest(const ModelConfig& c,
                                            const prepared::SourceInfo& source,
                                            prepared::ExpertsMode mode, const ManifestParts& parts);

// The prepared directory `k3prep pack --experts copy` makes of a checkpoint of config `c` with
// these tensors, built in memory (see above). `label` stands for the directory in messages.
// kInvalid as BuildLayout when the tensors are not the set the config implies.
Result<prepared::PreparedDir> PreparedForTensors(const ModelConfig& c,
                                                 const std::vector<prepared::TensorSpec>& tensors,
                                                 const std::string& label);

}  // namespace k3::prep
