#include "formats/vision_config.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "formats/config.h"

namespace k3 {
namespace {

using json = nlohmann::json;

// Collects every problem of one object, then reports them together.
class Reader {
 public:
  Reader(const json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  int Int(const char* key, int lo, int hi) {
    const json* v = Find(key);
    if (v == nullptr) return 0;
    if (!v->is_number()) return Problem(key, "must be a number"), 0;
    const double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) return Problem(key, "must be a whole number"), 0;
    if (d < lo || d > hi) {
      return Problem(key, std::to_string(static_cast<long long>(d)) + " is outside " +
                              std::to_string(lo) + ".." + std::to_string(hi)),
             0;
    }
    return static_cast<int>(d);
  }
  float Float(const char* key) {
    const json* v = Find(key);
    if (v == nullptr) return 0;
    if (!v->is_number()) return Problem(key, "must be a number"), 0.0f;
    const auto f = static_cast<float>(v->get<double>());
    if (!(f > 0.0f) || !std::isfinite(f)) return Problem(key, "must be a positive number"), 0.0f;
    return f;
  }
  // An optional string key that, when present, must say `expected`: other values name a
  // computation this engine does not implement.
  void Text(const char* key, const char* expected) {
    const auto it = obj_.find(key);
    if (it == obj_.end()) return;
    if (!it->is_string() || it->get<std::string>() != expected) {
      Problem(key, std::string("is ") + it->dump() + "; this engine implements \"" + expected +
                       "\" only");
    }
  }
  int Merge() {
    const json* v = Find("merge_kernel_size");
    if (v == nullptr) return 0;
    if (!v->is_array() || v->size() != 2 || !(*v)[0].is_number_integer() ||
        (*v)[0] != (*v)[1]) {
      return Problem("merge_kernel_size", "must be [m, m]"), 0;
    }
    return (*v)[0].get<int>();
  }
  void Problem(const std::string& key, const std::string& what) {
    problems_ += (problems_.empty() ? "" : "; ") + key + " " + what;
  }
  Status Done() const {
    if (problems_.empty()) return Status::Ok();
    return Status::Invalid(where_ + ": " + problems_);
  }

