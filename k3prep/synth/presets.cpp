#include "k3prep/synth/presets.h"

#include <cerrno>
#include <cstdlib>
#include <set>

#include <nlohmann/json.hpp>

#include "k3prep/synth/tokenizer.h"

namespace k3::synth {
namespace {

using json = nlohmann::json;

// Fields every preset shares (the release's values).
ModelConfig Common() {
  ModelConfig c;
  c.rms_eps = 1e-5f;
  c.conv_k = 4;
  c.gate_lb = -5.0f;
  c.mla_out_gate = true;
  c.n_shared = 2;
  c.routed_scale = 1.0f;
  c.moe_renorm = true;
  c.latent_norm = true;
  c.first_dense = 1;
  c.situ_b1 = 4.0f;
  c.situ_b2 = 25.0f;
  c.experts_mxfp4 = true;
  c.mxfp4_group_size = 32;
  return c;
}

ModelConfig Tiny() {
  ModelConfig c = Common();
  c.hidden = 128; c.n_layers = 13; c.vocab = 1280;
  c.full_attn_layers = {4, 8, 12, 13};
  c.kda_heads = 4; c.kda_head_dim = 16;
  c.n_heads = 4; c.q_lora = 64; c.kv_lora = 32; c.qk_nope = 24; c.qk_rope = 8; c.v_head = 16;
  c.n_experts = 8; c.topk = 2; c.latent = 64; c.moe_inter = 64; c.dense_inter = 96;
  c.attn_res_block = 3;
  return c;
}

ModelConfig Small() {
  ModelConfig c = Common();
  c.hidden = 256; c.n_layers = 93; c.vocab = 4352;
  c.full_attn_layers = ReleasedFullAttnLayers();
  c.kda_heads = 2; c.kda_head_dim = 128;
  c.n_heads = 2; c.q_lora = 128; c.kv_lora = 64; c.qk_nope = 128; c.qk_rope = 64; c.v_head = 128;
  c.n_experts = 64; c.topk = 8; c.latent = 128; c.moe_inter = 128; c.dense_inter = 1024;
  c.attn_res_block = 12;
  return c;
}

ModelConfig Bench() {
  ModelConfig c = Common();
  c.hidden = 768; c.n_layers = 93; c.vocab = 163840;
  c.full_attn_layers = ReleasedFullAttnLayers();
  c.kda_heads = 6; c.kda_head_dim = 128;
  c.n_heads = 6; c.q_lora = 384; c.kv_lora = 128; c.qk_nope = 128; c.qk_rope = 64; c.v_head = 128;
  c.n_experts = 896; c.topk = 16; c.latent = 512; c.moe_inter = 256; c.dense_inter = 3584;
  c.attn_res_block = 12;
  return c;
}

ModelConfig Full() {
  ModelConfig c = Common();
  c.hidden = 7168; c.n_layers = 93; c.vocab = 163840;
  c.full_attn_layers = ReleasedFullAttnLayers();
  c.kda_heads = 96; c.kda_head_dim = 128;
  c.n_heads = 96; c.q_lora = 1536; c.kv_lora = 512; c.qk_nope = 128; c.qk_rope = 64;
  c.v_head = 128;
  c.n_experts = 896; c.topk = 16; c.latent = 3584; c.moe_inter = 3072; c.dense_inter = 33792;
  c.attn_res_block = 12;
  return c;
}

// "12" → 12; the whole text must be an integer.
bool ParseInt(const std::string& s, long long* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  *out = v;
  return true;
}

// The JSON value for an override text: integer list (when it has a comma, or for
// full_attn_layers), true/false, or a number.
Result<json> ParseValue(const std::string& key, const std::string& text, const std::string& arg) {
  if (key == "full_attn_layers" || key == "kda_layers" || text.find(',') != std::string::npos) {
    json list = json::array();
    size_t start = 0;
    while (start <= text.size()) {
      const size_t comma = std::min(text.find(',', start), text.size());
      long long v = 0;
      if (!ParseInt(text.substr(start, comma - start), &v)) {
        return Status::Invalid("--set " + arg + ": '" + text.substr(start, comma - start) +
                               "' is not an integer; " + key +
                               " takes a comma-separated list of one-based layer numbers, "
                               "e.g. --set full_attn_layers=4,8,13");
      }
      list.push_back(v);
      start = comma + 1;
    }
    return list;
  }
  if (text == "true") return json(true);
  if (text == "false") return json(false);
  long long iv = 0;
  if (ParseInt(text, &iv)) return json(iv);
  errno = 0;
  char* end = nullptr;
  const double d = std::strtod(text.c_str(), &end);
  if (text.empty() || errno != 0 || end != text.c_str() + text.size()) {
    return Status::Invalid("--set " + arg + ": value '" + text + "' of " + key +
                           " is not a number, true/false or an integer list");
  }
  return json(d);
}

}  // namespace

const std::vector<int>& ReleasedFullAttnLayers() {
  static const std::vector<int> kLayers = {4,  8,  12, 16, 20, 24, 28, 32, 36, 40, 44, 48,
                                           52, 56, 60, 64, 68, 72, 76, 80, 84, 88, 92, 93};
  return kLayers;
}

void SetSpecialIds(ModelConfig* c) {
  const SpecialIds ids = SynthSpecialIds(c->vocab);
  c->bos_token_id = ids.bos;
  c->eos_token_id = ids.eos;
  c->pad_token_id = ids.pad;
  c->media_placeholder_token_id = ids.media_placeholder;
}

Result<ModelConfig> PresetConfig(std::string_view preset) {
  ModelConfig c;
  if (preset == "tiny") {
    c = Tiny();
  } else if (preset == "small") {
    c = Small();
  } else if (preset == "bench") {
    c = Bench();
  } else if (preset == "full") {
    c = Full();
  } else {
    return Status::Invalid("--preset '" + std::string(preset) +
                           "' is not a preset; choose tiny, small, bench or full");
  }
  SetSpecialIds(&c);
  return c;
}

Result<VisionConfig> PresetVision(std::string_view preset, int text_hidden) {
  VisionConfig v = VisionConfig::Released();
  // Scaled like the text presets: few blocks and a small position grid for the fixtures (an
  // image larger than the grid exercises the interpolation), the released block count from bench.
  struct Dims { const char* name; int hidden, inter, heads, qkv, layers, grid; };
  static constexpr Dims kScaled[] = {
      {"tiny", 64, 128, 2, 64, 2, 8},
      {"small", 128, 256, 2, 128, 3, 16},
      {"bench", 256, 1024, 4, 256, 27, 64},
  };
  if (preset != "full") {
    const Dims* d = nullptr;
    for (const Dims& k : kScaled) {
      if (preset == k.name) d = &k;
    }
    if (d == nullptr) {
      return Status::Invalid("--preset '" + std::string(preset) +
                             "' is not a preset; choose tiny, small, bench or full");
    }
    v.hidden = d->hidden;
    v.inter = d->inter;
    v.heads = d->heads;
    v.qkv = d->qkv;
    v.layers = d->layers;
    v.pos_h = v.pos_w = d->grid;
  }
  v.text_hidden = text_hidden;
  return v;
}

Result<ModelConfig> ApplyOverrides(const ModelConfig& base, const std::vector<std::string>& sets) {
  if (sets.empty()) return base;
  json doc = json::parse(ReleasedConfigJson(base));
  // The objects the config reader searches (MODEL.md §1.2), in its order.
  std::vector<json*> objects;
  if (doc.contains("text_config") && doc["text_config"].is_object()) {
    json& tc = doc["text_config"];
    objects.push_back(&tc);
    if (tc.contains("linear_attn_config") && tc["linear_attn_config"].is_object()) {
      objects.push_back(&tc["linear_attn_config"]);
    }
  }
  objects.push_back(&doc);

  std::set<std::string> explicit_ids;
  std::string all_args;
  for (const std::string& arg : sets) {
    all_args += (all_args.empty() ? "" : " ") + arg;
    const size_t eq = arg.find('=');
    if (eq == std::string::npos || eq == 0) {
      return Status::Invalid("--set " + arg + ": expected key=value, e.g. --set num_experts=64");
    }
    const std::string key = arg.substr(0, eq);
    K3_ASSIGN_OR_RETURN(json value, ParseValue(key, arg.substr(eq + 1), arg));
    bool found = false;
    for (json* obj : objects) {
      // Objects and strings are structure (text_config, quantization_config, model_type), not
      // fields the engine reads.
      if (auto it = obj->find(key); it != obj->end() && !it->is_object() && !it->is_string()) {
        *it = value;
        found = true;
      }
    }
    if (!found) {
      return Status::Invalid("--set " + arg + ": unknown config key '" + key +
                             "'; use a config.json key name the engine reads, e.g. "
                             "hidden_size, num_hidden_layers, vocab_size, num_experts, "
                             "num_experts_per_token, head_dim, full_attn_layers");
    }
    if (key.size() > 9 && key.compare(key.size() - 9, 9, "_token_id") == 0) {
      explicit_ids.insert(key);
    }
  }
  // kda_layers is the one-based complement the release also ships; the reader ignores it, and
  // ReleasedConfigJson rewrites it below from the parsed layer map.
  Result<ModelConfig> parsed = ParseModelConfig(doc.dump(), "config after --set " + all_args);
  if (!parsed.ok()) {
    return Status::Invalid("invalid --set override (" + all_args + "): " +
                           parsed.status().message());
  }
  ModelConfig c = std::move(parsed).value();
  const ModelConfig derived = [&] {
    ModelConfig d = c;
    SetSpecialIds(&d);
    return d;
  }();
  if (!explicit_ids.count("bos_token_id")) c.bos_token_id = derived.bos_token_id;
  if (!explicit_ids.count("eos_token_id")) c.eos_token_id = derived.eos_token_id;
  if (!explicit_ids.count("pad_token_id")) c.pad_token_id = derived.pad_token_id;
  if (!explicit_ids.count("media_placeholder_token_id")) {
    c.media_placeholder_token_id = derived.media_placeholder_token_id;
  }
  K3_RETURN_IF_ERROR(ValidateForSynth(c).WithContext("invalid --set override (" + all_args + ")"));
  return c;
}

Status ValidateForSynth(const ModelConfig& c) {
  if (c.vocab < kMinVocab) {
    return Status::Invalid("vocab_size = " + std::to_string(c.vocab) + " is below " +
                           std::to_string(kMinVocab) +
                           ": the synthetic tokenizer needs the 256 single bytes plus the 256 "
                           "added tokens; use --set vocab_size=512 or more");
  }
  if (!c.experts_mxfp4) {
    return Status::Invalid("synth writes MXFP4 routed experts, but the config has no "
                           "quantization_config");
  }
  return Status::Ok();
}

}  // namespace k3::synth
