// k3prep synth: presets, --set overrides and the layout (names, dtypes, shapes, placement),
// checked against the released index and DESIGN.md §8's numbers (never against our own output).
#include "k3prep/synth/layout.h"

#include <cstdio>
#include <map>
#include <regex>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/env.h"
#include "k3prep/cli.h"
#include "k3prep/synth/checkpoint.h"
#include "k3prep/synth/presets.h"
#include "tests/support/temp_dir.h"

namespace k3::synth {
namespace {

using json = nlohmann::json;

// The released index (tests/data/kimi-k3/model.safetensors.index.json.gz), decompressed with
// gzip(1) so the tests need no zlib binding.
json ReleasedIndex() {
  const std::string cmd =
      std::string("gzip -dc '") + K3_SOURCE_DIR + "/tests/data/kimi-k3/model.safetensors.index.json.gz'";
  std::string text;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
    pclose(p);
  }
  return nlohmann::json::parse(text);
}

// The preset's layout with its vision part (synth's default) unless `vision` is false.
Layout MustLayout(const std::string& preset, SmallDType small = SmallDType::kMixed,
                  int shards = 0, std::vector<std::string> sets = {}, bool vision = true) {
  Result<ModelConfig> base = PresetConfig(preset);
  EXPECT_TRUE(base.ok()) << base.status().ToString();
  Result<ModelConfig> c = ApplyOverrides(*base, sets);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  Result<VisionConfig> v = PresetVision(preset, c->hidden);
  EXPECT_TRUE(v.ok()) << v.status().ToString();
  Result<Layout> l = BuildLayout(Env::Default(), *c, small, shards, vision ? &*v : nullptr);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return std::move(l).value();
}

const TensorPlan* FindTensor(const Layout& l, const std::string& name) {
  for (const TensorPlan& t : l.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// ---- the full preset against the release (DESIGN.md §8 "Full dry-run facts") ----

class FullLayout : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { layout_ = new Layout(MustLayout("full")); }
  static void TearDownTestSuite() { delete layout_; }
  static Layout* layout_;
};
Layout* FullLayout::layout_ = nullptr;

TEST_F(FullLayout, PerShardTensorCountsAreTheReleasedOnes) {
  const Layout& l = *layout_;
  ASSERT_EQ(l.shards.size(), 96u);
  EXPECT_EQ(l.shards.front().name, "model-00001-of-000096.safetensors");
  EXPECT_EQ(l.shards.back().name, "model-00096-of-000096.safetensors");
  EXPECT_EQ(l.shards[0].tensor_count, 23u);
  for (int L = 1; L < 93; ++L) {
    const size_t want = l.config.is_mla(L) ? 5398u : 5404u;
    EXPECT_EQ(l.shards[static_cast<size_t>(L)].tensor_count, want) << "layer " << L;
  }
  EXPECT_EQ(l.shards[93].tensor_count, 5u);
  EXPECT_EQ(l.shards[94].tensor_count, 3u);    // the projector
  EXPECT_EQ(l.shards[95].tensor_count, 165u);  // the tower: 27 blocks × 6 + 3
  EXPECT_EQ(l.shards[1].tensor_count, 5404u);  // layer 1: KDA
  EXPECT_EQ(l.shards[3].tensor_count, 5398u);  // layer 3: MLA
}

TEST_F(FullLayout, ExpertsAre82432Of17547264Bytes) {
  EXPECT_EQ(layout_->expert_count, 82432u);
  EXPECT_EQ(layout_->bytes_per_expert, 17547264u);
  EXPECT_EQ(layout_->expert_bytes, 82432ull * 17547264ull);
}

TEST_F(FullLayout, TrunkIs108_81GB) {
  const double gb = static_cast<double>(layout_->trunk_bytes) / 1e9;
  EXPECT_NEAR(gb, 108.81, 0.005);
}

TEST_F(FullLayout, EmbedPlusLmHeadIs4_70GB) {
  const double gb = static_cast<double>(layout_->embed_lm_head_bytes) / 1e9;
  EXPECT_NEAR(gb, 4.70, 4.70 * 0.005);
}

TEST_F(FullLayout, NameSetAndShardOfEveryTensorMatchTheReleasedIndex) {
  const json released = ReleasedIndex();
  ASSERT_TRUE(released.contains("weight_map"));
  // Released shard number of every tensor, the vision tower and projector included.
  std::map<std::string, int> want;
  const std::regex shard_re("model-(\\d+)-of-(\\d+)\\.safetensors");
  for (const auto& [name, shard] : released["weight_map"].items()) {
    std::smatch m;
    const std::string s = shard.get<std::string>();
    ASSERT_TRUE(std::regex_match(s, m, shard_re)) << s;
    want[name] = std::stoi(m[1].str());
  }
  ASSERT_EQ(want.size(), layout_->tensors.size());
  size_t wrong_shard = 0;
  for (const TensorPlan& t : layout_->tensors) {
    const auto it = want.find(t.name);
    ASSERT_NE(it, want.end()) << "not in the release: " << t.name;
    if (it->second != static_cast<int>(t.shard) + 1) {
      if (++wrong_shard < 5) ADD_FAILURE() << t.name << " in shard " << t.shard + 1
                                           << ", released in " << it->second;
    }
  }
  EXPECT_EQ(wrong_shard, 0u);
}

// Layer 0 (dense KDA), a KDA MoE layer and an MLA MoE layer: the exact released name sets.
TEST_F(FullLayout, PerLayerNameSetsMatchTheRelease) {
  const json released = ReleasedIndex();
  for (int L : {0, 1, 3, 91, 92}) {
    const std::string p = LayerPrefix(L);
    std::set<std::string> want, got;
    for (const auto& [name, shard] : released["weight_map"].items()) {
      if (name.rfind(p, 0) == 0) want.insert(name);
    }
    for (const TensorPlan& t : layout_->tensors) {
      if (t.name.rfind(p, 0) == 0) got.insert(t.name);
    }
    EXPECT_EQ(got, want) << "layer " << L;
  }
}

TEST_F(FullLayout, EachExpertIsOneContiguousRunInCanonicalOrder) {
  const Layout& l = *layout_;
  const ShardPlan& sp = l.shards[5];
  static const char* kOrder[6] = {"w1.weight_packed", "w1.weight_scale", "w2.weight_packed",
                                  "w2.weight_scale",  "w3.weight_packed", "w3.weight_scale"};
  size_t first_expert = 0;
  for (size_t i = sp.first_tensor; i < sp.first_tensor + sp.tensor_count; ++i) {
    if (l.tensors[i].part != ExpertPart::kNone) { first_expert = i; break; }
  }
  ASSERT_GT(first_expert, sp.first_tensor);
  // Trunk first, then experts 0..895, six tensors each, back to back.
  for (size_t i = sp.first_tensor; i < first_expert; ++i) {
    EXPECT_EQ(l.tensors[i].part, ExpertPart::kNone);
  }
  for (int e = 0; e < 896; ++e) {
    for (int k = 0; k < 6; ++k) {
      const TensorPlan& t = l.tensors[first_expert + static_cast<size_t>(e * 6 + k)];
      EXPECT_EQ(t.name, LayerPrefix(5) + "block_sparse_moe.experts." + std::to_string(e) + "." +
                            kOrder[k]);
      if (k > 0) {
        const TensorPlan& prev = l.tensors[first_expert + static_cast<size_t>(e * 6 + k - 1)];
        EXPECT_EQ(t.begin, prev.begin + prev.nbytes);
      }
    }
  }
}

TEST_F(FullLayout, ExpertShapesFollowModelMd) {
  const std::string p = LayerPrefix(1) + "block_sparse_moe.experts.7.";
  const TensorPlan* w1p = FindTensor(*layout_, p + "w1.weight_packed");
  const TensorPlan* w1s = FindTensor(*layout_, p + "w1.weight_scale");
  const TensorPlan* w2p = FindTensor(*layout_, p + "w2.weight_packed");
  const TensorPlan* w2s = FindTensor(*layout_, p + "w2.weight_scale");
  ASSERT_TRUE(w1p && w1s && w2p && w2s);
  EXPECT_EQ(w1p->shape, (std::vector<uint64_t>{3072, 1792}));
  EXPECT_EQ(w1s->shape, (std::vector<uint64_t>{3072, 112}));
  EXPECT_EQ(w2p->shape, (std::vector<uint64_t>{3584, 1536}));
  EXPECT_EQ(w2s->shape, (std::vector<uint64_t>{3584, 96}));
  EXPECT_EQ(w1p->dtype, DType::kU8);
  EXPECT_EQ(w1s->dtype, DType::kU8);
}

// ---- the other presets (DESIGN.md §8 table) ----

TEST(SynthPresets, BenchIs18_8GBWithExpertsOf208896Bytes) {
  const Layout l = MustLayout("bench");
  EXPECT_EQ(l.bytes_per_expert, 208896u);
  EXPECT_NEAR(static_cast<double>(l.total_file_bytes - l.vision_bytes) / 1e9, 18.8, 0.05);
  EXPECT_NEAR(static_cast<double>(l.vision_bytes) / 1e9, 0.049, 0.001);
  EXPECT_NEAR(static_cast<double>(l.expert_bytes) / 1e9, 17.22, 0.005);
  EXPECT_NEAR(static_cast<double>(l.trunk_bytes) / 1e9, 1.05, 0.005);
  EXPECT_NEAR(static_cast<double>(l.embed_lm_head_bytes) / 1e9, 0.50, 0.005);
}

TEST(SynthPresets, SmallIsAbout280MBWithExpertsOf26112Bytes) {
  const Layout l = MustLayout("small");
  EXPECT_EQ(l.bytes_per_expert, 26112u);
  EXPECT_EQ(l.shards.size(), 96u);
  EXPECT_NEAR(static_cast<double>(l.total_file_bytes) / 1e6, 280, 20);
  EXPECT_EQ(l.config.full_attn_layers, ReleasedFullAttnLayers());
}

TEST(SynthPresets, TinyHasTheTableDimensions) {
  Result<ModelConfig> c = PresetConfig("tiny");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->hidden, 128);
  EXPECT_EQ(c->n_layers, 13);
  EXPECT_EQ(c->full_attn_layers, (std::vector<int>{4, 8, 12, 13}));
  EXPECT_EQ(c->vocab, 1280);
  EXPECT_EQ(c->moe_inter, 64);
  EXPECT_EQ(c->attn_res_block, 3);
  // DESIGN.md §8 special ids for vocab 1280.
  EXPECT_EQ(c->bos_token_id, 1024);
  EXPECT_EQ(c->eos_token_id, 1026);
  EXPECT_EQ(c->pad_token_id, 1279);
  EXPECT_EQ(c->media_placeholder_token_id, 1045);
}

TEST(SynthPresets, UnknownPresetIsRejectedNamingTheFlag) {
  Result<ModelConfig> c = PresetConfig("huge");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kInvalid);
  EXPECT_NE(c.status().message().find("--preset 'huge'"), std::string::npos);
}