 private:
  const json* Find(const char* key) {
    const auto it = obj_.find(key);
    if (it == obj_.end()) {
      Problem(key, "is missing");
      return nullptr;
    }
    return &*it;
  }
  const json& obj_;
  std::string where_;
  std::string problems_;
};

// Reads the keys both shapes share (released names) and checks the rules.
Result<VisionConfig> ReadVision(const json& o, const std::string& where, bool canonical) {
  Reader r(o, where);
  VisionConfig v;
  v.hidden = r.Int("vt_hidden_size", 1, kMaxVisionWidth);
  v.inter = r.Int("vt_intermediate_size", 1, kMaxVisionWidth);
  v.heads = r.Int("vt_num_attention_heads", 1, kMaxVisionHeads);
  v.layers = r.Int("vt_num_hidden_layers", 1, kMaxVisionLayers);
  v.qkv = r.Int("qkv_hidden_size", 1, kMaxVisionWidth);
  v.pos_h = r.Int("init_pos_emb_height", 1, kMaxPosGrid);
  v.pos_w = r.Int("init_pos_emb_width", 1, kMaxPosGrid);
  v.patch = r.Int("patch_size", 1, 1024);
  v.merge = r.Merge();
  v.text_hidden = r.Int("text_hidden_size", 1, kMaxVisionWidth);
  v.projector_eps = r.Float("projector_ln_eps");
  if (canonical) {
    v.pos_t = r.Int("init_pos_emb_time", 0, kMaxPosGrid);
  } else {
    // Optional in a checkpoint (video only); the release says 4.
    if (o.contains("init_pos_emb_time")) v.pos_t = r.Int("init_pos_emb_time", 0, kMaxPosGrid);
    const int mm = r.Int("mm_hidden_size", 1, kMaxVisionWidth);
    if (mm != 0 && v.hidden != 0 && mm != v.hidden) {
      r.Problem("mm_hidden_size", std::to_string(mm) + " differs from vt_hidden_size " +
                                      std::to_string(v.hidden) + " (the projector merges the "
                                      "tower's rows)");
    }
    r.Text("activation_func", "gelu_pytorch_tanh");
    r.Text("norm_type", "rmsnorm");
    r.Text("mm_projector_type", "patchmergerv2");
    r.Text("projector_hidden_act", "gelu");
    r.Text("merge_type", "sd2_tpool");
    r.Text("mlp_type", "mlp2");
    for (const char* key : {"attn_bias", "linear_bias", "patch_embed_proj_bias"}) {
      const auto it = o.find(key);
      if (it != o.end() && !(it->is_boolean() && !it->get<bool>())) {
        r.Problem(key, "must be false: the vision weights have no biases");
      }
    }
  }
  if (v.patch != 0 && v.patch != kVisionPatch) {
    r.Problem("patch_size", std::to_string(v.patch) + ": this engine implements 14 (as released)");
  }
  if (v.merge != 0 && v.merge != kVisionMerge) {
    r.Problem("merge_kernel_size", "[" + std::to_string(v.merge) + ", " +
                                       std::to_string(v.merge) +
                                       "]: this engine implements [2, 2] (as released)");
  }
  if (v.heads != 0 && v.qkv != 0) {
    if (v.qkv % v.heads != 0) {
      r.Problem("qkv_hidden_size", std::to_string(v.qkv) + " is not a multiple of "
                                   "vt_num_attention_heads " + std::to_string(v.heads));
    } else if (v.head_dim() % 4 != 0) {
      r.Problem("qkv_hidden_size", "gives a head dim of " + std::to_string(v.head_dim()) +
                                       ", not a multiple of 4 (the 2-D RoPE rotates pairs by "
                                       "column and by row)");
    }
  }
  K3_RETURN_IF_ERROR(r.Done());
  return v;
}

Result<json> ParseObject(std::string_view text, const std::string& source) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return Status::Invalid(source + ": not a JSON object");
  }
  return doc;
}

}  // namespace

VisionConfig VisionConfig::Released() {
  VisionConfig v;
  v.hidden = 1024;
  v.inter = 4096;
  v.heads = 12;
  v.layers = 27;
  v.qkv = 1536;
  v.pos_h = v.pos_w = 64;
  v.pos_t = 4;
  v.text_hidden = 7168;
  v.projector_eps = 1e-5f;
  return v;
}

Result<std::optional<VisionConfig>> ParseVisionConfig(std::string_view json_text,
                                                      const std::string& source) {
  K3_ASSIGN_OR_RETURN(json doc, ParseObject(json_text, source));
  const auto it = doc.find("vision_config");
  if (it == doc.end() || it->is_null()) return std::optional<VisionConfig>();
  if (!it->is_object()) return Status::Invalid(source + ": vision_config must be an object");
  K3_ASSIGN_OR_RETURN(VisionConfig v, ReadVision(*it, source + " vision_config", false));
  return std::optional<VisionConfig>(v);
}

Result<VisionConfig> ParseCanonicalVisionConfig(std::string_view json_text,
                                                const std::string& source) {
  K3_ASSIGN_OR_RETURN(json doc, ParseObject(json_text, source));
  K3_ASSIGN_OR_RETURN(VisionConfig v, ReadVision(doc, source, true));
  if (CanonicalVisionConfigJson(v) != doc.dump()) {
    return Status::Invalid(source + ": the vision config is not in canonical form (stale or "
                                    "hand-edited); re-run k3prep pack");
  }
  return v;
}

