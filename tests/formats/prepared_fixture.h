// Test fixtures for the prepared-format tests: a small config with dense, KDA, MLA and MoE layers,
// and its checkpoint tensor list written out BY HAND from spec/MODEL.md §2 (not from
// ExpectedLayerTensors), so the layout code is checked against an independent statement.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <filesystem>
#include <fstream>

#include "common/hash.h"
#include "formats/config.h"
#include "formats/experts_index.h"
#include "formats/prepared_layout.h"
#include "formats/prepared_manifest.h"

namespace k3::test {

// Test-only header: the prepared-format names are used unqualified below.
using namespace ::k3::prepared;  // NOLINT

// 4 layers: L0 dense KDA, L1 MoE MLA, L2 MoE KDA, L3 MoE MLA. hidden 64, KDA 2x16 (P = 32),
// MLA 2 heads (q_lora 32, kv_lora 16, nope 8, rope 8, v 16), 4 experts, 1 shared, latent 32,
// moe_inter 64, dense 48, vocab 96.
inline constexpr char kTinyFlatConfig[] = R"({
  "hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 96, "rms_norm_eps": 1e-5,
  "kda_num_heads": 2, "kda_head_dim": 16, "short_conv_kernel_size": 4, "gate_lower_bound": -5.0,
  "num_attention_heads": 2, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
  "qk_rope_head_dim": 8, "v_head_dim": 16, "num_experts": 4, "num_experts_per_token": 2,
  "num_shared_experts": 1, "routed_expert_hidden_size": 32, "moe_intermediate_size": 64,
  "routed_scaling_factor": 1.0, "first_k_dense_replace": 1, "intermediate_size": 48,
  "attn_res_block_size": 2, "situ_beta": 4.0, "situ_linear_beta": 25.0,
  "full_attn_layers": [2, 4]
})";

inline ModelConfig TinyConfig() {
  Result<ModelConfig> c = ParseModelConfig(kTinyFlatConfig, "tiny test config");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  ModelConfig out = c.ok() ? c.value() : ModelConfig{};
  out.experts_mxfp4 = true;  // what pack resolves from U8 expert tensors
  return out;
}

inline std::string L(int layer, const std::string& rest) {
  return "language_model.model.layers." + std::to_string(layer) + "." + rest;
}

