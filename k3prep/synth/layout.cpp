#include "k3prep/synth/layout.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "formats/mxfp4.h"
#include "formats/safetensors.h"
#include "k3prep/synth/shard_meta.h"

namespace k3::synth {
namespace {

// Value recipe (docs/SYNTH.md "Weights"): MODEL.md §6.2's oracle recipe, with each matrix's
// standard deviation scaled by sqrt(tiny fan-in / fan-in) so that tiny gets exactly §6.2's
// values and the larger presets keep tiny's activation scale.
constexpr float kMatrixStd = 0.02f;  // every ≥2-D weight
constexpr float kSituStd = 1.2f;     // gate/up feeding SiTU (experts, shared, dense): hits caps
// lm_head ten times the other matrices: logits of rms ~2 instead of ~0.2, so greedy steps have
// clear top-2 gaps and the reference gates compare more steps (the 1e-3 gap rule, DESIGN.md §7).
constexpr float kLmHeadStd = 0.2f;
// Router scores σ(logit) spread by about ±0.06 around 0.5 (logit std ~0.23 at every preset);
// a selection bias of ±0.03 reorders some selections without making experts unreachable
// (MODEL.md §6.2's ±0.15 overrode the scores for 91 % of routings and starved experts 0–2).
constexpr float kRouterBiasSpread = 0.03f;
constexpr float kGainSpread = 0.05f; // norm gains 1 + 0.05·z ("near 1"; §6.2 used exactly 1)
constexpr float kDtBiasStd = 0.5f;
constexpr float kConvStd = 0.4f;

Init Normal(float base, int64_t fan_in, int64_t tiny_fan_in) {
  Init i;
  i.kind = InitKind::kNormal;
  i.a = static_cast<float>(static_cast<double>(base) *
                           std::sqrt(static_cast<double>(tiny_fan_in) /
                                     static_cast<double>(fan_in)));
  return i;
}
Init Flat(float sd) { return Init{InitKind::kNormal, sd, 0, 0}; }
Init Gain() { return Init{InitKind::kGain, kGainSpread, 0, 0}; }
Init Linspace(float lo, float hi, int64_t count) { return Init{InitKind::kLinspace, lo, hi, count}; }

uint64_t U(int v) { return static_cast<uint64_t>(v); }

// Tiny's fan-ins (DESIGN.md §8 tiny row), the reference of the std scaling.
constexpr int64_t kTinyHidden = 128, kTinyQLora = 64, kTinyKvLora = 32, kTinyHeadDim = 16,
                  kTinyKdaWidth = 64, kTinyMlaV = 64, kTinyLatent = 64, kTinyMoeInter = 64,
                  kTinyShared = 128, kTinyDense = 96;

class Builder {
 public:
  Builder(const ModelConfig& c, SmallDType small) : c_(c), small_(small) {}

  std::vector<TensorPlan> tensors;

  void Layer(int L) {
    const std::string p = LayerPrefix(L);
    const uint64_t E = U(c_.hidden);
    Small(p + "input_layernorm.weight", {E}, Gain(), false);
    Small(p + "self_attention_res_norm.weight", {E}, Gain(), false);
    Small(p + "self_attention_res_proj.weight", {1, E}, Normal(kMatrixStd, c_.hidden, kTinyHidden),
          false);
    Small(p + "post_attention_layernorm.weight", {E}, Gain(), false);
    Small(p + "mlp_res_norm.weight", {E}, Gain(), false);
    Small(p + "mlp_res_proj.weight", {1, E}, Normal(kMatrixStd, c_.hidden, kTinyHidden), false);
    if (c_.is_mla(L)) {
      Mla(p + "self_attn.");
    } else {
      Kda(p + "self_attn.");
    }
    if (c_.is_dense(L)) {
      const uint64_t DI = U(c_.dense_inter);
      Matrix(p + "mlp.gate_proj.weight", DI, E, kSituStd, kTinyHidden);
      Matrix(p + "mlp.up_proj.weight", DI, E, kSituStd, kTinyHidden);
      Matrix(p + "mlp.down_proj.weight", E, DI, kMatrixStd, kTinyDense);
    } else {
      Moe(L, p + "block_sparse_moe.");
    }
  }

  // The release's shard 95: the projector (proj.0, proj.2, post_norm).
  void Projector(const VisionConfig& v) { Vision(v, VisionPart::kProjector); }
  // The release's shard 96: the tower.
  void Tower(const VisionConfig& v) { Vision(v, VisionPart::kTower); }

