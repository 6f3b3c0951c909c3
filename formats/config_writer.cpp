// config.json in the released nested shape, for synthetic checkpoints (DESIGN.md §8): every key
// the engine reads under its released name and place, plus the released keys that state what
// the engine assumes (NoPE MLA, sigmoid router, full-rank KDA gate, ...), so a synthetic
// checkpoint's config reads like the release's. ParseModelConfig(ReleasedConfigJson(c)) == c.
#include <algorithm>

#include <nlohmann/json.hpp>

#include "formats/config.h"
#include "formats/vision_config.h"

namespace k3 {
namespace {

using json = nlohmann::json;

// text_config.quantization_config of the release, verbatim except group_size (set from the
// config). Kept as text so it can be compared with the released file by eye.
constexpr const char* kReleasedQuantizationConfig = R"({
  "config_groups": {
    "group_0": {
      "format": "mxfp4-pack-quantized",
      "input_activations": null,
      "output_activations": null,
      "targets": ["Linear"],
      "weights": {
        "actorder": null,
        "block_structure": null,
        "dynamic": false,
        "group_size": 32,
        "num_bits": 4,
        "observer": "minmax",
        "observer_kwargs": {},
        "scale_dtype": "torch.uint8",
        "strategy": "group",
        "symmetric": true,
        "type": "float",
        "zp_dtype": null
      }
    }
  },
  "format": "mxfp4-pack-quantized",
  "global_compression_ratio": null,
  "ignore": [
    "re:.*self_attn.*",
    "re:.*shared_experts.*",
    "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
    "re:.*lm_head.*",
    "re:.*vision_tower.*",
    "re:.*mm_projector.*"
  ],
  "kv_cache_scheme": null,
  "quant_method": "compressed-tensors",
  "quantization_status": "compressed"
})";

json LinearAttnConfig(const ModelConfig& c) {
  // kda_layers: the one-based complement of full_attn_layers, as released.
  std::vector<int> kda_layers;
  for (int layer = 1; layer <= c.n_layers; ++layer) {
    if (std::find(c.full_attn_layers.begin(), c.full_attn_layers.end(), layer) ==
        c.full_attn_layers.end()) {
      kda_layers.push_back(layer);
    }
  }
  json lin = json::object();
  lin["full_attn_layers"] = c.full_attn_layers;
  lin["gate_lower_bound"] = JsonNumberForFloat(c.gate_lb);
  lin["head_dim"] = c.kda_head_dim;
  lin["kda_layers"] = kda_layers;
  lin["num_heads"] = c.kda_heads;
  lin["short_conv_kernel_size"] = c.conv_k;
  lin["use_full_rank_gate"] = true;
  return lin;
}

json TextConfig(const ModelConfig& c) {
  json t = json::object();
  t["activation_situ_beta"] = JsonNumberForFloat(c.situ_b1);
  t["activation_situ_linear_beta"] = JsonNumberForFloat(c.situ_b2);
  t["attn_res_block_size"] = c.attn_res_block;
  t["dtype"] = "bfloat16";
  t["first_k_dense_replace"] = c.first_dense;
  t["hidden_act"] = "situ";
  t["hidden_size"] = c.hidden;
  t["intermediate_size"] = c.dense_inter;
  t["kv_lora_rank"] = c.kv_lora;
  t["latent_moe_use_norm"] = c.latent_norm;
  t["linear_attn_config"] = LinearAttnConfig(c);
  t["max_position_embeddings"] = 1048576;  // as released; the engine has no position limit
  t["mla_use_nope"] = true;
  t["mla_use_output_gate"] = c.mla_out_gate;
  t["model_type"] = "kimi_linear";
  t["moe_intermediate_size"] = c.moe_inter;
  t["moe_layer_freq"] = 1;
  t["moe_renormalize"] = c.moe_renorm;
  t["moe_router_activation_func"] = "sigmoid";
  t["num_attention_heads"] = c.n_heads;
  t["num_expert_group"] = 1;
  t["num_experts"] = c.n_experts;
  t["num_experts_per_token"] = c.topk;
  t["num_hidden_layers"] = c.n_layers;
  t["num_key_value_heads"] = c.n_heads;
  t["num_nextn_predict_layers"] = 0;
  t["num_shared_experts"] = c.n_shared;
  t["q_lora_rank"] = c.q_lora;
  t["qk_nope_head_dim"] = c.qk_nope;
  t["qk_rope_head_dim"] = c.qk_rope;
  if (c.experts_mxfp4) {
    json q = json::parse(kReleasedQuantizationConfig);
    q["config_groups"]["group_0"]["weights"]["group_size"] = c.mxfp4_group_size;
    t["quantization_config"] = std::move(q);
  }
  t["rms_norm_eps"] = JsonNumberForFloat(c.rms_eps);
  t["routed_expert_hidden_size"] = c.latent;
  t["routed_scaling_factor"] = JsonNumberForFloat(c.routed_scale);
  t["tie_word_embeddings"] = false;
  t["topk_group"] = 1;
  t["topk_method"] = "noaux_tc";
  t["use_grouped_topk"] = true;
  t["v_head_dim"] = c.v_head;
  t["vocab_size"] = c.vocab;
  // The release repeats these three in text_config; -1 means "absent" and is not written.
  if (c.bos_token_id != -1) t["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_id != -1) t["eos_token_id"] = c.eos_token_id;
  if (c.pad_token_id != -1) t["pad_token_id"] = c.pad_token_id;
  return t;
}

}  // namespace

std::string ReleasedConfigJson(const ModelConfig& c) { return ReleasedConfigJson(c, nullptr); }

std::string ReleasedConfigJson(const ModelConfig& c, const VisionConfig* vision) {
  // nlohmann::json objects are std::maps, so keys come out sorted, which is the release's order.
  json root = json::object();
  root["architectures"] = json::array({"KimiK3ForConditionalGeneration"});
  root["dtype"] = "bfloat16";
  root["model_type"] = "kimi_k3";
  root["text_config"] = TextConfig(c);
  root["tie_word_embeddings"] = false;
  if (c.bos_token_id != -1) root["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_id != -1) root["eos_token_id"] = c.eos_token_id;
  if (c.pad_token_id != -1) root["pad_token_id"] = c.pad_token_id;
  if (c.media_placeholder_token_id != -1) {
    root["media_placeholder_token_id"] = c.media_placeholder_token_id;
  }
  if (vision != nullptr) root["vision_config"] = json::parse(ReleasedVisionConfigJson(*vision));
  return root.dump(2) + "\n";
}

}  // namespace k3