// The checkpoint's tensors in a shard-like (not canonical) order.
inline std::vector<TensorSpec> TinyTensors() {
  const DType b = DType::kBF16, f = DType::kF32, u = DType::kU8;
  std::vector<TensorSpec> t;
  auto add = [&](std::string name, DType d, std::vector<uint64_t> shape) {
    t.push_back(TensorSpec{std::move(name), d, std::move(shape)});
  };
  add("language_model.model.embed_tokens.weight", b, {96, 64});
  add("language_model.lm_head.weight", b, {96, 64});
  add("language_model.model.norm.weight", b, {64});
  add("language_model.model.output_attn_res_norm.weight", b, {64});
  add("language_model.model.output_attn_res_proj.weight", b, {1, 64});
  for (int layer = 0; layer < 4; ++layer) {
    // Reverse of the canonical order on purpose.
    add(L(layer, "mlp_res_proj.weight"), b, {1, 64});
    add(L(layer, "mlp_res_norm.weight"), b, {64});
    add(L(layer, "self_attention_res_proj.weight"), b, {1, 64});
    add(L(layer, "self_attention_res_norm.weight"), b, {64});
    add(L(layer, "post_attention_layernorm.weight"), b, {64});
    add(L(layer, "input_layernorm.weight"), b, {64});
    if (layer == 1 || layer == 3) {  // MLA
      add(L(layer, "self_attn.q_a_proj.weight"), b, {32, 64});
      add(L(layer, "self_attn.q_a_layernorm.weight"), b, {32});
      add(L(layer, "self_attn.q_b_proj.weight"), b, {2 * 16, 32});
      add(L(layer, "self_attn.kv_a_proj_with_mqa.weight"), b, {16 + 8, 64});
      add(L(layer, "self_attn.kv_a_layernorm.weight"), b, {16});
      add(L(layer, "self_attn.kv_b_proj.weight"), b, {2 * 24, 16});
      add(L(layer, "self_attn.o_proj.weight"), b, {64, 32});
      add(L(layer, "self_attn.g_proj.weight"), b, {32, 64});
    } else {  // KDA
      add(L(layer, "self_attn.q_proj.weight"), b, {32, 64});
      add(L(layer, "self_attn.k_proj.weight"), b, {32, 64});
      add(L(layer, "self_attn.v_proj.weight"), b, {32, 64});
      add(L(layer, "self_attn.q_conv1d.weight"), f, {32, 1, 4});
      add(L(layer, "self_attn.k_conv1d.weight"), f, {32, 1, 4});
      add(L(layer, "self_attn.v_conv1d.weight"), f, {32, 1, 4});
      add(L(layer, "self_attn.f_a_proj.weight"), b, {16, 64});
      add(L(layer, "self_attn.f_b_proj.weight"), b, {32, 16});
      add(L(layer, "self_attn.b_proj.weight"), b, {2, 64});
      add(L(layer, "self_attn.A_log"), f, {16});  // head_dim entries, zero-padded
      add(L(layer, "self_attn.dt_bias"), f, {32});
      add(L(layer, "self_attn.g_proj.weight"), b, {32, 64});
      add(L(layer, "self_attn.o_norm.weight"), f, {16});
      add(L(layer, "self_attn.o_proj.weight"), b, {64, 32});
    }
    if (layer == 0) {
      add(L(0, "mlp.gate_proj.weight"), b, {48, 64});
      add(L(0, "mlp.up_proj.weight"), b, {48, 64});
      add(L(0, "mlp.down_proj.weight"), b, {64, 48});
      continue;
    }
    add(L(layer, "block_sparse_moe.gate.weight"), b, {4, 64});
    add(L(layer, "block_sparse_moe.gate.e_score_correction_bias"), f, {4});
    add(L(layer, "block_sparse_moe.routed_expert_down_proj.weight"), b, {32, 64});
    add(L(layer, "block_sparse_moe.routed_expert_up_proj.weight"), b, {64, 32});
    add(L(layer, "block_sparse_moe.routed_expert_norm.weight"), b, {32});
    add(L(layer, "block_sparse_moe.shared_experts.gate_proj.weight"), b, {64, 64});
    add(L(layer, "block_sparse_moe.shared_experts.up_proj.weight"), b, {64, 64});
    add(L(layer, "block_sparse_moe.shared_experts.down_proj.weight"), b, {64, 64});
    for (int e = 0; e < 4; ++e) {
      const std::string x = "block_sparse_moe.experts." + std::to_string(e) + ".";
      // w1/w3: [moe_inter 64][latent 32] → packed [64][16], scale [64][1];
      // w2: [latent 32][moe_inter 64] → packed [32][32], scale [32][2].
      add(L(layer, x + "w1.weight_packed"), u, {64, 16});
      add(L(layer, x + "w1.weight_scale"), u, {64, 1});
      add(L(layer, x + "w2.weight_packed"), u, {32, 32});
      add(L(layer, x + "w2.weight_scale"), u, {32, 2});
      add(L(layer, x + "w3.weight_packed"), u, {64, 16});
      add(L(layer, x + "w3.weight_scale"), u, {64, 1});
    }
  }
  add("vision_tower.some.weight", f, {3});  // not the language model: ignored
  return t;
}

// 1024 + 64 + 1024 + 64 + 1024 + 64
inline constexpr uint64_t kTinyExpertBytes = 3264;

// Test-only file writing (tests may use the standard library for setup).
inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Deterministic filler so hashes differ between files.
inline std::string Filler(uint64_t n, char seed) {
  std::string s(n, '\0');
  for (uint64_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + static_cast<char>(i * 31 % 251));
  return s;
}