  void ModelLevel() {
    const uint64_t E = U(c_.hidden), V = U(c_.vocab);
    // §6.2: the embedding is N(0, 0.02) whatever the width (its rows are read, not multiplied).
    Add("language_model.model.embed_tokens.weight", DType::kBF16, {V, E}, Flat(kMatrixStd));
    Matrix("language_model.lm_head.weight", V, E, kLmHeadStd, kTinyHidden);
    Small("language_model.model.norm.weight", {E}, Gain(), false);
    Small("language_model.model.output_attn_res_norm.weight", {E}, Gain(), false);
    Small("language_model.model.output_attn_res_proj.weight", {1, E},
          Normal(kMatrixStd, c_.hidden, kTinyHidden), false);
  }

 private:
  void Add(std::string name, DType dtype, std::vector<uint64_t> shape, Init init) {
    TensorPlan t;
    t.name = std::move(name);
    t.dtype = dtype;
    t.shape = std::move(shape);
    uint64_t n = DTypeSize(dtype);
    for (uint64_t d : t.shape) n *= d;
    t.nbytes = n;
    t.init = init;
    tensors.push_back(std::move(t));
  }
  void Matrix(std::string name, uint64_t rows, uint64_t cols, float base, int64_t tiny_fan_in) {
    Add(std::move(name), DType::kBF16, {rows, cols},
        Normal(base, static_cast<int64_t>(cols), tiny_fan_in));
  }
  // A small vector: `wide` ones are F32 in the mixed plan (DESIGN.md §8), the rest BF16.
  void Small(std::string name, std::vector<uint64_t> shape, Init init, bool wide) {
    DType t = DType::kBF16;
    if (small_ == SmallDType::kF32 || (small_ == SmallDType::kMixed && wide)) t = DType::kF32;
    Add(std::move(name), t, std::move(shape), init);
  }

  // Matrices N(0, 0.02) scaled by fan-in like the text matrices (the patch embedding's fan-in
  // is 3·14·14 = 588), norm gains near 1 (dtype by --small-dtype, as the text norms), the
  // position grid N(0, 0.02) (read, not multiplied).
  void Vision(const VisionConfig& v, VisionPart part) {
    for (VisionTensor& t : VisionTensors(v)) {
      if (t.part != part) continue;
      if (t.shape.size() == 1) {  // norm gains: small vectors, BF16 in the mixed plan
        Small(std::move(t.name), std::move(t.shape), Gain(), false);
      } else if (t.name == "vision_tower.patch_embed.pos_emb.weight") {
        Add(std::move(t.name), DType::kBF16, std::move(t.shape), Flat(kMatrixStd));
      } else {
        uint64_t fan_in = 1;
        for (size_t i = 1; i < t.shape.size(); ++i) fan_in *= t.shape[i];
        Add(std::move(t.name), DType::kBF16, std::move(t.shape),
            Normal(kMatrixStd, static_cast<int64_t>(fan_in), kTinyHidden));
      }
    }
  }

  void Kda(const std::string& p) {
    const uint64_t E = U(c_.hidden), H = U(c_.kda_heads), D = U(c_.kda_head_dim);
    const uint64_t P = H * D, K = U(c_.conv_k);
    Matrix(p + "q_proj.weight", P, E, kMatrixStd, kTinyHidden);
    Matrix(p + "k_proj.weight", P, E, kMatrixStd, kTinyHidden);
    Matrix(p + "v_proj.weight", P, E, kMatrixStd, kTinyHidden);
    Small(p + "q_conv1d.weight", {P, 1, K}, Flat(kConvStd), true);
    Small(p + "k_conv1d.weight", {P, 1, K}, Flat(kConvStd), true);
    Small(p + "v_conv1d.weight", {P, 1, K}, Flat(kConvStd), true);
    Matrix(p + "f_a_proj.weight", D, E, kMatrixStd, kTinyHidden);
    Matrix(p + "f_b_proj.weight", P, D, kMatrixStd, kTinyHeadDim);
    Matrix(p + "b_proj.weight", H, E, kMatrixStd, kTinyHidden);
    // A_log: max(num_heads, head_dim) entries, the first num_heads used (MODEL.md preamble).
    Small(p + "A_log", {std::max(H, D)}, Linspace(-0.4f, 1.2f, c_.kda_heads), true);
    Small(p + "dt_bias", {P}, Flat(kDtBiasStd), true);
    Matrix(p + "g_proj.weight", P, E, kMatrixStd, kTinyHidden);
    Small(p + "o_norm.weight", {D}, Gain(), true);
    Matrix(p + "o_proj.weight", E, P, kMatrixStd, kTinyKdaWidth);
  }

