// Weight views over conformance fixtures for the block-level cases (mla, moe, layer_*).
#pragma once

#include <string>
#include <vector>

#include "fixture.h"
#include "k3run/ops/moe.h"
#include "k3run/ops/weights.h"

namespace k3::ops::testing {

// kda_layer*.json short names (q_proj, f_a, q_conv, ...) or, with layer_names, the
// layer_kda.json state_dict names (self_attn_q_proj_weight, ...).
KdaWeights KdaFrom(const Fixture& f, bool layer_names);

// `p` is the field prefix: "" for mla.json, "self_attn_" for layer_mla.json.
MlaWeights MlaFrom(const Fixture& f, const std::string& p);

// MoE weights and the F32 routed experts; `p` is "" (moe.json) or "mlp_" (layer_*.json).
struct FixtureMoe {
  MoeWeights w;
  std::vector<GluWeights> experts;
  ExpertTable Lookup() const {
    table.clear();
    for (const GluWeights& g : experts) table.push_back(&g);
    return table;
  }
  mutable std::vector<const GluWeights*> table;
};
FixtureMoe MoeFrom(const Fixture& f, const std::string& p, int64_t n_experts);

}  // namespace k3::ops::testing