// ---- tiny: shapes and dtypes per layer type ----

TEST(SynthLayoutTiny, KdaLayerShapesAndMixedDtypes) {
  const Layout l = MustLayout("tiny");
  const std::string p = LayerPrefix(1) + "self_attn.";
  struct Want { const char* name; DType dtype; std::vector<uint64_t> shape; };
  const Want wants[] = {
      {"q_proj.weight", DType::kBF16, {64, 128}},   {"q_conv1d.weight", DType::kF32, {64, 1, 4}},
      {"f_a_proj.weight", DType::kBF16, {16, 128}}, {"f_b_proj.weight", DType::kBF16, {64, 16}},
      {"b_proj.weight", DType::kBF16, {4, 128}},    {"A_log", DType::kF32, {16}},
      {"dt_bias", DType::kF32, {64}},               {"o_norm.weight", DType::kF32, {16}},
      {"g_proj.weight", DType::kBF16, {64, 128}},   {"o_proj.weight", DType::kBF16, {128, 64}},
  };
  for (const Want& w : wants) {
    const TensorPlan* t = FindTensor(l, p + w.name);
    ASSERT_NE(t, nullptr) << w.name;
    EXPECT_EQ(t->dtype, w.dtype) << w.name;
    EXPECT_EQ(t->shape, w.shape) << w.name;
  }
  const TensorPlan* norm = FindTensor(l, LayerPrefix(1) + "input_layernorm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->dtype, DType::kBF16);
  const TensorPlan* bias = FindTensor(l, LayerPrefix(1) + "block_sparse_moe.gate.e_score_correction_bias");
  ASSERT_NE(bias, nullptr);
  EXPECT_EQ(bias->dtype, DType::kF32);
  EXPECT_EQ(bias->shape, (std::vector<uint64_t>{8}));
}

TEST(SynthLayoutTiny, MlaLayerShapes) {
  const Layout l = MustLayout("tiny");
  const std::string p = LayerPrefix(3) + "self_attn.";  // one-based 4 → MLA
  struct Want { const char* name; std::vector<uint64_t> shape; };
  const Want wants[] = {
      {"q_a_proj.weight", {64, 128}},  {"q_a_layernorm.weight", {64}},
      {"q_b_proj.weight", {128, 64}},  {"kv_a_proj_with_mqa.weight", {40, 128}},
      {"kv_a_layernorm.weight", {32}}, {"kv_b_proj.weight", {160, 32}},
      {"o_proj.weight", {128, 64}},    {"g_proj.weight", {64, 128}},
  };
  for (const Want& w : wants) {
    const TensorPlan* t = FindTensor(l, p + w.name);
    ASSERT_NE(t, nullptr) << w.name;
    EXPECT_EQ(t->shape, w.shape) << w.name;
  }
  EXPECT_EQ(FindTensor(l, p + "q_proj.weight"), nullptr);
  EXPECT_EQ(FindTensor(l, p + "A_log"), nullptr);
}

TEST(SynthLayoutTiny, DenseLayerZeroAndMoeShapes) {
  const Layout l = MustLayout("tiny");
  const TensorPlan* gate = FindTensor(l, LayerPrefix(0) + "mlp.gate_proj.weight");
  const TensorPlan* down = FindTensor(l, LayerPrefix(0) + "mlp.down_proj.weight");
  ASSERT_TRUE(gate && down);
  EXPECT_EQ(gate->shape, (std::vector<uint64_t>{96, 128}));
  EXPECT_EQ(down->shape, (std::vector<uint64_t>{128, 96}));
  EXPECT_EQ(FindTensor(l, LayerPrefix(0) + "block_sparse_moe.gate.weight"), nullptr);
  const std::string m = LayerPrefix(5) + "block_sparse_moe.";
  const TensorPlan* shared = FindTensor(l, m + "shared_experts.gate_proj.weight");
  const TensorPlan* w2 = FindTensor(l, m + "experts.7.w2.weight_packed");
  ASSERT_TRUE(shared && w2);
  EXPECT_EQ(shared->shape, (std::vector<uint64_t>{128, 128}));  // 2 shared × 64
  EXPECT_EQ(w2->shape, (std::vector<uint64_t>{64, 32}));
  EXPECT_EQ(FindTensor(l, m + "experts.8.w1.weight_packed"), nullptr);
}

TEST(SynthLayoutTiny, SmallDtypeF32MakesEverySmallVectorF32) {
  const Layout l = MustLayout("tiny", SmallDType::kF32);
  size_t small = 0;
  for (const TensorPlan& t : l.tensors) {
    const bool is_small = t.shape.size() == 1 || t.name.find("conv1d") != std::string::npos ||
                          t.name.find("res_proj") != std::string::npos;
    if (is_small) {
      ++small;
      EXPECT_EQ(t.dtype, DType::kF32) << t.name;
    } else if (t.part == ExpertPart::kNone) {
      EXPECT_EQ(t.dtype, DType::kBF16) << t.name;
    }
  }
  EXPECT_GT(small, 100u);
}

TEST(SynthLayoutTiny, SmallDtypeBf16MakesEverySmallVectorBf16) {
  const Layout l = MustLayout("tiny", SmallDType::kBF16);
  for (const TensorPlan& t : l.tensors) {
    if (t.part == ExpertPart::kNone) {
      EXPECT_EQ(t.dtype, DType::kBF16) << t.name;
    }
  }
  const TensorPlan* a = FindTensor(l, LayerPrefix(0) + "self_attn.A_log");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->nbytes, 16u * 2);
}