  void Mla(const std::string& p) {
    const uint64_t E = U(c_.hidden), H = U(c_.n_heads);
    const uint64_t qh = U(c_.qk_nope + c_.qk_rope), kvd = U(c_.qk_nope + c_.v_head);
    Matrix(p + "q_a_proj.weight", U(c_.q_lora), E, kMatrixStd, kTinyHidden);
    Small(p + "q_a_layernorm.weight", {U(c_.q_lora)}, Gain(), false);
    Matrix(p + "q_b_proj.weight", H * qh, U(c_.q_lora), kMatrixStd, kTinyQLora);
    Matrix(p + "kv_a_proj_with_mqa.weight", U(c_.kv_lora + c_.qk_rope), E, kMatrixStd,
           kTinyHidden);
    Small(p + "kv_a_layernorm.weight", {U(c_.kv_lora)}, Gain(), false);
    Matrix(p + "kv_b_proj.weight", H * kvd, U(c_.kv_lora), kMatrixStd, kTinyKvLora);
    Matrix(p + "o_proj.weight", E, H * U(c_.v_head), kMatrixStd, kTinyMlaV);
    if (c_.mla_out_gate) Matrix(p + "g_proj.weight", H * U(c_.v_head), E, kMatrixStd, kTinyHidden);
  }

  void Moe(int L, const std::string& p) {
    const uint64_t E = U(c_.hidden), NE = U(c_.n_experts), LAT = U(c_.latent);
    const uint64_t SI = U(c_.moe_inter) * U(c_.n_shared);
    Matrix(p + "gate.weight", NE, E, kMatrixStd, kTinyHidden);
    // Selection bias: linspace over the experts, reordering some selections (see above).
    Small(p + "gate.e_score_correction_bias", {NE},
          Linspace(-kRouterBiasSpread, kRouterBiasSpread, c_.n_experts), true);
    Matrix(p + "routed_expert_down_proj.weight", LAT, E, kMatrixStd, kTinyHidden);
    Small(p + "routed_expert_norm.weight", {LAT}, Gain(), false);
    Matrix(p + "routed_expert_up_proj.weight", E, LAT, kMatrixStd, kTinyLatent);
    Matrix(p + "shared_experts.gate_proj.weight", SI, E, kSituStd, kTinyHidden);
    Matrix(p + "shared_experts.up_proj.weight", SI, E, kSituStd, kTinyHidden);
    Matrix(p + "shared_experts.down_proj.weight", E, SI, kMatrixStd, kTinyShared);
    for (int e = 0; e < c_.n_experts; ++e) Expert(L, e, p + "experts." + std::to_string(e) + ".");
  }

  void Expert(int L, int e, const std::string& p) {
    const uint64_t LAT = U(c_.latent), I = U(c_.moe_inter);
    const uint64_t G = mxfp4::kGroupSize;
    struct M {
      const char* w;
      uint64_t rows, cols;
      float sd;
      ExpertPart packed, scale;
    };
    const M mats[3] = {
        {"w1", I, LAT, Normal(kSituStd, c_.latent, kTinyLatent).a, ExpertPart::kW1Packed,
         ExpertPart::kW1Scale},
        {"w2", LAT, I, Normal(kMatrixStd, c_.moe_inter, kTinyMoeInter).a, ExpertPart::kW2Packed,
         ExpertPart::kW2Scale},
        {"w3", I, LAT, Normal(kSituStd, c_.latent, kTinyLatent).a, ExpertPart::kW3Packed,
         ExpertPart::kW3Scale},
    };
    for (const M& m : mats) {
      const Init init{InitKind::kMxfp4, m.sd, 0, 0};
      Add(p + m.w + ".weight_packed", DType::kU8, {m.rows, m.cols / 2}, init);
      tensors.back().expert = e;
      tensors.back().part = m.packed;
      Add(p + m.w + ".weight_scale", DType::kU8, {m.rows, m.cols / G}, init);
      tensors.back().expert = e;
      tensors.back().part = m.scale;
    }
    (void)L;
  }

