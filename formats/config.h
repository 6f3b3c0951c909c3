// The model configuration (config.json) of a K3 checkpoint: reader, validation, serialisation.
//
// Goals: reproduce the lookup of spec/MODEL.md §1 exactly (nested released shape or flat
// fixture shape; candidate objects text_config → linear_attn_config → root; primary key then
// alias), never substitute a default for a required key, report every missing key and every
// broken rule at once (Code::kInvalid), and serialise the
// resolved values canonically for the prepared manifest. Also writes config.json in the
// released nested shape (for synthetic checkpoints).
// Integers: an integer field must hold a whole number (128, or 128.0 since MODEL.md §1.2 reads
// numbers as doubles), never 128.5: MODEL.md's C truncation would turn a corrupted size into a
// silently different model, so a fraction is refused naming the key. Counts and sizes above the
// bounds below are refused too.
// Non-goals: the vision config (ignored), keys the engine does not read (max_position_embeddings
// among them: nothing is sized from it).
// Evolution: a new engine field is a new required key unless it has a real default; the
// canonical JSON gains the key (so old prepared manifests no longer match, by design).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/env.h"
#include "common/status.h"

namespace k3 {

// Limits of MODEL.md §1.5 and DESIGN.md §4, in one place.
inline constexpr size_t kMaxFullAttnLayers = 128;  // length of full_attn_layers
inline constexpr int kMaxTopK = 64;                // sizes fixed routing arrays
inline constexpr int kMxfp4GroupSize = 32;         // OCP MX: one E8M0 scale per 32 elements
inline constexpr uint64_t kMaxConfigBytes = 16 << 20;  // the release's config.json is 10 KB

// Upper bounds on every count and size read from config.json (docs/FORMATS.md "Bounds"). Each is
// the released value times a generous factor: large enough for any plausible successor model,
// small enough that nothing sized from a config (per-layer, per-expert and per-tensor work and
// allocations, products of dimensions) can run away: with these bounds every tensor a config
// implies is under 2^44 bytes and no product of dimensions is near 2^64.
inline constexpr int kMaxLayers = 4096;          // num_hidden_layers; release 93 (44x)
inline constexpr int kMaxExperts = 65536;        // num_experts; release 896 (73x)
inline constexpr int kMaxVocab = 1 << 22;        // vocab_size 4,194,304; release 163,840 (25x)
// hidden_size, q/kv lora ranks, routed_expert_hidden_size, moe_intermediate_size; release at
// most 7,168 (9x). Also keeps one MXFP4 expert sub-tensor (moe_inter x latent / 2 bytes) within
// the u32 sub_size of experts.idx.
inline constexpr int kMaxWidth = 65536;
inline constexpr int kMaxDenseInter = 1 << 18;   // intermediate_size 262,144; release 33,792 (7.7x)
inline constexpr int kMaxHeads = 4096;           // num_heads, num_attention_heads; release 96 (42x)
inline constexpr int kMaxHeadDim = 4096;         // head_dim, qk_nope/qk_rope/v_head; release ≤ 128 (32x)
inline constexpr int kMaxConvKernel = 256;       // short_conv_kernel_size; release 4 (64x)
inline constexpr int kMaxSharedExperts = 64;     // num_shared_experts; release 2 (32x)
// attn_res_block_size: a block longer than the deepest model allowed means the same as "one block".
inline constexpr int kMaxAttnResBlock = kMaxLayers;
// (num_hidden_layers − first_k_dense_replace) × num_experts, the routed experts of the model
// (records of experts.idx: at most 512 MiB of them); release 82,432 (50x).
inline constexpr int64_t kMaxRoutedExperts = int64_t{1} << 22;

struct ModelConfig {
  // Field names follow MODEL.md §1.3 ("engine field").
  int hidden = 0;          // hidden_size
  int n_layers = 0;        // num_hidden_layers
  int vocab = 0;           // vocab_size
  float rms_eps = 0;       // rms_norm_eps
  int kda_heads = 0;       // num_heads | kda_num_heads
  int kda_head_dim = 0;    // head_dim | kda_head_dim
  int conv_k = 0;          // short_conv_kernel_size
  float gate_lb = 0;       // gate_lower_bound
  int n_heads = 0;         // num_attention_heads (MLA)
  int q_lora = 0;          // q_lora_rank
  int kv_lora = 0;         // kv_lora_rank
  int qk_nope = 0;         // qk_nope_head_dim
  int qk_rope = 0;         // qk_rope_head_dim
  int v_head = 0;          // v_head_dim
  bool mla_out_gate = true;  // mla_use_output_gate (optional, default true)
  int n_experts = 0;       // num_experts
  int topk = 0;            // num_experts_per_token
  int n_shared = 0;        // num_shared_experts
  int latent = 0;          // routed_expert_hidden_size
  int moe_inter = 0;       // moe_intermediate_size
  float routed_scale = 0;  // routed_scaling_factor
  bool moe_renorm = true;  // moe_renormalize (optional, default true)
  bool latent_norm = true; // latent_moe_use_norm (optional, default true)
  int first_dense = 0;     // first_k_dense_replace
  int dense_inter = 0;     // intermediate_size
  int attn_res_block = 0;  // attn_res_block_size
  float situ_b1 = 0;       // activation_situ_beta | situ_beta
  float situ_b2 = 0;       // activation_situ_linear_beta | situ_linear_beta
  std::vector<int> full_attn_layers;  // ONE-based, as in the file