// ---- --shards ----

TEST(SynthShards, GroupsConsecutiveLayersModelLevelInTheLastShard) {
  const Layout l = MustLayout("tiny", SmallDType::kMixed, 3);
  ASSERT_EQ(l.shards.size(), 3u);
  EXPECT_EQ(l.shards[0].name, "model-00001-of-000003.safetensors");
  int next_layer = 0;
  for (const TensorPlan& t : l.tensors) {
    if (t.layer >= 0) {
      EXPECT_GE(t.layer, next_layer - 1) << t.name;  // never goes back to an earlier layer
      next_layer = std::max(next_layer, t.layer + 1);
    } else {
      EXPECT_EQ(t.shard, 2u) << t.name;
    }
  }
  EXPECT_EQ(l.shards[0].first_unit, 0);
  EXPECT_EQ(l.shards[2].last_unit, 15);  // 13 layers, model-level, projector, tower
  EXPECT_EQ(l.shards[1].first_unit, l.shards[0].last_unit + 1);
}

TEST(SynthShards, OneShardHoldsEverything) {
  const Layout l = MustLayout("tiny", SmallDType::kMixed, 1);
  ASSERT_EQ(l.shards.size(), 1u);
  EXPECT_EQ(l.shards[0].tensor_count, l.tensors.size());
}

