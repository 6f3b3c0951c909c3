// The layout of a synthetic checkpoint: every tensor's name, dtype, shape, initialiser, shard and
// byte range, and every shard's name and size. Computed once, here, and used by both
// `--dry-run` (layout.json) and the writer, so the two can never disagree.
//
// Placement (DESIGN.md §8, as released): one shard per layer holding that layer's trunk tensors
// (contiguous), then its experts 0..n−1, each expert's six tensors contiguous in canonical order
// (w1.packed, w1.scale, w2.packed, w2.scale, w3.packed, w3.scale); then one shard with the
// model-level tensors (embed_tokens, lm_head, norm, output_attn_res_norm, output_attn_res_proj).
// That is n_layers + 1 "units", + 2 with vision (the projector, then the tower, as released).
// `--shards N` (1 ≤ N ≤ units) packs consecutive units into N shards, unit u going to shard
// ⌊u·N / units⌋, so the last units share a shard unless N = units (the default).
// Shard names: model-%05d-of-%06d.safetensors, one-based, as released.
//
// Thread safety: a Layout is immutable after BuildLayout; share it freely.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/status.h"
#include "formats/config.h"
#include "formats/dtype.h"
#include "formats/vision_config.h"

namespace k3::synth {

// --small-dtype: the dtype of every small vector (norm gains, attention-residual vectors,
// A_log, dt_bias, conv taps, o_norm, e_score_correction_bias). kMixed is the release's plan:
// F32 for A_log, dt_bias, conv taps, o_norm and e_score_correction_bias, BF16 for the rest.
enum class SmallDType { kMixed, kBF16, kF32 };
// "mixed" | "bf16" | "f32"; false otherwise.
bool ParseSmallDType(const std::string& text, SmallDType* out);
const char* SmallDTypeName(SmallDType t);

// How a tensor's values are drawn (synth_weights implements each).
enum class InitKind : uint8_t {
  kNormal,    // N(0, a²) (approximately normal, see k3prep/synth/weights.h)
  kGain,      // 1 + a·N(0, 1): norm gains near 1
  kLinspace,  // a .. b evenly over the first `count` elements, zeros after (A_log padding)
  kMxfp4,     // MXFP4 packed/scale of an N(0, a²) matrix; the six tensors of an expert together
};

struct Init {
  InitKind kind = InitKind::kNormal;
  float a = 0;
  float b = 0;
  int64_t count = 0;
};

// What part of a routed expert a tensor is (kNone for every other tensor).
enum class ExpertPart : uint8_t { kNone, kW1Packed, kW1Scale, kW2Packed, kW2Scale, kW3Packed,
                                  kW3Scale };

struct TensorPlan {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<uint64_t> shape;
  uint64_t nbytes = 0;
  uint64_t begin = 0;  // offset in the shard's data section (safetensors "data_offsets"[0])
  uint32_t shard = 0;  // index into Layout::shards
  int32_t layer = -1;  // zero-based layer, −1 for model-level and vision tensors
  int32_t expert = -1;
  ExpertPart part = ExpertPart::kNone;
  Init init;
};

struct ShardPlan {
  std::string name;
  size_t first_tensor = 0;  // tensors[first_tensor, first_tensor + tensor_count) in file order
  size_t tensor_count = 0;
  uint64_t data_bytes = 0;
  uint64_t file_size = 0;    // header included (from st::Writer::FileSize)
  uint64_t data_offset = 0;  // file offset of the data section = file_size − data_bytes
  int first_unit = 0;        // units are layers 0..n_layers−1, then n_layers = model-level,
                             // then (with vision) the projector and the tower
  int last_unit = 0;
};

struct Layout {
  ModelConfig config;
  std::optional<VisionConfig> vision;  // absent: a text-only checkpoint (--no-vision)
  SmallDType small = SmallDType::kMixed;
  std::vector<TensorPlan> tensors;  // file order: shard by shard, data order
  std::vector<ShardPlan> shards;
  uint64_t total_tensor_bytes = 0;  // index metadata.total_size
  uint64_t total_file_bytes = 0;
  // Breakdown (bytes): every non-expert tensor of a layer; routed experts; embed + lm_head.
  uint64_t trunk_bytes = 0;
  uint64_t expert_bytes = 0;
  uint64_t expert_count = 0;
  uint64_t bytes_per_expert = 0;
  uint64_t embed_lm_head_bytes = 0;
  uint64_t vision_bytes = 0;  // the tower and the projector
};

// Computes the layout. `vision` adds the release's two vision units after the model-level one:
// the projector (mm_projector.*, the release's shard 95) and the tower (vision_tower.*, shard
// 96), so the default is n_layers + 3 shards, 96 for the full preset. `shards` = 0 means one per
// unit. `env` is only used to size shard
// headers through st::Writer (nothing is written). kInvalid naming --shards when out of range.
Result<Layout> BuildLayout(Env* env, const ModelConfig& config, SmallDType small, int shards,
                           const VisionConfig* vision = nullptr);

// The canonical tensor name prefix of layer L: "language_model.model.layers.L.".
std::string LayerPrefix(int layer);

}  // namespace k3::synth
