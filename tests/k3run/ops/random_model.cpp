#include "random_model.h"

#include <algorithm>
#include <cmath>

namespace k3::ops::testing {

Dims RandomDims() {
  Dims d;
  d.hidden = 64;
  d.rms_eps = 1e-5f;
  d.kda_heads = 2;
  d.kda_head_dim = 16;
  d.conv_k = 4;
  d.gate_lb = -5.0f;
  d.n_heads = 2;
  d.q_lora = 32;
  d.kv_lora = 32;
  d.qk_nope = 16;
  d.qk_rope = 8;
  d.v_head = 16;
  d.n_experts = 8;
  d.topk = 3;
  d.n_shared = 2;
  d.latent = 32;
  d.moe_inter = 32;
  d.dense_inter = 48;
  d.attn_res_block = 2;
  return d;
}

RandomModel::RandomModel(const Dims& d, uint32_t seed) : d_(d), rng_(seed) {
  for (int64_t e = 0; e < d_.n_experts; ++e) {
    GluWeights g;
    g.gate = Mxfp4(d_.moe_inter, d_.latent);
    g.up = Mxfp4(d_.moe_inter, d_.latent);
    g.down = Mxfp4(d_.latent, d_.moe_inter);
    experts_.push_back(g);
  }
}

Matrix RandomModel::Bf16(int64_t rows, int64_t cols, float scale) {
  std::normal_distribution<float> n(0.0f, scale / std::sqrt(static_cast<float>(cols)));
  auto& v = bf16_.emplace_back(static_cast<size_t>(rows * cols));
  for (auto& x : v) x = kernels::F32ToBf16RoundNearestEven(n(rng_));
  Matrix m{};
  m.type = kernels::WeightType::kBF16;
  m.rows = rows;
  m.cols = cols;
  m.data = v.data();
  return m;
}

Matrix RandomModel::F32(int64_t rows, int64_t cols, float scale) {
  std::normal_distribution<float> n(0.0f, scale / std::sqrt(static_cast<float>(cols)));
  auto& v = f32_.emplace_back(static_cast<size_t>(rows * cols));
  for (auto& x : v) x = n(rng_);
  Matrix m{};
  m.type = kernels::WeightType::kF32;
  m.rows = rows;
  m.cols = cols;
  m.data = v.data();
  return m;
}

Matrix RandomModel::Mxfp4(int64_t rows, int64_t cols) {
  std::uniform_int_distribution<int> byte(0, 255), sc(122, 127);
  auto& packed = u8_.emplace_back(static_cast<size_t>(rows * cols / 2));
  for (auto& b : packed) b = static_cast<uint8_t>(byte(rng_));
  auto& scales = u8_.emplace_back(static_cast<size_t>(rows * cols / 32));
  for (auto& s : scales) s = static_cast<uint8_t>(sc(rng_));
  if (!scales.empty()) scales[0] = 255;  // one zeroed group, as the format allows
  Matrix m{};
  m.type = kernels::WeightType::kMXFP4;
  m.rows = rows;
  m.cols = cols;
  m.data = packed.data();
  m.scales = scales.data();
  return m;
}

Vec RandomModel::Floats(int64_t n, float mean, float scale) {
  std::normal_distribution<float> dist(mean, scale);
  auto& v = f32_.emplace_back(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng_);
  return Vec(v.data(), v.size());
}

std::vector<float> RandomModel::Activations(int64_t n, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng_);
  return v;
}

LayerWeights RandomModel::Layer(bool mla, bool dense) {
  const int64_t E = d_.hidden, P = d_.kda_width(), D = d_.kda_head_dim, H = d_.kda_heads;
  LayerWeights w;
  w.input_layernorm = Floats(E, 1.0f, 0.1f);
  w.post_attention_layernorm = Floats(E, 1.0f, 0.1f);
  w.self_attention_res_norm = Floats(E, 1.0f, 0.1f);
  w.self_attention_res_proj = Floats(E, 0.0f, 0.3f);
  w.mlp_res_norm = Floats(E, 1.0f, 0.1f);
  w.mlp_res_proj = Floats(E, 0.0f, 0.3f);
  w.is_mla = mla;
  if (mla) {
    const int64_t Hm = d_.n_heads;
    w.mla.q_a_proj = Bf16(d_.q_lora, E, 1.0f);
    w.mla.q_a_layernorm = Floats(d_.q_lora, 1.0f, 0.1f);
    w.mla.q_b_proj = Bf16(Hm * d_.qk_head(), d_.q_lora, 2.0f);
    w.mla.kv_a_proj_with_mqa = Bf16(d_.kv_lora + d_.qk_rope, E, 1.0f);
    w.mla.kv_a_layernorm = Floats(d_.kv_lora, 1.0f, 0.1f);
    w.mla.kv_b_proj = Bf16(Hm * d_.kv_head(), d_.kv_lora, 2.0f);
    w.mla.o_proj = Bf16(E, Hm * d_.v_head, 1.0f);
    w.mla.g_proj = Bf16(Hm * d_.v_head, E, 1.0f);
  } else {
    w.kda.q_proj = Bf16(P, E, 1.0f);
    w.kda.k_proj = Bf16(P, E, 1.0f);
    w.kda.v_proj = Bf16(P, E, 1.0f);
    w.kda.f_a_proj = Bf16(D, E, 1.0f);
    w.kda.f_b_proj = Bf16(P, D, 1.0f);
    w.kda.b_proj = Bf16(H, E, 1.0f);
    w.kda.g_proj = Bf16(P, E, 1.0f);
    w.kda.o_proj = Bf16(E, P, 1.0f);
    w.kda.q_conv = Floats(P * d_.conv_k, 0.0f, 0.4f);
    w.kda.k_conv = Floats(P * d_.conv_k, 0.0f, 0.4f);
    w.kda.v_conv = Floats(P * d_.conv_k, 0.0f, 0.4f);
    w.kda.A_log = Floats(std::max(H, D), 0.0f, 0.5f);
    w.kda.dt_bias = Floats(P, 0.0f, 0.5f);
    w.kda.o_norm = Floats(D, 1.0f, 0.1f);
  }
  w.is_dense = dense;
  if (dense) {
    w.dense = {Bf16(d_.dense_inter, E, 3.0f), Bf16(d_.dense_inter, E, 3.0f),
               Bf16(E, d_.dense_inter, 1.0f)};
  } else {
    const int64_t SI = d_.n_shared * d_.moe_inter;
    w.moe.gate = F32(d_.n_experts, E, 1.0f);
    w.moe.score_bias = Floats(d_.n_experts, 0.0f, 0.05f);
    w.moe.down = Bf16(d_.latent, E, 1.0f);
    w.moe.up = Bf16(E, d_.latent, 1.0f);
    w.moe.norm = Floats(d_.latent, 1.0f, 0.1f);
    w.moe.shared = {Bf16(SI, E, 3.0f), Bf16(SI, E, 3.0f), Bf16(E, SI, 1.0f)};
  }
  return w;
}

ExpertTable RandomModel::Experts() const {
  table_.clear();
  for (const GluWeights& g : experts_) table_.push_back(&g);
  return table_;
}

}  // namespace k3::ops::testing
