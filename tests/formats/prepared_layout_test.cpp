// formats/prepared_layout: canonical order, alignment, config consistency, expert placement.
#include "formats/prepared_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "formats/safetensors.h"
#include "tests/formats/prepared_fixture.h"
#include "tests/support/temp_dir.h"

namespace k3::prepared {
namespace {

using test::L;
using test::TinyConfig;
using test::TinyTensors;

const prepared::Region* FindIn(const std::vector<prepared::Region>& regions, const std::string& name) {
  for (const prepared::Region& r : regions) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

std::vector<prepared::TensorSpec> Without(std::vector<prepared::TensorSpec> t, const std::string& name) {
  t.erase(std::remove_if(t.begin(), t.end(), [&](const prepared::TensorSpec& s) { return s.name == name; }),
          t.end());
  return t;
}

prepared::TensorSpec* Find(std::vector<prepared::TensorSpec>& t, const std::string& name) {
  for (prepared::TensorSpec& s : t) {
    if (s.name == name) return &s;
  }
  ADD_FAILURE() << "fixture has no " << name;
  return &t.front();
}

TEST(PreparedLayout, DenseKdaRunIsInCanonicalOrderAtHandComputedOffsets) {
  Result<prepared::Layout> layout = prepared::BuildLayout(TinyConfig(), TinyTensors());
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  const std::vector<std::pair<std::string, uint64_t>> want = {
      {L(0, "input_layernorm.weight"), 0},
      {L(0, "post_attention_layernorm.weight"), 128},
      {L(0, "self_attention_res_norm.weight"), 256},
      {L(0, "self_attention_res_proj.weight"), 384},
      {L(0, "mlp_res_norm.weight"), 512},
      {L(0, "mlp_res_proj.weight"), 640},
      {L(0, "self_attn.q_proj.weight"), 768},
      {L(0, "self_attn.k_proj.weight"), 4864},
      {L(0, "self_attn.v_proj.weight"), 8960},
      {L(0, "self_attn.q_conv1d.weight"), 13056},
      {L(0, "self_attn.k_conv1d.weight"), 13568},
      {L(0, "self_attn.v_conv1d.weight"), 14080},
      {L(0, "self_attn.f_a_proj.weight"), 14592},
      {L(0, "self_attn.f_b_proj.weight"), 16640},
      {L(0, "self_attn.b_proj.weight"), 17664},
      {L(0, "self_attn.A_log"), 17920},
      {L(0, "self_attn.dt_bias"), 17984},
      {L(0, "self_attn.g_proj.weight"), 18112},
      {L(0, "self_attn.o_norm.weight"), 22208},
      {L(0, "self_attn.o_proj.weight"), 22272},
      {L(0, "mlp.gate_proj.weight"), 26368},
      {L(0, "mlp.up_proj.weight"), 32512},
      {L(0, "mlp.down_proj.weight"), 38656},
  };
  ASSERT_GE(layout->trunk.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(layout->trunk[i].name, want[i].first) << i;
    EXPECT_EQ(layout->trunk[i].offset, want[i].second) << want[i].first;
    EXPECT_EQ(layout->trunk[i].file, "trunk.bin");
  }
  ASSERT_EQ(layout->runs.size(), 4u);
  EXPECT_EQ(layout->runs[0].offset, 0u);
  EXPECT_EQ(layout->runs[0].length, 45056u);  // 44800 rounded up to 4096
  EXPECT_EQ(layout->runs[1].offset, 45056u);
}

TEST(PreparedLayout, TensorAfterAnOddSizedOneStartsOn64) {
  Result<prepared::Layout> layout = prepared::BuildLayout(TinyConfig(), TinyTensors());
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  // kv_a_layernorm [16] BF16 ends at run + 10080; kv_b_proj must start at run + 10112.
  const prepared::Region* r = FindIn(layout->trunk, L(1, "self_attn.kv_b_proj.weight"));
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->offset, 45056u + 10112u);
}

TEST(PreparedLayout, EveryRunAndTensorIsAligned) {
  Result<prepared::Layout> layout = prepared::BuildLayout(TinyConfig(), TinyTensors());
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  uint64_t expect_offset = 0;
  for (const prepared::TrunkRun& run : layout->runs) {
    EXPECT_EQ(run.offset, expect_offset) << "runs are back to back, layer " << run.layer;
    EXPECT_EQ(run.offset % 4096, 0u);
    EXPECT_EQ(run.length % 4096, 0u);
    expect_offset += run.length;
  }
  EXPECT_EQ(layout->trunk_bytes, expect_offset);
  for (const prepared::Region& r : layout->trunk) EXPECT_EQ(r.offset % 64, 0u) << r.name;
}

TEST(PreparedLayout, ResidentHoldsFiveTensorsEach4096Aligned) {
  Result<prepared::Layout> layout = prepared::BuildLayout(TinyConfig(), TinyTensors());
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  ASSERT_EQ(layout->resident.size(), 5u);
  EXPECT_EQ(layout->resident[0].name, "language_model.model.embed_tokens.weight");
  EXPECT_EQ(layout->resident[1].name, "language_model.lm_head.weight");
  EXPECT_EQ(layout->resident[2].name, "language_model.model.norm.weight");
  EXPECT_EQ(layout->resident[3].name, "language_model.model.output_attn_res_norm.weight");
  EXPECT_EQ(layout->resident[4].name, "language_model.model.output_attn_res_proj.weight");
  const uint64_t offsets[] = {0, 12288, 24576, 28672, 32768};
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(layout->resident[i].offset, offsets[i]);
  EXPECT_EQ(layout->resident_bytes, 36864u);
}

TEST(PreparedLayout, ShardOrderDoesNotChangeTheLayout) {
  Result<prepared::Layout> a = prepared::BuildLayout(TinyConfig(), TinyTensors());
  std::vector<prepared::TensorSpec> shuffled = TinyTensors();
  std::mt19937 rng(7);
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  Result<prepared::Layout> b = prepared::BuildLayout(TinyConfig(), shuffled);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->trunk.size(), b->trunk.size());
  for (size_t i = 0; i < a->trunk.size(); ++i) {
    EXPECT_EQ(a->trunk[i].name, b->trunk[i].name);
    EXPECT_EQ(a->trunk[i].offset, b->trunk[i].offset);
  }
}

TEST(PreparedLayout, MissingTensorIsNamed) {
  const std::string gone = L(2, "self_attn.dt_bias");
  Result<prepared::Layout> layout = prepared::BuildLayout(TinyConfig(), Without(TinyTensors(), gone));
  ASSERT_FALSE(layout.ok());
  EXPECT_EQ(layout.status().code(), Code::kInvalid);
  EXPECT_NE(layout.status().message().find(gone), std::string::npos);
  EXPECT_NE(layout.status().message().find("missing"), std::string::npos);
}

TEST(PreparedLayout, ShapeMismatchVsConfigIsNamed) {
  std::vector<prepared::TensorSpec> t = TinyTensors();
  Find(t, L(1, "self_attn.q_a_proj.weight"))->shape = {64, 32};
  Result<prepared::Layout> layout = prepared::BuildLayout(TinyConfig(), t);
  ASSERT_FALSE(layout.ok());
  const std::string& msg = layout.status().message();
  EXPECT_NE(msg.find(L(1, "self_attn.q_a_proj.weight")), std::string::npos) << msg;
  EXPECT_NE(msg.find("[64, 32]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[32, 64]"), std::string::npos) << msg;
}

TEST(PreparedLayout, DtypeMismatchIsNamed) {
  std::vector<prepared::TensorSpec> t = TinyTensors();
  Find(t, L(3, "block_sparse_moe.gate.weight"))->dtype = DType::kF16;
  Result<prepared::Layout> layout = prepared::BuildLayout(TinyConfig(), t);
  ASSERT_FALSE(layout.ok());
  EXPECT_NE(layout.status().message().find(L(3, "block_sparse_moe.gate.weight")),
            std::string::npos);
  EXPECT_NE(layout.status().message().find("F16"), std::string::npos);
}

TEST(PreparedLayout, UnknownLanguageModelTensorIsRejected) {
  std::vector<prepared::TensorSpec> t = TinyTensors();
  t.push_back(prepared::TensorSpec{L(2, "self_attn.g_a_proj.weight"), DType::kBF16, {16, 64}});
  Result<prepared::Layout> layout = prepared::BuildLayout(TinyConfig(), t);
  ASSERT_FALSE(layout.ok());
  EXPECT_NE(layout.status().message().find("g_a_proj"), std::string::npos);
  EXPECT_NE(layout.status().message().find("not part of the prepared layout"), std::string::npos);
}

TEST(PreparedLayout, ExpertNotMxfp4IsRejected) {
  std::vector<prepared::TensorSpec> t = TinyTensors();
  const std::string name = L(2, "block_sparse_moe.experts.3.w2.weight_scale");
  Find(t, name)->dtype = DType::kBF16;
  Result<prepared::Layout> layout = prepared::BuildLayout(TinyConfig(), t);
  ASSERT_FALSE(layout.ok());
  EXPECT_NE(layout.status().message().find(name), std::string::npos);
  EXPECT_NE(layout.status().message().find("expected U8 [32, 2]"), std::string::npos);
}

TEST(PreparedLayout, MissingExpertIsNamed) {
  const std::string gone = L(3, "block_sparse_moe.experts.0.w3.weight_packed");
  Result<prepared::Layout> layout = prepared::BuildLayout(TinyConfig(), Without(TinyTensors(), gone));
  ASSERT_FALSE(layout.ok());
  EXPECT_NE(layout.status().message().find(gone), std::string::npos);
}

TEST(PreparedLayout, ManyProblemsAreCountedButTheListIsBounded) {
  std::vector<prepared::TensorSpec> t;
  for (const prepared::TensorSpec& s : TinyTensors()) {
    if (s.name.find(".experts.") == std::string::npos) t.push_back(s);
  }
  Result<prepared::Layout> layout = prepared::BuildLayout(TinyConfig(), t);
  ASSERT_FALSE(layout.ok());
  EXPECT_NE(layout.status().message().find("72 problem(s)"), std::string::npos)
      << layout.status().message();  // 3 MoE layers x 4 experts x 6 tensors
  EXPECT_NE(layout.status().message().find("... and 56 more"), std::string::npos);
}

TEST(PreparedLayout, ALogShorterThanHeadsIsRejected) {
  std::vector<prepared::TensorSpec> t = TinyTensors();
  Find(t, L(0, "self_attn.A_log"))->shape = {1};
  Result<prepared::Layout> layout = prepared::BuildLayout(TinyConfig(), t);
  ASSERT_FALSE(layout.ok());
  EXPECT_NE(layout.status().message().find("A_log"), std::string::npos);
  // Exactly num_heads entries is accepted (upstream's declaration).
  Find(t, L(0, "self_attn.A_log"))->shape = {2};
  EXPECT_TRUE(prepared::BuildLayout(TinyConfig(), t).ok());
}

TEST(PreparedLayout, MlaGateIsOptionalWithoutOutputGate) {
  ModelConfig c = TinyConfig();
  c.mla_out_gate = false;
  std::vector<prepared::TensorSpec> t = Without(TinyTensors(), L(1, "self_attn.g_proj.weight"));
  EXPECT_TRUE(prepared::BuildLayout(c, t).ok());
  EXPECT_FALSE(prepared::BuildLayout(TinyConfig(), t).ok());
}

TEST(PreparedLayout, NonMxfp4ExpertWidthsAreRefused) {
  ModelConfig c = TinyConfig();
  c.moe_inter = 48;  // the conformance fixture's F32 experts: not packable in version 1
  Result<prepared::Layout> layout = prepared::BuildLayout(c, TinyTensors());
  ASSERT_FALSE(layout.ok());
  EXPECT_NE(layout.status().message().find("moe_intermediate_size (48)"), std::string::npos);
}

TEST(PreparedLayout, ExpertSizesMatchThePresetsOfDesign) {
  ModelConfig c = TinyConfig();
  EXPECT_EQ(prepared::ExpertBytes(c), test::kTinyExpertBytes);
  c.latent = 128;
  c.moe_inter = 128;
  EXPECT_EQ(prepared::ExpertBytes(c), 26112u);  // small
  c.latent = 512;
  c.moe_inter = 256;
  EXPECT_EQ(prepared::ExpertBytes(c), 208896u);  // bench: 51 x 4096
  c.latent = 3584;
  c.moe_inter = 3072;
  EXPECT_EQ(prepared::ExpertBytes(c), 17547264u);  // released
  EXPECT_EQ(prepared::ExpertSubShape(c, 0), (std::vector<uint64_t>{3072, 1792}));
  EXPECT_EQ(prepared::ExpertSubShape(c, 1), (std::vector<uint64_t>{3072, 112}));
  EXPECT_EQ(prepared::ExpertSubShape(c, 2), (std::vector<uint64_t>{3584, 1536}));
  EXPECT_EQ(prepared::ExpertSubShape(c, 3), (std::vector<uint64_t>{3584, 96}));
}

TEST(PreparedLayout, ExpertTensorNamesFollowTheRelease) {
  EXPECT_EQ(prepared::ExpertTensorName(7, 895, 5),
            "language_model.model.layers.7.block_sparse_moe.experts.895.w3.weight_scale");
  EXPECT_EQ(prepared::ExpertTensorName(1, 0, 0),
            "language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_packed");
}

TEST(PreparedLayout, CopyPlanWithoutStripeIsOneFilePerMoeLayer) {
  prepared::ExpertPlan plan = prepared::PlanCopyExperts(TinyConfig(), {});
  ASSERT_EQ(plan.files.size(), 3u);
  EXPECT_EQ(plan.files[0], "experts/layer-001.bin");
  EXPECT_EQ(plan.files[2], "experts/layer-003.bin");
  ASSERT_EQ(plan.slots.size(), 12u);
  // Record (L=2, e=3) = (2-1)*4+3 = 7: file of layer 2, fourth expert, 3 x 4096 in.
  EXPECT_EQ(plan.slots[7].file_id, 1u);
  EXPECT_EQ(plan.slots[7].offset, 3u * 4096u);
  EXPECT_EQ(plan.file_sizes[1], 4u * 4096u);
}

TEST(PreparedLayout, StripeSendsExpertToDiskLTimesNPlusEModD) {
  const ModelConfig c = TinyConfig();
  prepared::ExpertPlan plan = prepared::PlanCopyExperts(c, {"/d0", "/d1", "/d2"});
  for (int layer = 1; layer < 4; ++layer) {
    for (int e = 0; e < 4; ++e) {
      const prepared::ExpertSlot& s = plan.slots[prepared::ExpertRecordIndex(c, layer, e)];
      const std::string& file = plan.files[s.file_id];
      const int disk = (layer * 4 + e) % 3;
      EXPECT_EQ(file, "/d" + std::to_string(disk) + "/layer-00" + std::to_string(layer) + ".bin")
          << "layer " << layer << " expert " << e;
      EXPECT_EQ(s.offset % 4096, 0u);
    }
  }
  // Layer 1 sends experts 0..3 to disks 1, 2, 0, 1: disk 1 holds two, back to back.
  EXPECT_EQ(plan.slots[prepared::ExpertRecordIndex(c, 1, 3)].offset, 4096u);
}

TEST(PreparedLayout, TensorsOfACheckpointDirectoryBuildTheSameLayout) {
  k3::test::TempDir dir;
  st::Writer writer(Env::Default(), dir.Join("model.safetensors"));
  for (const prepared::TensorSpec& t : TinyTensors()) writer.Add(t.name, t.dtype, t.shape);
  ASSERT_TRUE(writer.Begin().ok());
  for (const prepared::TensorSpec& t : TinyTensors()) {
    const std::string zeros(t.nbytes(), '\0');
    ASSERT_TRUE(writer.Append(zeros.data(), zeros.size()).ok());
  }
  ASSERT_TRUE(writer.Finish().ok());
  Result<st::CheckpointIndex> index = st::CheckpointIndex::Open(Env::Default(), dir.path());
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  const std::vector<prepared::TensorSpec> tensors = prepared::TensorsOf(*index);
  EXPECT_EQ(tensors.size(), TinyTensors().size());
  Result<prepared::Layout> from_dir = prepared::BuildLayout(TinyConfig(), tensors);
  Result<prepared::Layout> from_list = prepared::BuildLayout(TinyConfig(), TinyTensors());
  ASSERT_TRUE(from_dir.ok()) << from_dir.status().ToString();
  ASSERT_TRUE(from_list.ok());
  EXPECT_EQ(from_dir->trunk_bytes, from_list->trunk_bytes);
  EXPECT_EQ(from_dir->trunk.back().name, from_list->trunk.back().name);
}

}  // namespace
}  // namespace k3::prepared
