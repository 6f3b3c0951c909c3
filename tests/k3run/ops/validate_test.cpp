// One test per rule of ValidateDims / ValidateLayerWeights / ValidateExpert and per run-time
// refusal of the ops (full KV cache, full snapshot stack, missing expert). Each breaks one rule
// of an otherwise valid input and checks the message names what it must.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "k3run/ops/layer.h"
#include "random_model.h"

namespace k3::ops {
namespace {

using testing::RandomDims;
using testing::RandomModel;

#define EXPECT_INVALID_WITH(status, ...)                                  \
  do {                                                                    \
    const ::k3::Status s_ = (status);                                     \
    ASSERT_FALSE(s_.ok()) << "expected a refusal";                        \
    EXPECT_EQ(s_.code(), ::k3::Code::kInvalid) << s_.ToString();          \
    for (const char* part : {__VA_ARGS__})                                \
      EXPECT_NE(s_.message().find(part), std::string::npos)               \
          << "message lacks '" << part << "': " << s_.message();          \
  } while (0)

TEST(ValidateLayer, ValidRandomLayersPass) {
  const Dims d = RandomDims();
  RandomModel m(d);
  for (bool mla : {false, true})
    for (bool dense : {false, true}) {
      const Status s = ValidateLayerWeights(m.Layer(mla, dense), d, 1);
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
}

TEST(ValidateLayer, MatrixShapeMismatch) {
  const Dims d = RandomDims();
  RandomModel m(d);
  LayerWeights w = m.Layer(true, false);
  w.mla.q_b_proj.rows -= 1;  // 47 rows where Hm·qh = 48
  EXPECT_INVALID_WITH(ValidateLayerWeights(w, d, 3), "layer 3", "self_attn.q_b_proj",
                      "[47][32]", "[48][32]", "qk_rope_head_dim", "k3prep pack");
}

TEST(ValidateLayer, MatrixWithoutData) {
  const Dims d = RandomDims();
  RandomModel m(d);
  LayerWeights w = m.Layer(false, false);
  w.kda.f_b_proj.data = nullptr;
  EXPECT_INVALID_WITH(ValidateLayerWeights(w, d, 2), "layer 2", "self_attn.f_b_proj", "no data");
}

TEST(ValidateLayer, Mxfp4MatrixWithoutScales) {
  const Dims d = RandomDims();
  RandomModel m(d);
  GluWeights e = *m.Experts()[5];
  e.down.scales = nullptr;
  EXPECT_INVALID_WITH(ValidateExpert(e, d, 4, 5), "layer 4", "block_sparse_moe.experts.5.w2",
                      "E8M0 scales");
}

TEST(ValidateLayer, Mxfp4ColumnsNotAMultipleOf32) {
  Dims d = RandomDims();
  d.moe_inter = 48;  // the fixture width: legal only for F32/BF16 experts
  std::vector<uint8_t> bytes(64 * 48, 0);
  auto mx = [&](int64_t r, int64_t c) {
    Matrix x{};
    x.type = kernels::WeightType::kMXFP4;
    x.rows = r;
    x.cols = c;
    x.data = bytes.data();
    x.scales = bytes.data();
    return x;
  };
  const GluWeights e{mx(48, 32), mx(48, 32), mx(32, 48)};
  EXPECT_INVALID_WITH(ValidateExpert(e, d, 1, 0), "experts.0.w2", "48 columns",
                      "multiple of the group size 32");
}

TEST(ValidateLayer, VectorSizeMismatch) {
  const Dims d = RandomDims();
  RandomModel m(d);
  LayerWeights w = m.Layer(false, true);
  w.mlp_res_proj = w.mlp_res_proj.first(10);
  EXPECT_INVALID_WITH(ValidateLayerWeights(w, d, 0), "layer 0", "mlp_res_proj", "10 elements",
                      "implies 64");
}

TEST(ValidateLayer, ALogShorterThanNumHeads) {
  const Dims d = RandomDims();
  RandomModel m(d);
  LayerWeights w = m.Layer(false, false);
  w.kda.A_log = w.kda.A_log.first(1);
  EXPECT_INVALID_WITH(ValidateLayerWeights(w, d, 1), "self_attn.A_log", "1 elements",
                      "num_heads = 2");
  w.kda.A_log = m.Layer(false, false).kda.A_log;  // max(H, D) = 16 entries: padding accepted
  EXPECT_TRUE(ValidateLayerWeights(w, d, 1).ok());
}

TEST(ValidateLayer, RouterMustNotBeMxfp4) {
  const Dims d = RandomDims();
  RandomModel m(d);
  LayerWeights w = m.Layer(false, false);
  w.moe.gate.type = kernels::WeightType::kMXFP4;
  std::vector<uint8_t> scales(64, 127);
  w.moe.gate.scales = scales.data();
  EXPECT_INVALID_WITH(ValidateLayerWeights(w, d, 1), "block_sparse_moe.gate", "MXFP4",
                      "F32 or BF16");
}

TEST(ValidateLayer, SharedExpertWidth) {
  const Dims d = RandomDims();
  RandomModel m(d);
  LayerWeights w = m.Layer(false, false);
  w.moe.shared.down.cols = 32;  // one shared expert's width instead of n_shared·moe_inter = 64
  EXPECT_INVALID_WITH(ValidateLayerWeights(w, d, 1), "shared_experts.down_proj", "[64][32]",
                      "[64][64]", "num_shared_experts");
}

TEST(ValidateDims, NonPositiveSize) {
  Dims d = RandomDims();
  d.kv_lora = 0;
  EXPECT_INVALID_WITH(ValidateDims(d), "kv_lora_rank", "= 0", "> 0");
}

TEST(ValidateDims, TopKAboveNumExperts) {
  Dims d = RandomDims();
  d.topk = 9;
  EXPECT_INVALID_WITH(ValidateDims(d), "num_experts_per_token = 9", "num_experts (8)");
  EXPECT_TRUE(ValidateDims(RandomDims()).ok());
}

TEST(OpsRefusal, MlaCacheFullLeavesCacheUntouched) {
  const Dims d = RandomDims();
  RandomModel m(d);
  const LayerWeights w = m.Layer(true, false);
  MlaCache cache = MlaCache::Make(d, 3);
  const std::vector<float> x = m.Activations(4 * d.hidden);
  std::vector<float> y(x.size());
  ASSERT_TRUE(MlaLayer(w.mla, d, x.data(), 2, &cache, y.data()).ok());
  const std::vector<float> kv_before(cache.data.begin(), cache.data.end());
  EXPECT_INVALID_WITH(MlaLayer(w.mla, d, x.data(), 2, &cache, y.data()), "latent cache full",
                      "2 positions cached + 2 new > capacity 3");
  EXPECT_EQ(cache.len, 2);
  EXPECT_EQ(std::vector<float>(cache.data.begin(), cache.data.end()), kv_before);
}

TEST(OpsRefusal, SnapshotStackFull) {
  const Dims d = RandomDims();
  RandomModel m(d);
  const LayerWeights w = m.Layer(false, true);
  BlockStack blocks = BlockStack::Make(1, d.hidden, 1);
  blocks.count = 1;
  KdaState kda = KdaState::Zero(d);
  std::vector<float> h = m.Activations(d.hidden);
  EXPECT_INVALID_WITH(DecoderLayer(0, w, m.Experts(), d, h.data(), 1, &blocks, {&kda, nullptr},
                                   nullptr),
                      "layer 0", "snapshot stack full", "capacity 1");
}

TEST(OpsRefusal, LayerWithoutItsState) {
  const Dims d = RandomDims();
  RandomModel m(d);
  const LayerWeights w = m.Layer(true, false);
  BlockStack blocks = BlockStack::Make(1, d.hidden, 2);
  KdaState kda = KdaState::Zero(d);
  std::vector<float> h = m.Activations(d.hidden);
  EXPECT_INVALID_WITH(DecoderLayer(3, w, m.Experts(), d, h.data(), 1, &blocks, {&kda, nullptr},
                                   nullptr),
                      "layer 3", "no MLA KV cache");
  EXPECT_EQ(blocks.count, 0);  // refused before anything changed
}

TEST(OpsRefusal, MissingExpertIsSkippedAndCounted) {
  const Dims d = RandomDims();
  RandomModel m(d);
  const LayerWeights w = m.Layer(false, false);
  const std::vector<float> x = m.Activations(2 * d.hidden, 2.0f);
  const Routing r = Route(w.moe, d, x.data(), 2);
  const int32_t gone = r.idx[0];
  const ExpertTable all = m.Experts();
  std::vector<const GluWeights*> lossy(all.begin(), all.end());
  lossy[static_cast<size_t>(gone)] = nullptr;
  std::vector<float> y(x.size()), y_ok(x.size());
  MoeStats stats;
  MoeBlock(w.moe, lossy, d, x.data(), 2, y.data(), &stats);
  int64_t uses = 0;
  for (int32_t e : r.idx) uses += e == gone;
  EXPECT_EQ(stats.experts_skipped, uses);
  ASSERT_EQ(stats.missing.size(), 1u);
  EXPECT_EQ(stats.missing[0], gone);
  MoeStats ok;
  MoeBlock(w.moe, all, d, x.data(), 2, y_ok.data(), &ok);
  EXPECT_EQ(ok.experts_skipped, 0);
  EXPECT_NE(y, y_ok);  // the skipped term is absent, not silently substituted
}

}  // namespace
}  // namespace k3::ops