TEST(SynthShards, MoreShardsThanUnitsIsRejectedNamingTheFlag) {
  Result<ModelConfig> c = PresetConfig("tiny");
  ASSERT_TRUE(c.ok());
  Result<Layout> l = BuildLayout(Env::Default(), *c, SmallDType::kMixed, 15);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), Code::kInvalid);
  EXPECT_NE(l.status().message().find("--shards 15"), std::string::npos);
  EXPECT_NE(l.status().message().find("1..14"), std::string::npos);
  Result<VisionConfig> v = PresetVision("tiny", c->hidden);
  ASSERT_TRUE(v.ok());
  l = BuildLayout(Env::Default(), *c, SmallDType::kMixed, 17, &*v);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("1..16"), std::string::npos) << l.status().ToString();
  EXPECT_NE(l.status().message().find("the vision tower"), std::string::npos);
}

// ---- vision (shards n_layers + 2 and + 3, as released) ----

TEST(SynthVision, FullPresetVisionTensorsHaveTheReleasedShapes) {
  const Layout l = MustLayout("full");
  ASSERT_TRUE(l.vision.has_value());
  struct Want { const char* name; std::vector<uint64_t> shape; };
  const Want wants[] = {
      {"vision_tower.patch_embed.proj.weight", {1024, 3, 14, 14}},
      {"vision_tower.patch_embed.pos_emb.weight", {64, 64, 1024}},
      {"vision_tower.encoder.blocks.26.wqkv.weight", {4608, 1024}},
      {"vision_tower.encoder.blocks.26.wo.weight", {1024, 1536}},
      {"vision_tower.encoder.blocks.0.mlp.fc0.weight", {4096, 1024}},
      {"vision_tower.encoder.blocks.0.mlp.fc1.weight", {1024, 4096}},
      {"vision_tower.encoder.blocks.0.norm0.weight", {1024}},
      {"vision_tower.encoder.final_layernorm.weight", {1024}},
      {"mm_projector.proj.0.weight", {4096, 4096}},
      {"mm_projector.proj.2.weight", {7168, 4096}},
      {"mm_projector.post_norm.weight", {7168}},
  };
  for (const Want& w : wants) {
    const TensorPlan* t = FindTensor(l, w.name);
    ASSERT_NE(t, nullptr) << w.name;
    EXPECT_EQ(t->dtype, DType::kBF16) << w.name;
    EXPECT_EQ(t->shape, w.shape) << w.name;
  }
  EXPECT_EQ(FindTensor(l, "vision_tower.encoder.blocks.27.wo.weight"), nullptr);
  // ~0.45 B parameters in BF16 (spec/VISION-AND-TOOLS.md: the tower is ~0.4-0.5 B).
  EXPECT_EQ(l.vision_bytes, VisionBf16Bytes(*l.vision));
  EXPECT_NEAR(static_cast<double>(l.vision_bytes) / 2e9, 0.447, 0.01);
}