  const ModelConfig& c_;
  SmallDType small_;
};

}  // namespace

bool ParseSmallDType(const std::string& text, SmallDType* out) {
  if (text == "mixed") { *out = SmallDType::kMixed; return true; }
  if (text == "bf16") { *out = SmallDType::kBF16; return true; }
  if (text == "f32") { *out = SmallDType::kF32; return true; }
  return false;
}

const char* SmallDTypeName(SmallDType t) {
  switch (t) {
    case SmallDType::kMixed: return "mixed";
    case SmallDType::kBF16: return "bf16";
    case SmallDType::kF32: return "f32";
  }
  return "?";
}

std::string LayerPrefix(int layer) {
  return "language_model.model.layers." + std::to_string(layer) + ".";
}

Result<Layout> BuildLayout(Env* env, const ModelConfig& config, SmallDType small, int shards,
                           const VisionConfig* vision) {
  const int units = config.n_layers + 1 + (vision != nullptr ? 2 : 0);
  if (shards == 0) shards = units;
  if (shards < 1 || shards > units) {
    return Status::Invalid("--shards " + std::to_string(shards) + " is out of range: a " +
                           std::to_string(config.n_layers) + "-layer model has " +
                           std::to_string(units) + " units (layers + the model-level tensors" +
                           (vision != nullptr ? " + the projector + the vision tower" : "") +
                           "); choose 1.." + std::to_string(units));
  }
  if (vision != nullptr && vision->text_hidden != config.hidden) {
    return Status::Invalid("vision text_hidden_size " + std::to_string(vision->text_hidden) +
                           " differs from hidden_size " + std::to_string(config.hidden));
  }
  if (config.moe_inter % mxfp4::kGroupSize != 0 || config.latent % mxfp4::kGroupSize != 0) {
    return Status::Invalid("moe_intermediate_size " + std::to_string(config.moe_inter) +
                           " and routed_expert_hidden_size " + std::to_string(config.latent) +
                           " must be multiples of 32 (MXFP4 groups)");
  }
  Layout out;
  out.config = config;
  if (vision != nullptr) out.vision = *vision;
  out.small = small;
  out.shards.resize(static_cast<size_t>(shards));
  Builder b(config, small);
  for (int u = 0; u < units; ++u) {
    const size_t s = static_cast<size_t>(static_cast<int64_t>(u) * shards / units);
    ShardPlan& sp = out.shards[s];
    const size_t before = b.tensors.size();
    if (sp.tensor_count == 0) {
      sp.first_unit = u;
      sp.first_tensor = before;
    }
    sp.last_unit = u;
    if (u < config.n_layers) {
      b.Layer(u);
    } else if (u == config.n_layers) {
      b.ModelLevel();
    } else if (u == config.n_layers + 1) {
      b.Projector(*vision);
    } else {
      b.Tower(*vision);
    }
    for (size_t i = before; i < b.tensors.size(); ++i) {
      TensorPlan& t = b.tensors[i];
      t.layer = u < config.n_layers ? u : -1;
      t.shard = static_cast<uint32_t>(s);
    }
    sp.tensor_count += b.tensors.size() - before;
  }
  out.tensors = std::move(b.tensors);

  for (size_t s = 0; s < out.shards.size(); ++s) {
    ShardPlan& sp = out.shards[s];
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%06zu.safetensors", s + 1,
                  out.shards.size());
    sp.name = name;
    st::Writer sizer(env, sp.name);
    sizer.SetMetadata(ShardMetadata());
    uint64_t off = 0;
    for (size_t i = sp.first_tensor; i < sp.first_tensor + sp.tensor_count; ++i) {
      TensorPlan& t = out.tensors[i];
      t.begin = off;
      off += t.nbytes;
      sizer.Add(t.name, t.dtype, t.shape);
    }
    sp.data_bytes = off;
    sp.file_size = sizer.FileSize();
    sp.data_offset = sp.file_size - off;
    sizer.Abandon();
    out.total_tensor_bytes += off;
    out.total_file_bytes += sp.file_size;
  }
  for (const TensorPlan& t : out.tensors) {
    if (t.part != ExpertPart::kNone) {
      out.expert_bytes += t.nbytes;
    } else if (IsVisionTensorName(t.name)) {
      out.vision_bytes += t.nbytes;
    } else if (t.layer >= 0) {
      out.trunk_bytes += t.nbytes;
    } else if (t.name == "language_model.model.embed_tokens.weight" ||
               t.name == "language_model.lm_head.weight") {
      out.embed_lm_head_bytes += t.nbytes;
    }
  }
  out.expert_count = static_cast<uint64_t>(config.n_moe_layers()) * U(config.n_experts);
  out.bytes_per_expert = out.expert_count ? out.expert_bytes / out.expert_count : 0;
  return out;
}

}  // namespace k3::synth
