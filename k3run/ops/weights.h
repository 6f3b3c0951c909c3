// The weights the operators read, as plain views: no ownership, no file I/O, no dtype policy.
//
// Goals: one struct per block of MODEL.md §2 whose fields say, in their comment, the PyTorch name,
// the shape ([out][in] for matrices, row-major) and who widened what. The loader (or a test) fills
// them from whatever owns the bytes (RAM, a trunk ring slot, an expert cache slot); the ops only
// read them, so the same op code serves resident, streamed and fixture weights.
// Non-goals: loading, dtype conversion of small vectors (the loader widens bf16 → fp32 exactly),
// lifetime management (the views must outlive the op call), expert caching.
//
// Matrices are kernels::Matrix (F32, BF16 or MXFP4, multiplied by k3run/kernels without ever being
// dequantised to memory). Small vectors are fp32 spans.
//
// Notation: E hidden, H kda_heads, D kda_head_dim, P = H·D, K conv_k; Hm MLA heads,
// qh = qk_nope + qk_rope, kvd = qk_nope + v_head; N experts, I moe_inter, Lt latent.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "common/status.h"
#include "k3run/kernels/matmul.h"

namespace k3::ops {

using kernels::Matrix;
using Vec = std::span<const float>;

// Upstream builds q_a_layernorm / kv_a_layernorm with the default eps 1e-6 (MODEL.md §3.1);
// the original engine and its fixtures used rms_norm_eps (1e-5). Production uses this constant.
inline constexpr float kUpstreamMlaLatentEps = 1e-6f;
// KDA's L2Norm epsilon (added to the sum of squares, not the mean).
inline constexpr double kL2NormEps = 1e-6;
// The router renormalisation guard of MODEL.md §3.6 step 4.
inline constexpr double kRouterRenormEps = 1e-20;
// Routing arrays are fixed-size (MODEL.md §1.5 rule 7).
inline constexpr int64_t kMaxTopK = 64;

// The dimensions and scalars the operators need. Field names equal ModelConfig's
// (formats/config.h) so the model maps them one to one; mla_latent_eps is not in config.json.
struct Dims {
  int64_t hidden = 0;          // E
  float rms_eps = 1e-5f;       // every RMSNorm except the MLA latent norms
  // KDA
  int64_t kda_heads = 0;       // H
  int64_t kda_head_dim = 0;    // D (= d_k = d_v)
  int64_t conv_k = 0;          // K, taps of the short causal conv
  float gate_lb = -5.0f;       // gate_lower_bound: g = lb·σ(u) ∈ (lb, 0]
  // MLA
  int64_t n_heads = 0;         // Hm
  int64_t q_lora = 0;
  int64_t kv_lora = 0;
  int64_t qk_nope = 0;
  int64_t qk_rope = 0;
  int64_t v_head = 0;
  bool mla_out_gate = true;
  float mla_latent_eps = kUpstreamMlaLatentEps;  // a PARAMETER: fixtures need 1e-5
  // MoE
  int64_t n_experts = 0;       // N
  int64_t topk = 0;
  int64_t n_shared = 0;        // shared experts fused into one GLU of width n_shared·moe_inter
  int64_t latent = 0;          // Lt
  int64_t moe_inter = 0;       // I
  float routed_scale = 1.0f;
  bool moe_renorm = true;
  bool latent_norm = true;
  // dense FFN (layers < first_dense) and the attention-residual blocks
  int64_t first_dense = 1;
  int64_t dense_inter = 0;
  int64_t attn_res_block = 0;
  float situ_b1 = 4.0f;
  float situ_b2 = 25.0f;