  // Routed experts are MXFP4 (a quantization_config is present); group size from
  // quantization_config.config_groups.group_0.weights.group_size (must be 32).
  bool experts_mxfp4 = false;
  int mxfp4_group_size = 32;

  // Token ids from the root (released) or text_config; -1 when absent. Not validated here.
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;
  int64_t pad_token_id = -1;
  int64_t media_placeholder_token_id = -1;

  // Layer-type decisions (MODEL.md §1.6), L zero-based.
  bool is_mla(int L) const;
  bool is_kda(int L) const { return !is_mla(L); }
  bool is_dense(int L) const { return L < first_dense; }
  bool is_boundary(int L) const { return L % attn_res_block == 0; }
  int n_moe_layers() const { return n_layers - first_dense; }

  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

// Parses config.json text. `source` names the file in messages. All missing keys (up to 32
// shown, then "... and N more") and every rule violation are reported in one kInvalid Status.
Result<ModelConfig> ParseModelConfig(std::string_view json_text, const std::string& source);
Result<ModelConfig> LoadModelConfig(Env* env, const std::string& path);

// The MXFP4 width rules (DESIGN.md §4): routed_expert_hidden_size and moe_intermediate_size
// multiples of the group size. ParseModelConfig applies it when quantization_config is
// present; callers that find expert tensors stored as U8 apply it too.
Status ValidateMxfp4Dims(const ModelConfig& c, const std::string& source);

// Canonical JSON of the resolved values: flat, keys sorted, integers as integers, floats with
// round-trip precision. Identical configs give identical bytes.
std::string CanonicalConfigJson(const ModelConfig& c);

// config.json in the released nested shape (text_config, text_config.linear_attn_config with
// full_attn_layers and kda_layers one-based, quantization_config with the MXFP4 group fields
// when experts_mxfp4), with every key the release has that the engine reads.
// Pretty-printed (indent 2), keys in the release's (alphabetical) order, newline-terminated.
std::string ReleasedConfigJson(const ModelConfig& c);
// The same with the root "vision_config" of `vision` (formats/vision_config.h) when not null.
struct VisionConfig;
std::string ReleasedConfigJson(const ModelConfig& c, const VisionConfig* vision);

// The double to hand a JSON writer for a float field: the shortest decimal that reads back as
// exactly `f` through the reader's path (parse as double, then (float)), so written configs
// say 1e-05 rather than 9.999999747378752e-06 and still round-trip bit for bit.
// Non-finite input is returned unchanged (writers of validated configs never see it).
double JsonNumberForFloat(float f);

}  // namespace k3
