#include "fixture_weights.h"

namespace k3::ops::testing {

KdaWeights KdaFrom(const Fixture& f, bool layer_names) {
  auto n = [&](const char* short_name, const char* dict_name) {
    return layer_names ? std::string("self_attn_") + dict_name : std::string(short_name);
  };
  KdaWeights w;
  w.q_proj = f.F32(n("q_proj", "q_proj_weight"));
  w.k_proj = f.F32(n("k_proj", "k_proj_weight"));
  w.v_proj = f.F32(n("v_proj", "v_proj_weight"));
  w.f_a_proj = f.F32(n("f_a", "f_a_proj_weight"));
  w.f_b_proj = f.F32(n("f_b", "f_b_proj_weight"));
  w.b_proj = f.F32(n("b_proj", "b_proj_weight"));
  w.g_proj = f.F32(n("g_proj", "g_proj_weight"));
  w.o_proj = f.F32(n("o_proj", "o_proj_weight"));
  w.q_conv = f.V(n("q_conv", "q_conv1d_weight"));
  w.k_conv = f.V(n("k_conv", "k_conv1d_weight"));
  w.v_conv = f.V(n("v_conv", "v_conv1d_weight"));
  w.A_log = f.V(n("A_log", "A_log"));
  w.dt_bias = f.V(n("dt_bias", "dt_bias"));
  w.o_norm = f.V(n("o_norm", "o_norm_weight"));
  return w;
}

MlaWeights MlaFrom(const Fixture& f, const std::string& p) {
  MlaWeights w;
  w.q_a_proj = f.F32(p + "q_a_proj_weight");
  w.q_a_layernorm = f.V(p + "q_a_layernorm_weight");
  w.q_b_proj = f.F32(p + "q_b_proj_weight");
  w.kv_a_proj_with_mqa = f.F32(p + "kv_a_proj_with_mqa_weight");
  w.kv_a_layernorm = f.V(p + "kv_a_layernorm_weight");
  w.kv_b_proj = f.F32(p + "kv_b_proj_weight");
  w.o_proj = f.F32(p + "o_proj_weight");
  w.g_proj = f.F32(p + "g_proj_weight");
  return w;
}

FixtureMoe MoeFrom(const Fixture& f, const std::string& p, int64_t n_experts) {
  FixtureMoe m;
  m.w.gate = f.F32(p + "gate_weight");
  m.w.score_bias = f.V(p + "e_score_correction_bias");
  m.w.down = f.F32(p + "down_weight");
  m.w.up = f.F32(p + "up_weight");
  m.w.norm = f.V(p + "norm_weight");
  m.w.shared.gate = f.F32(p + "shared_w1_weight");
  m.w.shared.up = f.F32(p + "shared_w3_weight");
  m.w.shared.down = f.F32(p + "shared_w2_weight");
  for (int64_t e = 0; e < n_experts; ++e) {
    const std::string base = p + "experts_" + std::to_string(e) + "_";
    GluWeights g;
    g.gate = f.F32(base + "w1_weight");
    g.up = f.F32(base + "w3_weight");
    g.down = f.F32(base + "w2_weight");
    m.experts.push_back(g);
  }
  return m;
}

}  // namespace k3::ops::testing