TEST(SynthVision, ScaledPresetsFollowTheTextWidthAndNoVisionDropsTwoShards) {
  for (const char* preset : {"tiny", "small", "bench"}) {
    const Layout l = MustLayout(preset);
    ASSERT_TRUE(l.vision.has_value()) << preset;
    EXPECT_EQ(l.vision->text_hidden, l.config.hidden) << preset;
    const TensorPlan* proj = FindTensor(l, "mm_projector.proj.2.weight");
    ASSERT_NE(proj, nullptr) << preset;
    EXPECT_EQ(proj->shape[0], static_cast<uint64_t>(l.config.hidden)) << preset;
    EXPECT_EQ(l.shards.size(), static_cast<size_t>(l.config.n_layers + 3)) << preset;
    const Layout text = MustLayout(preset, SmallDType::kMixed, 0, {}, /*vision=*/false);
    EXPECT_FALSE(text.vision.has_value());
    EXPECT_EQ(text.shards.size(), static_cast<size_t>(l.config.n_layers + 1)) << preset;
    EXPECT_EQ(text.vision_bytes, 0u);
    EXPECT_EQ(text.tensors.size() + VisionTensors(*l.vision).size(), l.tensors.size());
  }
}

TEST(SynthVision, TextHiddenMismatchIsRefused) {
  Result<ModelConfig> c = PresetConfig("tiny");
  ASSERT_TRUE(c.ok());
  Result<VisionConfig> v = PresetVision("tiny", c->hidden + 32);
  ASSERT_TRUE(v.ok());
  Result<Layout> l = BuildLayout(Env::Default(), *c, SmallDType::kMixed, 0, &*v);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("text_hidden_size 160 differs from hidden_size 128"),
            std::string::npos) << l.status().ToString();
}

