// Shape checks for the weight views (weights.h). Each message names the layer, the tensor, what
// was found, what the config implies (with the config keys behind it) and what to do.
#include <string>

#include "k3run/ops/weights.h"

namespace k3::ops {

namespace {

constexpr const char* kFix =
    "; the weights do not match config.json: re-run k3prep pack and k3verify prepared";

std::string Where(int64_t layer, const std::string& tensor) {
  return "layer " + std::to_string(layer) + " " + tensor;
}

std::string Shape(int64_t r, int64_t c) {
  return "[" + std::to_string(r) + "][" + std::to_string(c) + "]";
}

Status CheckMatrix(const Matrix& m, int64_t rows, int64_t cols, const std::string& where,
                   const char* why) {
  if (m.data == nullptr) return Status::Invalid(where + ": matrix has no data" + kFix);
  if (m.rows != rows || m.cols != cols) {
    return Status::Invalid(where + ": matrix is " + Shape(m.rows, m.cols) + ", config implies " +
                           Shape(rows, cols) + " (" + why + ")" + kFix);
  }
  if (m.type == kernels::WeightType::kMXFP4) {
    if (m.scales == nullptr)
      return Status::Invalid(where + ": MXFP4 matrix has no E8M0 scales" + kFix);
    if (m.cols % 32 != 0) {
      return Status::Invalid(where + ": MXFP4 matrix has " + std::to_string(m.cols) +
                             " columns, not a multiple of the group size 32" + kFix);
    }
  }
  return Status::Ok();
}

Status CheckVec(const Vec& v, int64_t n, const std::string& where, const char* why) {
  if (static_cast<int64_t>(v.size()) != n || (n > 0 && v.data() == nullptr)) {
    return Status::Invalid(where + ": vector has " + std::to_string(v.size()) +
                           " elements, config implies " + std::to_string(n) + " (" + why + ")" +
                           kFix);
  }
  return Status::Ok();
}

#define K3_CHECK_M(m, r, c, why) K3_RETURN_IF_ERROR(CheckMatrix(w.m, r, c, Where(layer, pre + #m), why))
#define K3_CHECK_V(v, n, why) K3_RETURN_IF_ERROR(CheckVec(w.v, n, Where(layer, pre + #v), why))

Status CheckKda(const KdaWeights& w, const Dims& d, int64_t layer) {
  const std::string pre = "self_attn.";
  const int64_t E = d.hidden, H = d.kda_heads, D = d.kda_head_dim, P = H * D, K = d.conv_k;
  K3_CHECK_M(q_proj, P, E, "num_heads·head_dim × hidden_size");
  K3_CHECK_M(k_proj, P, E, "num_heads·head_dim × hidden_size");
  K3_CHECK_M(v_proj, P, E, "num_heads·head_dim × hidden_size");
  K3_CHECK_M(f_a_proj, D, E, "head_dim × hidden_size");
  K3_CHECK_M(f_b_proj, P, D, "num_heads·head_dim × head_dim");
  K3_CHECK_M(b_proj, H, E, "num_heads × hidden_size");
  K3_CHECK_M(g_proj, P, E, "num_heads·head_dim × hidden_size");
  K3_CHECK_M(o_proj, E, P, "hidden_size × num_heads·head_dim");
  K3_CHECK_V(q_conv, P * K, "num_heads·head_dim·short_conv_kernel_size");
  K3_CHECK_V(k_conv, P * K, "num_heads·head_dim·short_conv_kernel_size");
  K3_CHECK_V(v_conv, P * K, "num_heads·head_dim·short_conv_kernel_size");
  K3_CHECK_V(dt_bias, P, "num_heads·head_dim");
  K3_CHECK_V(o_norm, D, "head_dim");
  // A_log: any length ≥ num_heads; the first num_heads are used (MODEL.md, "A_log on disk").
  if (static_cast<int64_t>(w.A_log.size()) < H || w.A_log.data() == nullptr) {
    return Status::Invalid(Where(layer, pre + "A_log") + ": vector has " +
                           std::to_string(w.A_log.size()) +
                           " elements, needs at least num_heads = " + std::to_string(H) + kFix);
  }
  return Status::Ok();
}

Status CheckMla(const MlaWeights& w, const Dims& d, int64_t layer) {
  const std::string pre = "self_attn.";
  const int64_t E = d.hidden, Hm = d.n_heads;
  K3_CHECK_M(q_a_proj, d.q_lora, E, "q_lora_rank × hidden_size");
  K3_CHECK_V(q_a_layernorm, d.q_lora, "q_lora_rank");
  K3_CHECK_M(q_b_proj, Hm * d.qk_head(), d.q_lora,
             "num_attention_heads·(qk_nope_head_dim+qk_rope_head_dim) × q_lora_rank");
  K3_CHECK_M(kv_a_proj_with_mqa, d.kv_lora + d.qk_rope, E,
             "kv_lora_rank+qk_rope_head_dim × hidden_size");
  K3_CHECK_V(kv_a_layernorm, d.kv_lora, "kv_lora_rank");
  K3_CHECK_M(kv_b_proj, Hm * d.kv_head(), d.kv_lora,
             "num_attention_heads·(qk_nope_head_dim+v_head_dim) × kv_lora_rank");
  if (w.kv_b_proj.type == kernels::WeightType::kMXFP4) {
    return Status::Invalid(Where(layer, pre + "kv_b_proj") +
                           ": MXFP4; the absorbed MLA form reads it by columns and needs F32 or "
                           "BF16" + kFix);
  }
  K3_CHECK_M(o_proj, E, Hm * d.v_head, "hidden_size × num_attention_heads·v_head_dim");
  if (d.mla_out_gate)
    K3_CHECK_M(g_proj, Hm * d.v_head, E, "num_attention_heads·v_head_dim × hidden_size");
  return Status::Ok();
}

// names: the checkpoint's names of gate, up and down (e.g. w1, w3, w2 for a routed expert).
Status CheckGlu(const GluWeights& w, int64_t in, int64_t width, int64_t layer,
                const std::string& pre, const char* const (&names)[3], const char* why) {
  K3_RETURN_IF_ERROR(CheckMatrix(w.gate, width, in, Where(layer, pre + names[0]), why));
  K3_RETURN_IF_ERROR(CheckMatrix(w.up, width, in, Where(layer, pre + names[1]), why));
  return CheckMatrix(w.down, in, width, Where(layer, pre + names[2]), why);
}

constexpr const char* kProjNames[3] = {"gate_proj", "up_proj", "down_proj"};
constexpr const char* kExpertNames[3] = {"w1", "w3", "w2"};

Status CheckMoe(const MoeWeights& w, const Dims& d, int64_t layer) {
  const std::string pre = "block_sparse_moe.";
  const int64_t E = d.hidden;
  K3_CHECK_M(gate, d.n_experts, E, "num_experts × hidden_size");
  if (w.gate.type == kernels::WeightType::kMXFP4) {
    return Status::Invalid(Where(layer, pre + "gate") +
                           ": router matrix is MXFP4; it must be F32 or BF16 (its logits are "
                           "accumulated in double from exact values)" + kFix);
  }
  K3_CHECK_V(score_bias, d.n_experts, "num_experts");
  K3_CHECK_M(down, d.latent, E, "routed_expert_hidden_size × hidden_size");
  K3_CHECK_M(up, E, d.latent, "hidden_size × routed_expert_hidden_size");
  K3_CHECK_V(norm, d.latent, "routed_expert_hidden_size");
  return CheckGlu(w.shared, E, d.n_shared * d.moe_inter, layer, pre + "shared_experts.", kProjNames,
                  "num_shared_experts·moe_intermediate_size with hidden_size");
}

Status Positive(int64_t v, const char* key) {
  if (v > 0) return Status::Ok();
  return Status::Invalid(std::string("ops dims: ") + key + " = " + std::to_string(v) +
                         " must be > 0; fix config.json");
}

}  // namespace

Status ValidateDims(const Dims& d) {
  K3_RETURN_IF_ERROR(Positive(d.hidden, "hidden_size"));
  K3_RETURN_IF_ERROR(Positive(d.kda_heads, "num_heads (KDA)"));
  K3_RETURN_IF_ERROR(Positive(d.kda_head_dim, "head_dim (KDA)"));
  K3_RETURN_IF_ERROR(Positive(d.conv_k, "short_conv_kernel_size"));
  K3_RETURN_IF_ERROR(Positive(d.n_heads, "num_attention_heads"));
  K3_RETURN_IF_ERROR(Positive(d.q_lora, "q_lora_rank"));
  K3_RETURN_IF_ERROR(Positive(d.kv_lora, "kv_lora_rank"));
  K3_RETURN_IF_ERROR(Positive(d.qk_nope + d.qk_rope, "qk_nope_head_dim + qk_rope_head_dim"));
  K3_RETURN_IF_ERROR(Positive(d.v_head, "v_head_dim"));
  K3_RETURN_IF_ERROR(Positive(d.n_experts, "num_experts"));
  K3_RETURN_IF_ERROR(Positive(d.topk, "num_experts_per_token"));
  K3_RETURN_IF_ERROR(Positive(d.latent, "routed_expert_hidden_size"));
  K3_RETURN_IF_ERROR(Positive(d.moe_inter, "moe_intermediate_size"));
  K3_RETURN_IF_ERROR(Positive(d.attn_res_block, "attn_res_block_size"));
  if (d.topk > d.n_experts || d.topk > kMaxTopK) {
    return Status::Invalid("ops dims: num_experts_per_token = " + std::to_string(d.topk) +
                           " must be ≤ num_experts (" + std::to_string(d.n_experts) +
                           ") and ≤ " + std::to_string(kMaxTopK) + "; fix config.json");
  }
  return Status::Ok();
}

Status ValidateLayerWeights(const LayerWeights& w, const Dims& d, int64_t layer) {
  const std::string pre;
  const int64_t E = d.hidden;
  K3_CHECK_V(input_layernorm, E, "hidden_size");
  K3_CHECK_V(post_attention_layernorm, E, "hidden_size");
  K3_CHECK_V(self_attention_res_norm, E, "hidden_size");
  K3_CHECK_V(self_attention_res_proj, E, "hidden_size");
  K3_CHECK_V(mlp_res_norm, E, "hidden_size");
  K3_CHECK_V(mlp_res_proj, E, "hidden_size");
  K3_RETURN_IF_ERROR(w.is_mla ? CheckMla(w.mla, d, layer) : CheckKda(w.kda, d, layer));
  if (w.is_dense) {
    return CheckGlu(w.dense, E, d.dense_inter, layer, "mlp.", kProjNames,
                    "intermediate_size with hidden_size");
  }
  return CheckMoe(w.moe, d, layer);
}

Status ValidateExpert(const GluWeights& w, const Dims& d, int64_t layer, int64_t expert) {
  return CheckGlu(w, d.latent, d.moe_inter, layer,
                  "block_sparse_moe.experts." + std::to_string(expert) + ".", kExpertNames,
                  "moe_intermediate_size with routed_expert_hidden_size");
}

}  // namespace k3::ops