std::string CanonicalVisionConfigJson(const VisionConfig& v) {
  json o = json::object();
  o["init_pos_emb_height"] = v.pos_h;
  o["init_pos_emb_time"] = v.pos_t;
  o["init_pos_emb_width"] = v.pos_w;
  o["merge_kernel_size"] = json::array({v.merge, v.merge});
  o["patch_size"] = v.patch;
  o["projector_ln_eps"] = JsonNumberForFloat(v.projector_eps);
  o["qkv_hidden_size"] = v.qkv;
  o["text_hidden_size"] = v.text_hidden;
  o["vt_hidden_size"] = v.hidden;
  o["vt_intermediate_size"] = v.inter;
  o["vt_num_attention_heads"] = v.heads;
  o["vt_num_hidden_layers"] = v.layers;
  return o.dump();
}

std::string ReleasedVisionConfigJson(const VisionConfig& v) {
  json o = json::parse(CanonicalVisionConfigJson(v));
  o["_attn_implementation"] = "flash_attention_2";
  o["activation_func"] = "gelu_pytorch_tanh";
  o["attn_bias"] = false;
  o["linear_bias"] = false;
  o["merge_type"] = "sd2_tpool";
  o["mlp_type"] = "mlp2";
  o["mm_hidden_size"] = v.hidden;
  o["mm_projector_type"] = "patchmergerv2";
  o["norm_type"] = "rmsnorm";
  o["patch_embed_proj_bias"] = false;
  o["pos_emb_interpolation_mode"] = "bilinear";
  o["pos_emb_type"] = "divided_fixed";
  o["projector_hidden_act"] = "gelu";
  return o.dump();
}

std::vector<VisionTensor> VisionTensors(const VisionConfig& v) {
  const auto U = [](int x) { return static_cast<uint64_t>(x); };
  const uint64_t H = U(v.hidden), I = U(v.inter), Q = U(v.qkv), P = U(v.patch);
  std::vector<VisionTensor> out;
  const auto add = [&](std::string name, std::vector<uint64_t> shape, VisionPart part,
                       int block) {
    out.push_back(VisionTensor{std::move(name), std::move(shape), part, block});
  };
  add("vision_tower.patch_embed.proj.weight", {H, 3, P, P}, VisionPart::kTower, -1);
  add("vision_tower.patch_embed.pos_emb.weight", {U(v.pos_h), U(v.pos_w), H},
      VisionPart::kTower, -1);
  for (int b = 0; b < v.layers; ++b) {
    const std::string p = "vision_tower.encoder.blocks." + std::to_string(b) + ".";
    add(p + "norm0.weight", {H}, VisionPart::kTower, b);
    add(p + "norm1.weight", {H}, VisionPart::kTower, b);
    add(p + "wqkv.weight", {3 * Q, H}, VisionPart::kTower, b);
    add(p + "wo.weight", {H, Q}, VisionPart::kTower, b);
    add(p + "mlp.fc0.weight", {I, H}, VisionPart::kTower, b);
    add(p + "mlp.fc1.weight", {H, I}, VisionPart::kTower, b);
  }
  add("vision_tower.encoder.final_layernorm.weight", {H}, VisionPart::kTower, -1);
  const uint64_t M = U(v.merged()), T = U(v.text_hidden);
  add("mm_projector.proj.0.weight", {M, M}, VisionPart::kProjector, -1);
  add("mm_projector.proj.2.weight", {T, M}, VisionPart::kProjector, -1);
  add("mm_projector.post_norm.weight", {T}, VisionPart::kProjector, -1);
  return out;
}

bool IsVisionTensorName(std::string_view name) {
  return name.rfind("vision_tower.", 0) == 0 || name.rfind("mm_projector.", 0) == 0;
}

uint64_t VisionBf16Bytes(const VisionConfig& v) {
  uint64_t n = 0;
  for (const VisionTensor& t : VisionTensors(v)) {
    uint64_t e = 2;
    for (uint64_t d : t.shape) e *= d;
    n += e;
  }
  return n;
}

}  // namespace k3