// ---- --set overrides ----

TEST(SynthSet, ValidOverridesReachTheConfigAndLayout) {
  const Layout l = MustLayout("tiny", SmallDType::kMixed, 0,
                              {"num_experts=16", "vocab_size=2048", "full_attn_layers=4,13"});
  EXPECT_EQ(l.config.n_experts, 16);
  EXPECT_EQ(l.config.full_attn_layers, (std::vector<int>{4, 13}));
  EXPECT_EQ(l.config.bos_token_id, 2048 - 256);  // ids follow the new vocabulary
  EXPECT_EQ(l.config.pad_token_id, 2047);
  EXPECT_NE(FindTensor(l, LayerPrefix(2) + "block_sparse_moe.experts.15.w3.weight_scale"), nullptr);
  EXPECT_NE(FindTensor(l, LayerPrefix(7) + "self_attn.q_proj.weight"), nullptr);  // now KDA
  const TensorPlan* embed = FindTensor(l, "language_model.model.embed_tokens.weight");
  ASSERT_NE(embed, nullptr);
  EXPECT_EQ(embed->shape[0], 2048u);
}

Status SetError(std::vector<std::string> sets) {
  Result<ModelConfig> base = PresetConfig("tiny");
  Result<ModelConfig> c = ApplyOverrides(*base, sets);
  return c.ok() ? Status::Ok() : c.status();
}

