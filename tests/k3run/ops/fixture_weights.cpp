#include "fixture_weights.h"

namespace k3::ops::testing {

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
