// The prepared directory's byte layout (format version 1, DESIGN.md §5, docs/FORMATS.md):
// alignment constants, file names, the canonical tensor order of a trunk layer run and of
// resident.bin, the expected shape of every tensor given the config, and offset computation.
//
// Goals: ONE function (BuildLayout) decides where every non-expert tensor goes. k3prep pack
// calls it to write; k3verify/k3run call it again on the tensors a manifest lists and compare
// ("recompute, never trust"). The order inside a run is fixed by the format (a role list in
// prepared_layout.cpp, documented in docs/FORMATS.md), never by shard order, so two checkpoints
// with the same tensors always pack to the same bytes. Expert placement for copy mode
// (PlanCopyExperts) lives here too, for the same reason.
// Non-goals: reading or writing bytes (pack does that through Env), the k3.json schema
// (prepared_manifest.h), the experts.idx encoding (experts_index.h).
// Evolution: changing any constant, name or order below is a new format version.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/align.h"
#include "common/hash.h"
#include "common/status.h"
#include "formats/config.h"
#include "formats/dtype.h"

namespace k3::st {
class CheckpointIndex;
}

namespace k3::prepared {

// --- Alignment, each with its reason -------------------------------------------------------
// Trunk runs start and end on 4096: a run is read whole with O_DIRECT, whose offset/length
// alignment is the logical block size (≤ 4096 on every NVMe we target), and 4096 is the page
// size, so a pinned run can be read straight into page-aligned memory.
inline constexpr uint64_t kRunAlign = 4096;
// Tensors inside a run start on 64: one cache line, and the widest vector load (AVX-512), so
// kernels can use aligned loads on a tensor's first row.
inline constexpr uint64_t kTensorAlign = 64;
// resident.bin tensors start on 4096 so embed rows / lm_head chunks can be read with O_DIRECT.
inline constexpr uint64_t kResidentAlign = 4096;
// Copy-mode experts start on 4096: each expert is one O_DIRECT read with no widening.
inline constexpr uint64_t kExpertAlign = 4096;

// --- Bounds ----------------------------------------------------------------------------------
// Every byte size and offset in a prepared directory (k3.json file sizes, offsets, lengths, shape
// dimensions; experts.idx offsets and lengths; the files BuildLayout computes) is at most 2^50
// (1 PiB): ~10,000x the released trunk.bin (109 GB), ~700x the whole released checkpoint, and far
// from 2^64, so sums of a few of them never overflow. Values above it are refused naming the
// field, before anything is allocated or looped over from them.
inline constexpr uint64_t kMaxFileBytes = uint64_t{1} << 50;

// --- Names -----------------------------------------------------------------------------------
inline constexpr std::string_view kSumFile = "k3.sum";
inline constexpr std::string_view kManifestFile = "k3.json";
inline constexpr std::string_view kTrunkFile = "trunk.bin";
inline constexpr std::string_view kResidentFile = "resident.bin";
inline constexpr std::string_view kExpertsIndexFile = "experts.idx";
inline constexpr std::string_view kExpertsDir = "experts";
inline constexpr std::string_view kTokenizerDir = "tokenizer";

inline constexpr std::string_view kModelPrefix = "language_model.model.";
inline constexpr std::string_view kLmHeadName = "language_model.lm_head.weight";

// "language_model.model.layers.<L>."
std::string LayerPrefix(int layer);

// The six tensors of one routed expert, in canonical (on-disk) order.
inline constexpr int kExpertSubCount = 6;
inline constexpr std::array<std::string_view, kExpertSubCount> kExpertSubNames = {
    "w1.weight_packed", "w1.weight_scale", "w2.weight_packed",
    "w2.weight_scale",  "w3.weight_packed", "w3.weight_scale"};
// "language_model.model.layers.<L>.block_sparse_moe.experts.<e>.<sub name>"
std::string ExpertTensorName(int layer, int expert, int sub);

// --- Tensors ---------------------------------------------------------------------------------
struct TensorSpec {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;
  uint64_t nbytes() const;  // numel × dtype size; UINT64_MAX when that overflows
};

// Every tensor of a checkpoint (from its shard headers), in CheckpointIndex::All() order.
std::vector<TensorSpec> TensorsOf(const st::CheckpointIndex& index);

// A byte range of a prepared file. Tensor regions carry the tensor's dtype and shape; whole-file
// regions (experts.idx, tokenizer files) are dtype U8 with shape [length].
struct Region {
  std::string name;  // tensor name, "experts.idx" or "tokenizer/<file>"
  std::string file;  // path relative to the prepared directory
  uint64_t offset = 0;
  uint64_t length = 0;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;
  Hash128 xxh3_128;  // of the `length` bytes; filled by pack, zero in a fresh layout
};

struct TrunkRun {
  int layer = 0;
  uint64_t offset = 0;  // multiple of kRunAlign
  uint64_t length = 0;  // padded: multiple of kRunAlign
};

struct Layout {
  std::vector<Region> trunk;     // trunk.bin, file order (= run order, canonical order inside)
  std::vector<TrunkRun> runs;    // one per layer, layer order
  std::vector<Region> resident;  // resident.bin, file order
  uint64_t trunk_bytes = 0;      // trunk.bin size
  uint64_t resident_bytes = 0;   // resident.bin size
};

// What the format expects of one non-expert tensor.
struct ExpectedTensor {
  std::string name;
  // Accepted shapes (the first is the released one); empty with min_len > 0 means "rank 1 with
  // at least min_len elements" (A_log ships zero-padded to head_dim).
  std::vector<std::vector<uint64_t>> shapes;
  uint64_t min_len = 0;
  // Present only for some configs (MLA g_proj without mla_use_output_gate, routed_expert_norm
  // without latent_moe_use_norm): packed when present, not required.
  bool optional = false;
};

// The non-expert tensors of layer L in canonical run order.
std::vector<ExpectedTensor> ExpectedLayerTensors(const ModelConfig& c, int layer);
// resident.bin's tensors in file order.
std::vector<ExpectedTensor> ExpectedResidentTensors(const ModelConfig& c);
// Shape of expert sub-tensor `sub` (MXFP4: packed [rows][cols/2], scale [rows][cols/32];
// w1/w3 [moe_inter][latent], w2 [latent][moe_inter]).
std::vector<uint64_t> ExpertSubShape(const ModelConfig& c, int sub);
// Byte sizes of the six sub-tensors, canonical order.
std::array<uint64_t, kExpertSubCount> ExpertSubSizes(const ModelConfig& c);
uint64_t ExpertBytes(const ModelConfig& c);

// What a checkpoint lacks of the tensors its config implies, one entry per incomplete unit (a
// layer, or the model-level tensors), in layer order. Expected: every non-optional tensor of
// ExpectedLayerTensors / ExpectedResidentTensors and, when the experts are MXFP4 (config, or U8
// expert tensors present), the six tensors of every routed expert. Names only: dtypes and shapes
// are BuildLayout's business. Used where no model.safetensors.index.json says what the shards
// must hold (k3verify shards), so a checkpoint missing whole shards cannot pass as complete.
// `c` comes from ParseModelConfig, whose bounds keep the name walk small.
struct MissingTensors {
  int layer = -1;         // zero-based; -1 for the model-level tensors
  uint64_t expected = 0;  // tensors the unit needs
  uint64_t missing = 0;
  std::string first;      // the first missing name, in canonical order
};
std::vector<MissingTensors> FindMissingTensors(const ModelConfig& c,
                                               const std::vector<TensorSpec>& tensors);

// Trunk and resident tensors accept BF16 or F32 (DESIGN.md §7: F32 checkpoints exist).
bool IsTrunkDType(DType t);

// Checks that `tensors` is exactly the set the config implies (every required non-expert
// tensor, every expert tensor of every MoE layer as U8 MXFP4, nothing else under
// "language_model."; other names such as vision tensors are ignored) with accepted dtypes and
// shapes, then places trunk and resident tensors. Failures are kInvalid listing up to 16
// problems, each naming the tensor, expected vs actual. Requires MXFP4 routed experts (format
// version 1): latent and moe_inter multiples of the group size. With require_experts false
// (re-validating a manifest, whose experts live in experts.idx) expert tensors are not looked for.
Result<Layout> BuildLayout(const ModelConfig& c, const std::vector<TensorSpec>& tensors,
                           bool require_experts = true);

// --- Copy-mode expert placement ---------------------------------------------------------------
struct ExpertSlot {
  uint32_t file_id = 0;
  uint64_t offset = 0;  // multiple of kExpertAlign
};
struct ExpertPlan {
  // Expert files, indexed by file_id (the experts.idx path table). Without stripe dirs:
  // "experts/layer-LLL.bin", relative to the prepared directory; with stripe dirs:
  // "<dir>/layer-LLL.bin" with the dir as given (pack passes absolute dirs).
  std::vector<std::string> files;
  std::vector<uint64_t> file_sizes;  // last expert's end rounded up to kExpertAlign
  // Indexed by record index (L − first_dense) · n_experts + e.
  std::vector<ExpertSlot> slots;
};
// One file per (MoE layer, disk). Expert e of layer L goes to disk (L·n_experts + e) mod n_disks;
// inside a file experts are in ascending e, each at the previous end rounded up to kExpertAlign.
ExpertPlan PlanCopyExperts(const ModelConfig& c, const std::vector<std::string>& stripe_dirs);
// A share's experts (k3prep split, formats/expert_share.h): copy mode without stripe dirs, for
// experts [begin, end) of every MoE layer only, so each experts/layer-LLL.bin holds just those,
// back to back on kExpertAlign. The other experts' slots are zero and unused (their records are
// absent). PlanShareExperts(c, 0, n_experts) is PlanCopyExperts(c, {}).
ExpertPlan PlanShareExperts(const ModelConfig& c, int begin, int end);

// Record index of (layer, expert): (L − first_dense) · n_experts + e.
inline uint64_t ExpertRecordIndex(const ModelConfig& c, int layer, int expert) {
  return static_cast<uint64_t>(layer - c.first_dense) * static_cast<uint64_t>(c.n_experts) +
         static_cast<uint64_t>(expert);
}

}  // namespace k3::prepared
