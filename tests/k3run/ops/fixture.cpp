#include "fixture.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "tests/support/files.h"

namespace k3::ops::testing {

std::string Fixture::Dir() { return std::string(K3_SOURCE_DIR) + "/tests/data/conformance/ops"; }

Fixture Fixture::Load(const std::string& name) {
  const std::string path = Dir() + "/" + name + ".json";
  std::string text;
  if (!::k3::test::ReadWholeFile(path, &text)) {
    throw std::runtime_error("cannot open fixture " + path);
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw std::runtime_error("fixture " + path + " is not valid JSON: " + e.what());
  }
  Fixture f;
  f.name_ = name;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const nlohmann::json& v = it.value();
    if (v.is_number()) {
      f.numbers_[it.key()] = v.get<double>();
    } else if (v.is_boolean()) {
      f.numbers_[it.key()] = v.get<bool>() ? 1.0 : 0.0;
    } else if (v.is_object() && v.contains("shape") && v.contains("data")) {
      Tensor t;
      int64_t n = 1;
      for (const auto& s : v["shape"]) {
        t.shape.push_back(s.get<int64_t>());
        n *= t.shape.back();
      }
      t.data.reserve(static_cast<size_t>(n));
      for (const auto& x : v["data"]) t.data.push_back(static_cast<float>(x.get<double>()));
      if (static_cast<int64_t>(t.data.size()) != n) {
        throw std::runtime_error("fixture " + name + " field " + it.key() + ": " +
                                 std::to_string(t.data.size()) + " values for shape of " +
                                 std::to_string(n));
      }
      f.tensors_[it.key()] = std::move(t);
    }
  }
  return f;
}

bool Fixture::Has(const std::string& field) const {
  return tensors_.count(field) > 0 || numbers_.count(field) > 0;
}

const Tensor& Fixture::T(const std::string& field) const {
  auto it = tensors_.find(field);
  if (it == tensors_.end())
    throw std::runtime_error("fixture " + name_ + ": no array field '" + field + "'");
  return it->second;
}

double Fixture::Num(const std::string& field) const {
  auto it = numbers_.find(field);
  if (it == numbers_.end())
    throw std::runtime_error("fixture " + name_ + ": no number field '" + field + "'");
  return it->second;
}

Matrix Fixture::F32(const std::string& field) const {
  const Tensor& t = T(field);
  Matrix m{};
  m.type = kernels::WeightType::kF32;
  m.rows = t.shape.empty() ? 1 : t.shape[0];
  m.cols = static_cast<int64_t>(t.data.size()) / (m.rows > 0 ? m.rows : 1);
  m.data = t.data.data();
  return m;
}

Vec Fixture::V(const std::string& field) const {
  const Tensor& t = T(field);
  return Vec(t.data.data(), t.data.size());
}

namespace {
nlohmann::json Manifest() {
  const std::string path = Fixture::Dir() + "/MANIFEST.json";
  std::string text;
  if (!::k3::test::ReadWholeFile(path, &text)) throw std::runtime_error("cannot open " + path);
  return nlohmann::json::parse(text);
}
}  // namespace

Dims ManifestDims() {
  const nlohmann::json c = Manifest().at("config");
  Dims d;
  d.hidden = c.at("hidden_size").get<int64_t>();
  d.rms_eps = static_cast<float>(c.at("rms_norm_eps").get<double>());
  d.kda_heads = c.at("kda_num_heads").get<int64_t>();
  d.kda_head_dim = c.at("kda_head_dim").get<int64_t>();
  d.conv_k = c.at("short_conv_kernel_size").get<int64_t>();
  d.gate_lb = static_cast<float>(c.at("gate_lower_bound").get<double>());
  d.n_heads = c.at("num_attention_heads").get<int64_t>();
  d.q_lora = c.at("q_lora_rank").get<int64_t>();
  d.kv_lora = c.at("kv_lora_rank").get<int64_t>();
  d.qk_nope = c.at("qk_nope_head_dim").get<int64_t>();
  d.qk_rope = c.at("qk_rope_head_dim").get<int64_t>();
  d.v_head = c.at("v_head_dim").get<int64_t>();
  d.mla_out_gate = c.at("mla_use_output_gate").get<bool>();
  // The fixtures were made with rms_norm_eps for the MLA latent norms (README "Known difference").
  d.mla_latent_eps = d.rms_eps;
  d.n_experts = c.at("num_experts").get<int64_t>();
  d.topk = c.at("num_experts_per_token").get<int64_t>();
  d.n_shared = c.at("num_shared_experts").get<int64_t>();
  d.latent = c.at("routed_expert_hidden_size").get<int64_t>();
  d.moe_inter = c.at("moe_intermediate_size").get<int64_t>();
  d.routed_scale = static_cast<float>(c.at("routed_scaling_factor").get<double>());
  d.moe_renorm = c.at("moe_renormalize").get<bool>();
  d.latent_norm = c.at("latent_moe_use_norm").get<bool>();
  d.first_dense = c.at("first_k_dense_replace").get<int64_t>();
  d.dense_inter = c.at("intermediate_size").get<int64_t>();
  d.attn_res_block = c.at("attn_res_block_size").get<int64_t>();
  d.situ_b1 = static_cast<float>(c.at("situ_beta").get<double>());
  d.situ_b2 = static_cast<float>(c.at("situ_linear_beta").get<double>());
  return d;
}

Tolerance ManifestTolerance() {
  static const Tolerance tol = [] {
    const nlohmann::json t = Manifest().at("tolerance");
    return Tolerance{t.at("fp32_abs").get<double>(), t.at("fp32_rel").get<double>()};
  }();
  return tol;
}

::testing::AssertionResult AllNear(const std::string& fixture, const std::string& field,
                                   const float* got, const std::vector<float>& want,
                                   Tolerance tol) {
  std::ostringstream msg;
  int64_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], w = want[i];
    const double bound = tol.abs + tol.rel * std::fabs(w);
    const double diff = std::fabs(g - w);
    if (!(diff <= bound)) {  // NaN counts as a mismatch
      if (bad < 8) {
        msg << "\n  " << fixture << "." << field << "[" << i << "]: got " << g << " want " << w
            << " (|diff| " << diff << " > bound " << bound << ")";
      }
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << fixture << "." << field << ": " << bad << " of "
                                       << want.size() << " elements outside |got-want| <= "
                                       << tol.abs << " + " << tol.rel << "*|want|" << msg.str();
}

::testing::AssertionResult MaxAbsWithin(const std::string& fixture, const std::string& field,
                                        const float* got, const std::vector<float>& want,
                                        double bound) {
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(diff <= worst)) {
      worst = diff;
      at = i;
    }
  }
  if (worst <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << fixture << "." << field << "[" << at << "]: got " << got[at] << " want " << want[at]
         << " (max |diff| " << worst << " > " << bound << ")";
}

double WorstRatio(const float* got, const std::vector<float>& want, Tolerance tol) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double r = std::fabs(static_cast<double>(got[i]) - want[i]) /
                     (tol.abs + tol.rel * std::fabs(static_cast<double>(want[i])));
    if (!(r <= worst)) worst = r;
  }
  return worst;
}

}  // namespace k3::ops::testing
