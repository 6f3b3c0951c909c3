// Memory plan numbers, computed by hand from MODEL.md §7's state description.
#include <gtest/gtest.h>

#include <algorithm>

#include "k3run/kernels/thread_scratch.h"
#include "k3run/ops/mla.h"
#include "k3run/stream/memory_plan.h"
#include "k3prep/synth/presets.h"

namespace k3::run {
namespace {

TEST(PlanMemory, TinyPresetKvCacheAndStateByHand) {
  Result<ModelConfig> c = synth::PresetConfig("tiny");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  // tiny: MLA at zero-based 3, 7, 11, 12 → 4 MLA layers, 9 KDA layers.
  // Latent cache row: kv_lora 32 + rope 8 = 40 floats = 160 B; 10 positions → 1600 B per layer
  // (the expanded row it replaced was 4 heads × (24 + 16) + 8 = 168 floats).
  // KDA: H·D·D = 4·16·16 = 1024, conv 3·P·(K−1) = 3·64·3 = 576 → 1600 floats = 6400 B per layer.
  const MemoryPlan p = PlanMemory(*c, 13, 10, 1000);
  EXPECT_EQ(p.kv_cache_bytes, 4u * 1600u);
  EXPECT_EQ(p.state_bytes, 9u * 6400u);
  EXPECT_EQ(p.total(), 4u * 1600u + 9u * 6400u + p.scratch_bytes + 1000u);
  EXPECT_EQ(p.scratch_bytes, ScratchBytes(*c, 1, 10));
  // --layers 4: layers 0–2 KDA, layer 3 MLA.
  const MemoryPlan q = PlanMemory(*c, 4, 10, 0);
  EXPECT_EQ(q.kv_cache_bytes, 1600u);
  EXPECT_EQ(q.state_bytes, 3u * 6400u);
}

// Several sequences hold their own caches and states; --spec N adds N + 1 rows of KDA records
// per sequence and layer (7·P + H floats a row) and one scratch copy of a KDA state.
TEST(PlanMemory, SequencesAndSpeculationRecordsByHand) {
  Result<ModelConfig> c = synth::PresetConfig("tiny");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const MemoryPlan p = PlanMemory(*c, 13, 10, 0, 1, 1, 3, 4);
  EXPECT_EQ(p.kv_cache_bytes, 3u * 4u * 1600u);
  EXPECT_EQ(p.state_bytes, 3u * 9u * 6400u);
  EXPECT_EQ(p.record_bytes, 3u * 9u * 5u * (7u * 64u + 4u) * 4u + 6400u);
  EXPECT_EQ(p.total(), p.kv_cache_bytes + p.state_bytes + p.record_bytes + p.scratch_bytes);
  EXPECT_EQ(PlanMemory(*c, 13, 10, 0, 1, 1, 3, 0).record_bytes, 0u);
  // Released: 0.465 GB of KDA state per sequence (DESIGN.md §11.4).
  Result<ModelConfig> full = synth::PresetConfig("full");
  ASSERT_TRUE(full.ok());
  const MemoryPlan one = PlanMemory(*full, full->n_layers, 1, 0);
  const MemoryPlan eight = PlanMemory(*full, full->n_layers, 1, 0, 1, 1, 8);
  EXPECT_NEAR(double(one.state_bytes) / 1e9, 0.465, 0.001);
  EXPECT_EQ(eight.state_bytes, 8 * one.state_bytes);
}

// Scratch grows with the rows of a pass and the positions MLA scores span, and is at least the
// logits (3 × vocab floats) plus the residual stream.
TEST(ScratchBytes, GrowsWithRowsAndPositionsAndCoversTheLogits) {
  Result<ModelConfig> c = synth::PresetConfig("tiny");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const uint64_t one = ScratchBytes(*c, 1, 10);
  EXPECT_GE(one, 4u * (3u * uint64_t(c->vocab) + uint64_t(c->hidden)));
  // Linear in the rows (nothing per pass grows with T), at least a residual row per row.
  const uint64_t per_row = ScratchBytes(*c, 2, 10) - one;
  EXPECT_EQ(ScratchBytes(*c, 8, 10) - one, 7 * per_row);
  EXPECT_GT(per_row, 4u * uint64_t(c->hidden));
  EXPECT_GT(ScratchBytes(*c, 1, 1000), one);
  // MLA scores: per thread, not per row, a unit of ops::kMlaUnitQueries queries (rows × heads)
  // × `positions` floats, their sums over a block of ops::kMlaKeyBlock positions (doubles), and
  // the queries themselves (kv_lora + rope floats each); and what the MatMul bodies keep for
  // the widest expert row (kernels/thread_scratch.h).
  const uint64_t group = uint64_t(ops::kMlaUnitQueries);
  const uint64_t per_thread =
      group * (4u * 1000u + 8u * uint64_t(ops::kMlaKeyBlock) +
               4u * uint64_t(c->kv_lora + c->qk_rope)) +
      uint64_t(kernels::MatMulThreadScratchBytes(std::max(c->latent, c->moe_inter)));
  EXPECT_EQ(ScratchBytes(*c, 1, 1000, 2) - ScratchBytes(*c, 1, 1000, 1), per_thread);
  EXPECT_EQ(ScratchBytes(*c, 5, 1000, 2) - ScratchBytes(*c, 5, 1000, 1), per_thread);
}

// The released config (reference-data: 24 MLA layers of 69 + 24, kv_lora 512, rope 64): 2,304 B
// per MLA layer and position, 55.3 KB per position, 32 Ki positions in 1.81 GB (DESIGN.md §11.2).
TEST(PlanMemory, ReleasedLatentCacheIs55KBPerPosition) {
  Result<ModelConfig> c = synth::PresetConfig("full");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const MemoryPlan p = PlanMemory(*c, c->n_layers, 32768, 0);
  int mla = 0;
  for (int L = 0; L < c->n_layers; ++L) mla += c->is_mla(L) ? 1 : 0;
  EXPECT_EQ(p.kv_cache_bytes, uint64_t(mla) * 2304u * 32768u);
  EXPECT_NEAR(double(p.kv_cache_bytes) / 32768.0, 55296.0, 0.5);
  EXPECT_NEAR(double(p.kv_cache_bytes) / 1e9, 1.81, 0.01);
}

TEST(LargestChunk, IsTheLargestRowCountWhoseScratchFits) {
  Result<ModelConfig> c = synth::PresetConfig("tiny");
  ASSERT_TRUE(c.ok());
  const uint64_t room = ScratchBytes(*c, 37, 100, 2);
  EXPECT_EQ(LargestChunk(*c, room, 100, 2, 512), 37);
  EXPECT_EQ(LargestChunk(*c, room - 1, 100, 2, 512), 36);
  EXPECT_EQ(LargestChunk(*c, room, 100, 2, 20), 20);
  EXPECT_EQ(LargestChunk(*c, ScratchBytes(*c, 1, 100, 2) - 1, 100, 2, 512), 0);
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
  EXPECT_NE(s.message().find("--ctx"), std::string::npos) << s.message();
  EXPECT_TRUE(CheckMemory(p, 6'000'000'000).ok());
}

}  // namespace
}  // namespace k3::run
