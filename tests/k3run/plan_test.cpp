// Memory plan numbers, computed by hand from MODEL.md §7's state description.
#include <gtest/gtest.h>

#include "k3run/stream/memory_plan.h"
#include "k3prep/synth/presets.h"

namespace k3::run {
namespace {

TEST(PlanMemory, TinyPresetKvCacheAndStateByHand) {
  Result<ModelConfig> c = synth::PresetConfig("tiny");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  // tiny: MLA at zero-based 3, 7, 11, 12 → 4 MLA layers, 9 KDA layers.
  // KV row: 4 heads × (24 + 16) + 8 rope = 168 floats = 672 B; 10 positions → 6720 B per layer.
  // KDA: H·D·D = 4·16·16 = 1024, conv 3·P·(K−1) = 3·64·3 = 576 → 1600 floats = 6400 B per layer.
  const MemoryPlan p = PlanMemory(*c, 13, 10, 1000);
  EXPECT_EQ(p.kv_cache_bytes, 4u * 6720u);
  EXPECT_EQ(p.state_bytes, 9u * 6400u);
  EXPECT_EQ(p.total(), 4u * 6720u + 9u * 6400u + p.scratch_bytes + 1000u);
  EXPECT_EQ(p.scratch_bytes, ScratchBytes(*c, 1, 10));
  // --layers 4: layers 0–2 KDA, layer 3 MLA.
  const MemoryPlan q = PlanMemory(*c, 4, 10, 0);
  EXPECT_EQ(q.kv_cache_bytes, 6720u);
  EXPECT_EQ(q.state_bytes, 3u * 6400u);
}

// Scratch grows with the rows of a pass and the positions MLA scores span, and is at least the
// logits (3 × vocab floats) plus the residual stream.
TEST(ScratchBytes, GrowsWithRowsAndPositionsAndCoversTheLogits) {
  Result<ModelConfig> c = synth::PresetConfig("tiny");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const uint64_t one = ScratchBytes(*c, 1, 10);
  EXPECT_GE(one, 4u * (3u * uint64_t(c->vocab) + uint64_t(c->hidden)));
  EXPECT_GT(ScratchBytes(*c, 8, 10), 7 * (one - 12u * uint64_t(c->vocab)));
  EXPECT_GT(ScratchBytes(*c, 1, 1000), one);
}

TEST(CheckMemory, RefusalNamesEveryNumberAndTheFix) {
  MemoryPlan p;
  p.positions = 77;
  p.kv_cache_bytes = 3'000'000'000;
  p.state_bytes = 1'000'000'000;
  p.weights_bytes = 2'000'000'000;
  const Status s = CheckMemory(p, 5'000'000'000);
  ASSERT_EQ(s.code(), Code::kInvalid);
  EXPECT_NE(s.message().find("77 positions"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("3.000 GB"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("6.000 GB"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("MemAvailable 5.000 GB"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("--gen"), std::string::npos) << s.message();
  EXPECT_TRUE(CheckMemory(p, 6'000'000'000).ok());
}

}  // namespace
}  // namespace k3::run