TEST(SynthSet, UnknownKeyIsRejectedNamingIt) {
  const Status s = SetError({"num_expertz=4"});
  ASSERT_EQ(s.code(), Code::kInvalid);
  EXPECT_NE(s.message().find("num_expertz"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("unknown config key"), std::string::npos) << s.message();
}

TEST(SynthSet, TopKAboveExpertsIsRejectedByTheConfigReaderNamingTheKey) {
  const Status s = SetError({"num_experts_per_token=9"});
  ASSERT_EQ(s.code(), Code::kInvalid);
  EXPECT_NE(s.message().find("num_experts_per_token"), std::string::npos) << s.message();
}

TEST(SynthSet, LayerListOutsideTheModelIsRejectedNamingTheKey) {
  const Status s = SetError({"full_attn_layers=4,8,14"});
  ASSERT_EQ(s.code(), Code::kInvalid);
  EXPECT_NE(s.message().find("full_attn_layers"), std::string::npos) << s.message();
}

TEST(SynthSet, NonMultipleOf32ExpertWidthIsRejected) {
  const Status s = SetError({"moe_intermediate_size=48"});
  ASSERT_EQ(s.code(), Code::kInvalid);
  EXPECT_NE(s.message().find("moe_intermediate_size"), std::string::npos) << s.message();
}

TEST(SynthSet, NonNumericValueIsRejectedNamingTheKey) {
  const Status s = SetError({"hidden_size=wide"});
  ASSERT_EQ(s.code(), Code::kInvalid);
  EXPECT_NE(s.message().find("hidden_size"), std::string::npos) << s.message();
}

TEST(SynthSet, MissingEqualsIsRejected) {
  const Status s = SetError({"num_experts"});
  ASSERT_EQ(s.code(), Code::kInvalid);
  EXPECT_NE(s.message().find("key=value"), std::string::npos) << s.message();
}

TEST(SynthSet, VocabBelow512IsRejected) {
  const Status s = SetError({"vocab_size=300"});
  ASSERT_EQ(s.code(), Code::kInvalid);
  EXPECT_NE(s.message().find("vocab_size"), std::string::npos) << s.message();
}

int RunCli(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return prep::Main(static_cast<int>(argv.size()), argv.data());
}

TEST(SynthCli, UnknownSetKeyExitsTwo) {
  k3::test::TempDir dir;
  EXPECT_EQ(RunCli({"k3prep", "synth", "--preset", "tiny", "--out", dir.Join("o"), "--dry-run",
                    "--quiet", "--set", "bogus_key=1"}),
            2);
  EXPECT_TRUE(dir.List().empty());
}

TEST(SynthCli, UnknownPresetExitsTwo) {
  k3::test::TempDir dir;
  EXPECT_EQ(RunCli({"k3prep", "synth", "--preset", "huge", "--out", dir.Join("o"), "--quiet"}), 2);
}

// ---- --dry-run: layout.json ----

TEST(SynthDryRun, LayoutJsonListsEveryTensorWithItsByteRange) {
  k3::test::TempDir dir;
  SynthOptions o;
  o.preset = "tiny";
  o.out = dir.Join("out");
  o.dry_run = true;
  Result<SynthResult> r = RunSynth(Env::Default(), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Result<std::string> text = ReadFileToString(Env::Default(), dir.Join("out/layout.json"));
  ASSERT_TRUE(text.ok());
  const json doc = json::parse(*text);
  EXPECT_EQ(doc["format"], "k3-synth-layout");
  const Layout& l = r->layout;
  ASSERT_EQ(doc["tensors"].size(), l.tensors.size());
  ASSERT_EQ(doc["shards"].size(), 16u);  // 13 layers, the model-level shard, projector, tower
  EXPECT_FALSE(doc["shards"][13]["vision"].get<bool>());
  EXPECT_TRUE(doc["shards"][13]["model_level"].get<bool>());
  EXPECT_TRUE(doc["shards"][14]["vision"].get<bool>());
  EXPECT_TRUE(doc["shards"][15]["vision"].get<bool>());
  EXPECT_EQ(doc["totals"]["vision_bytes"].get<uint64_t>(), r->layout.vision_bytes);
  // Data of every shard is covered contiguously by its tensors, ending at data_bytes.
  std::map<std::string, uint64_t> next;
  for (const json& t : doc["tensors"]) {
    const std::string shard = t["shard"];
    EXPECT_EQ(t["begin"].get<uint64_t>(), next[shard]) << t["name"];
    uint64_t n = t["dtype"] == "F32" ? 4 : t["dtype"] == "BF16" ? 2 : 1;
    for (const json& d : t["shape"]) n *= d.get<uint64_t>();
    EXPECT_EQ(t["end"].get<uint64_t>() - t["begin"].get<uint64_t>(), n) << t["name"];
    next[shard] = t["end"];
  }
  for (const json& s : doc["shards"]) {
    EXPECT_EQ(next[s["name"]], s["data_bytes"].get<uint64_t>());
    EXPECT_EQ(s["file_size"].get<uint64_t>(),
              s["data_offset"].get<uint64_t>() + s["data_bytes"].get<uint64_t>());
  }
  // Nothing but layout.json is written.
  Result<std::vector<DirEntry>> entries = Env::Default()->ListDir(dir.Join("out"));
  ASSERT_TRUE(entries.ok());
  ASSERT_EQ(entries->size(), 1u);
  EXPECT_EQ((*entries)[0].name, "layout.json");
}

}  // namespace
}  // namespace k3::synth