  int64_t kda_width() const { return kda_heads * kda_head_dim; }  // P
  int64_t qk_head() const { return qk_nope + qk_rope; }           // qh
  int64_t kv_head() const { return qk_nope + v_head; }            // kvd
};

// KDA attention (MODEL.md §2.3). P = H·D, channel index h·D + d.
struct KdaWeights {
  Matrix q_proj;    // self_attn.q_proj      [P][E]
  Matrix k_proj;    // self_attn.k_proj      [P][E]
  Matrix v_proj;    // self_attn.v_proj      [P][E]
  Matrix f_a_proj;  // self_attn.f_a_proj    [D][E]   decay low-rank A (no activation after it)
  Matrix f_b_proj;  // self_attn.f_b_proj    [P][D]   decay low-rank B
  Matrix b_proj;    // self_attn.b_proj      [H][E]   β logits, one per head
  Matrix g_proj;    // self_attn.g_proj      [P][E]   full-rank output gate
  Matrix o_proj;    // self_attn.o_proj      [E][P]
  Vec q_conv;       // self_attn.q_conv1d    [P][K]   (on disk [P][1][K]; same bytes)
  Vec k_conv;       // self_attn.k_conv1d    [P][K]
  Vec v_conv;       // self_attn.v_conv1d    [P][K]
  Vec A_log;        // self_attn.A_log       [≥H]     per HEAD; first H used, rest is padding
  Vec dt_bias;      // self_attn.dt_bias     [P]
  Vec o_norm;       // self_attn.o_norm      [D]      head-wise RMSNorm gain shared by all heads
};

// Gated MLA attention (MODEL.md §2.4).
struct MlaWeights {
  Matrix q_a_proj;            // self_attn.q_a_proj            [q_lora][E]
  Vec q_a_layernorm;          // self_attn.q_a_layernorm       [q_lora]
  Matrix q_b_proj;            // self_attn.q_b_proj            [Hm·qh][q_lora]  per head: nope ‖ rope
  Matrix kv_a_proj_with_mqa;  // self_attn.kv_a_proj_with_mqa  [kv_lora + qk_rope][E]
  Vec kv_a_layernorm;         // self_attn.kv_a_layernorm      [kv_lora]
  Matrix kv_b_proj;           // self_attn.kv_b_proj           [Hm·kvd][kv_lora] per head: k_nope ‖ v
  Matrix o_proj;              // self_attn.o_proj              [E][Hm·v_head]
  Matrix g_proj;              // self_attn.g_proj              [Hm·v_head][E]   when mla_out_gate
};

// A SiTU-GLU MLP: the dense FFN of layer 0 (width dense_inter), the fused shared experts
// (width n_shared·moe_inter) and one routed expert (w1 = gate, w3 = up, w2 = down; width I).
struct GluWeights {
  Matrix gate;  // mlp.gate_proj | shared_experts.gate_proj | experts.e.w1   [W][in]
  Matrix up;    // mlp.up_proj   | shared_experts.up_proj   | experts.e.w3   [W][in]
  Matrix down;  // mlp.down_proj | shared_experts.down_proj | experts.e.w2   [in][W]
};

// LatentMoE without its routed experts (the caller hands them to the operators of moe.h).
struct MoeWeights {
  Matrix gate;           // block_sparse_moe.gate                        [N][E]  F32 or BF16 only
  Vec score_bias;        // block_sparse_moe.gate.e_score_correction_bias [N]    selection only
  Matrix down;           // block_sparse_moe.routed_expert_down_proj     [Lt][E]
  Matrix up;             // block_sparse_moe.routed_expert_up_proj       [E][Lt]
  Vec norm;              // block_sparse_moe.routed_expert_norm          [Lt]
  GluWeights shared;     // block_sparse_moe.shared_experts.*   [n_shared·I][E], down [E][n_shared·I]
};

// One decoder layer (MODEL.md §2.2 plus its attention and MLP).
struct LayerWeights {
  Vec input_layernorm;           // [E]
  Vec post_attention_layernorm;  // [E]
  Vec self_attention_res_norm;   // [E]  AttnRes before attention: fold = norm ⊙ proj
  Vec self_attention_res_proj;   // [E]  (on disk [1][E])
  Vec mlp_res_norm;              // [E]  AttnRes before the MLP
  Vec mlp_res_proj;              // [E]  (on disk [1][E])
  bool is_mla = false;           // which of kda / mla is filled
  KdaWeights kda;
  MlaWeights mla;
  bool is_dense = false;         // which of dense / moe is filled
  GluWeights dense;              // layer 0: [dense_inter][E], down [E][dense_inter]
  MoeWeights moe;
};

// Shape checks, so a loader bug or a mismatched prepared directory is a Status naming the layer,
// the tensor, the shape found and the shape the config implies, never an out-of-bounds read.
Status ValidateDims(const Dims& d);
Status ValidateLayerWeights(const LayerWeights& w, const Dims& d, int64_t layer);
Status ValidateExpert(const GluWeights& w, const Dims& d, int64_t layer, int64_t expert);

}  // namespace k3::ops