// Writes a complete prepared directory for the tiny config into `dir` the way pack will (minus
// reading a checkpoint): trunk.bin, resident.bin, experts (copy mode: experts/layer-*.bin;
// link mode: one shard "model.safetensors" in `model_dir`), experts.idx, a tokenizer file,
// k3.json and k3.sum. Returns the manifest it wrote.
inline Manifest BuildPrepared(const std::string& dir, ExpertsMode mode,
                              const std::string& model_dir = "/nonexistent-model-dir") {
  Manifest m;
  m.config = TinyConfig();
  Result<Layout> layout = BuildLayout(m.config, TinyTensors());
  EXPECT_TRUE(layout.ok()) << layout.status().ToString();
  if (!layout.ok()) return m;
  const std::string trunk = Filler(layout->trunk_bytes, 1);
  const std::string resident = Filler(layout->resident_bytes, 2);
  const std::string tok = "dGVzdA== 0\n";
  WriteBytes(dir + "/trunk.bin", trunk);
  WriteBytes(dir + "/resident.bin", resident);
  WriteBytes(dir + "/tokenizer/tiktoken.model", tok);
  for (Region r : layout->trunk) {
    r.xxh3_128 = Xxh3_128(trunk.data() + r.offset, r.length);
    m.regions.push_back(r);
  }
  for (Region r : layout->resident) {
    r.xxh3_128 = Xxh3_128(resident.data() + r.offset, r.length);
    m.regions.push_back(r);
  }
  m.runs = layout->runs;
  m.experts_mode = mode;
  m.source.model_dir_abs = model_dir;
  m.source.model_dir_given = "tiny";

  ExpertsIndex idx;
  idx.n_layers = 4;
  idx.first_moe_layer = 1;
  idx.n_experts = 4;
  const auto sizes = ExpertSubSizes(m.config);
  if (mode == ExpertsMode::kCopy) {
    ExpertPlan plan = PlanCopyExperts(m.config, {});
    for (size_t f = 0; f < plan.files.size(); ++f) {
      WriteBytes(dir + "/" + plan.files[f], Filler(plan.file_sizes[f], static_cast<char>(f)));
      m.expert_files.push_back(FileEntry{plan.files[f], plan.file_sizes[f]});
    }
    idx.files = plan.files;
    for (const ExpertSlot& s : plan.slots) {
      idx.records.push_back(MakeExpertRecord(s.file_id, s.offset, sizes, 0));
    }
    m.source.shards.push_back(SourceShard{"model.safetensors", 123456, ""});
  } else {
    // One shard: an 8-byte prefix and a small header, then experts back to back.
    const uint64_t base = 1000;
    const uint64_t shard_size = base + 12 * kTinyExpertBytes;
    WriteBytes(model_dir + "/model.safetensors", Filler(shard_size, 9));
    m.source.shards.push_back(SourceShard{"model.safetensors", shard_size, std::string(64, 'e')});
    m.expert_files.push_back(FileEntry{"model.safetensors", shard_size});
    idx.files = {"model.safetensors"};
    for (uint64_t i = 0; i < 12; ++i) {
      idx.records.push_back(MakeExpertRecord(0, base + i * kTinyExpertBytes, sizes, 0));
    }
  }
  const std::string idx_bytes = EncodeExpertsIndex(idx);
  WriteBytes(dir + "/experts.idx", idx_bytes);
  m.files = {FileEntry{"trunk.bin", trunk.size()}, FileEntry{"resident.bin", resident.size()},
             FileEntry{"experts.idx", idx_bytes.size()},
             FileEntry{"tokenizer/tiktoken.model", tok.size()}};
  m.regions.push_back(Region{"experts.idx", "experts.idx", 0, idx_bytes.size(), DType::kU8,
                             {idx_bytes.size()}, Xxh3_128(idx_bytes.data(), idx_bytes.size())});
  m.regions.push_back(Region{"tokenizer/tiktoken.model", "tokenizer/tiktoken.model", 0,
                             tok.size(), DType::kU8, {tok.size()},
                             Xxh3_128(tok.data(), tok.size())});
  Status s = WriteManifestAndSum(Env::Default(), dir, m);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return m;
}

}  // namespace k3::test
