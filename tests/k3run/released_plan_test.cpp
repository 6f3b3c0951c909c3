// k3run's plan for the RELEASED config (synth preset "full") at --preset laptop, from a prepared
// directory built in memory (synth::PreparedForConfig; no weight is read or needed), and the
// check that the in-memory builder matches what `k3prep pack` wrote for the tiny fixture.
#include <gtest/gtest.h>

#include <memory>

#include "formats/prepared_manifest.h"
#include "k3prep/synth/prepared.h"
#include "k3prep/synth/presets.h"
#include "k3run/engine/session.h"
#include "k3run/engine/vision_encoder.h"
#include "formats/vision_config.h"
#include "tests/k3run/engine_fixture.h"

namespace k3::run {
namespace {

// Built once per process (~0.5 M expert tensors to lay out).
const prepared::PreparedDir& ReleasedPrepared() {
  static const prepared::PreparedDir* p = [] {
    Result<ModelConfig> c = synth::PresetConfig("full");
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    Result<prepared::PreparedDir> r = synth::PreparedForConfig(*c);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return new prepared::PreparedDir(std::move(r).value());
  }();
  return *p;
}

PlanOptions LaptopOptions(int64_t positions) {
  PlanOptions o;
  o.positions = positions;
  o.pass_rows = positions;
  o.budget.preset = "laptop";
  o.mem_available = []() -> Result<uint64_t> { return uint64_t{24'000'000'000}; };
  return o;
}

TEST(ReleasedPlan, LaptopHolds32KPositions) {
  const prepared::PreparedDir& p = ReleasedPrepared();
  const ModelConfig& c = p.manifest.config;
  std::unique_ptr<Engine> e = Engine::ForPrepared(p);
  ASSERT_TRUE(e->Plan(LaptopOptions(32768)).ok());
  const MemoryPlan& m = e->memory_plan();
  EXPECT_LE(m.total(), uint64_t{8'000'000'000}) << m.Describe();
  int mla = 0;
  for (int L = 0; L < c.n_layers; ++L) mla += c.is_mla(L) ? 1 : 0;
  EXPECT_EQ(mla, 24);
  // Latent row: (kv_lora 512 + qk_rope 64) × 4 B = 2304 B per position per MLA layer.
  EXPECT_EQ(m.kv_cache_bytes, uint64_t(mla) * 2304u * 32768u);
  EXPECT_GE(m.chunk, 1);
  ASSERT_TRUE(e->streaming_plan().has_value());
  const StreamingPlan& sp = *e->streaming_plan();
  EXPECT_GE(sp.ring_slots, 2) << sp.Describe();
  EXPECT_GE(sp.expert_slots, c.topk + 1) << sp.Describe();
}

// Issue #32: one image at the release's largest (~17,000 tokens: 68,000 patches) fits the 8 GB
// laptop budget with a 32K context. The CLI runs the tower before the text weights load (its
// 0.89 GB of weights, its attention tiled so its memory is linear in the patches,
// k3run/vision/vision_tower.h, and the rows: well under the budget alone), then the plan holds
// the text model with the image's rows.
TEST(ReleasedPlan, LaptopHoldsA17000TokenImage) {
  const vision::VisionDims dims = vision::VisionDims::Released();
  const uint64_t weights = VisionBf16Bytes(VisionConfig::Released());
  const uint64_t tower = VisionEncoder::PlanBytesFor(dims, weights, 17000);
  const uint64_t rows = VisionEncoder::RowBytes(dims, 17000);
  std::printf("vision tower for a 17,000-token image: %.3f GB (weights %.3f GB, rows %.3f GB)\n",
              double(tower) / 1e9, double(weights) / 1e9, double(rows) / 1e9);
  EXPECT_LE(tower, uint64_t{8'000'000'000});
  std::unique_ptr<Engine> e = Engine::ForPrepared(ReleasedPrepared());
  PlanOptions o = LaptopOptions(32768);
  o.vision_bytes = rows;
  const Status s = e->Plan(o);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const MemoryPlan& m = e->memory_plan();
  EXPECT_EQ(m.vision_bytes, rows);
  EXPECT_LE(m.total(), uint64_t{8'000'000'000}) << m.Describe();
  EXPECT_NE(m.Describe().find(" + vision tower "), std::string::npos) << m.Describe();
}

TEST(ReleasedPlan, LaptopRefuses1MiPositions) {
  std::unique_ptr<Engine> e = Engine::ForPrepared(ReleasedPrepared());
  const Status s = e->Plan(LaptopOptions(int64_t{1} << 20));
  ASSERT_EQ(s.code(), Code::kInvalid) << s.ToString();
  EXPECT_NE(s.message().find("--ctx"), std::string::npos) << s.message();
}

// The in-memory builder against `k3prep pack --experts copy` of the real tiny checkpoint: same
// config, runs, tensor regions (hashes aside), files and expert record placement.
TEST(ReleasedPlan, InMemoryPreparedMatchesPackOnTiny) {
  Result<prepared::PreparedDir> packed =
      prepared::OpenPrepared(Env::Default(), testing::TinyPreparedDir());
  ASSERT_TRUE(packed.ok()) << packed.status().ToString();
  Result<ModelConfig> c = synth::PresetConfig("tiny");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Result<prepared::PreparedDir> mem = synth::PreparedForConfig(*c);
  ASSERT_TRUE(mem.ok()) << mem.status().ToString();
  // The in-memory builder is text only: the pack's vision.bin regions are left out here.
  prepared::Manifest a = packed->manifest;
  std::erase_if(a.regions, [](const prepared::Region& r) { return r.file == "vision.bin"; });
  const prepared::Manifest& b = mem->manifest;
  EXPECT_EQ(CanonicalConfigJson(a.config), CanonicalConfigJson(b.config));
  ASSERT_EQ(a.runs.size(), b.runs.size());
  for (size_t i = 0; i < a.runs.size(); ++i) {
    EXPECT_EQ(a.runs[i].layer, b.runs[i].layer);
    EXPECT_EQ(a.runs[i].offset, b.runs[i].offset);
    EXPECT_EQ(a.runs[i].length, b.runs[i].length);
  }
  // Tensor regions and experts.idx; pack adds the tokenizer files after them.
  ASSERT_GE(a.regions.size(), b.regions.size());
  for (size_t i = 0; i < b.regions.size(); ++i) {
    const prepared::Region& x = a.regions[i];
    const prepared::Region& y = b.regions[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.file, y.file) << x.name;
    EXPECT_EQ(x.offset, y.offset) << x.name;
    EXPECT_EQ(x.length, y.length) << x.name;
    EXPECT_EQ(x.dtype, y.dtype) << x.name;
    EXPECT_EQ(x.shape, y.shape) << x.name;
  }
  for (size_t i = b.regions.size(); i < a.regions.size(); ++i) {
    EXPECT_EQ(a.regions[i].name.rfind("tokenizer/", 0), 0u) << a.regions[i].name;
  }
  ASSERT_EQ(a.expert_files.size(), b.expert_files.size());
  for (size_t i = 0; i < a.expert_files.size(); ++i) {
    EXPECT_EQ(a.expert_files[i].path, b.expert_files[i].path);
    EXPECT_EQ(a.expert_files[i].size, b.expert_files[i].size);
  }
  ASSERT_EQ(packed->experts.records.size(), mem->experts.records.size());
  for (size_t i = 0; i < mem->experts.records.size(); ++i) {
    const prepared::ExpertRecord& x = packed->experts.records[i];
    const prepared::ExpertRecord& y = mem->experts.records[i];
    EXPECT_EQ(x.length, y.length) << "record " << i;
    EXPECT_EQ(x.file_id, y.file_id) << "record " << i;
    EXPECT_EQ(x.offset, y.offset) << "record " << i;
    EXPECT_EQ(x.sub_size, y.sub_size) << "record " << i;
  }
}

}  // namespace
}  // namespace k3::run
