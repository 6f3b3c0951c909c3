// The vision part of a K3 checkpoint: config.json's "vision_config" (the MoonViT-V2 tower and
// the projector), and the tensors it implies, in one canonical order.
//
// Goals: one place that knows the released vision keys and tensor names (spec/VISION-AND-TOOLS.md),
// so synth writes, pack places, k3verify audits and k3run loads the same set; every rule the
// engine relies on checked on read, with the key named.
// Non-goals: video (init_pos_emb_time is read for the record, never used: images have t = 1),
// the tower math (k3run/vision), image preprocessing constants other than the patch size.
// Evolution: a new key the engine reads is a new required key; the canonical JSON gains it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "formats/dtype.h"

namespace k3 {

// Upper bounds on the vision keys (the released value times a generous factor, as for the text
// config): every vision tensor stays far below 2^40 bytes.
inline constexpr int kMaxVisionWidth = 65536;   // hidden, intermediate, qkv, text hidden; release ≤ 7,168
inline constexpr int kMaxVisionLayers = 1024;   // release 27
inline constexpr int kMaxVisionHeads = 1024;    // release 12
inline constexpr int kMaxPosGrid = 4096;        // init_pos_emb_height/width; release 64
// The one patch size and merge the preprocessing and the tower support (the release's).
inline constexpr int kVisionPatch = 14;
inline constexpr int kVisionMerge = 2;

struct VisionConfig {
  int hidden = 0;        // vt_hidden_size (= mm_hidden_size)
  int inter = 0;         // vt_intermediate_size
  int heads = 0;         // vt_num_attention_heads
  int layers = 0;        // vt_num_hidden_layers
  int qkv = 0;           // qkv_hidden_size: heads × head_dim (the release: 12 × 128 = 1536)
  int pos_h = 0;         // init_pos_emb_height
  int pos_w = 0;         // init_pos_emb_width
  int pos_t = 0;         // init_pos_emb_time (video only; not used for images)
  int patch = kVisionPatch;  // patch_size
  int merge = kVisionMerge;  // merge_kernel_size [m, m]
  int text_hidden = 0;   // text_hidden_size: the projector's output width (the text model's hidden)
  float projector_eps = 0;  // projector_ln_eps (mm_projector.post_norm)

  int head_dim() const { return qkv / heads; }
  int merged() const { return hidden * merge * merge; }  // the projector's input width
  // The released vision_config (for --preset full and the tests).
  static VisionConfig Released();

  friend bool operator==(const VisionConfig&, const VisionConfig&) = default;
};

// config.json's root "vision_config": nullopt when the key is absent (a text-only checkpoint).
// Every missing key and broken rule is reported at once (kInvalid naming `source` and the key):
// integer keys whole numbers within bounds; heads divides qkv and the head dim is a multiple of
// 4 (the 2-D RoPE's two frequency sets); patch_size 14 and merge_kernel_size [2, 2] (the only
// values this engine implements); mm_hidden_size == vt_hidden_size; the released activation,
// norm and projector types (gelu_pytorch_tanh, rmsnorm, patchmergerv2, gelu) since others would
// be computed wrongly.
Result<std::optional<VisionConfig>> ParseVisionConfig(std::string_view json_text,
                                                      const std::string& source);
// The same, from the flat canonical object of a prepared manifest (CanonicalVisionConfigJson).
Result<VisionConfig> ParseCanonicalVisionConfig(std::string_view json_text,
                                                const std::string& source);
// Flat, keys sorted, floats with round-trip precision: identical configs give identical bytes.
std::string CanonicalVisionConfigJson(const VisionConfig& v);
// The released "vision_config" object's text (every key the release has), for synthetic
// checkpoints; ParseVisionConfig of a config.json holding it gives back `v`.
std::string ReleasedVisionConfigJson(const VisionConfig& v);

// The vision tensors in canonical order: the tower (patch embed, position grid, blocks 0..N−1
// each norm0, norm1, wqkv, wo, mlp.fc0, mlp.fc1; final norm), then the projector (proj.0,
// proj.2, post_norm). All BF16 in the release; BF16 or F32 accepted on read.
enum class VisionPart : uint8_t { kTower, kProjector };
struct VisionTensor {
  std::string name;
  std::vector<uint64_t> shape;
  VisionPart part = VisionPart::kTower;
  int block = -1;  // encoder block, −1 outside the blocks
};
std::vector<VisionTensor> VisionTensors(const VisionConfig& v);
// Names outside the language model that belong to the vision part ("vision_tower." or
// "mm_projector.").
bool IsVisionTensorName(std::string_view name);
// Tensor bytes of the vision part at 2 bytes an element (BF16).
uint64_t VisionBf16Bytes(const VisionConfig& v);

}  // namespace k3
