// k3verify on vision.bin: --deep hashes every vision region, --against compares it with the
// checkpoint's vision shards, and a changed byte is named by tensor, file and offset.
#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/env.h"
#include "formats/prepared_manifest.h"
#include "formats/safetensors.h"
#include "k3verify/verify_prepared.h"
#include "k3verify/verify_shards.h"
#include "tests/k3verify/mini_pack.h"
#include "tests/support/synth_fixture.h"
#include "tests/support/temp_dir.h"

namespace k3::verify {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class VerifyVision : public ::testing::Test {
 protected:
  void SetUp() override {
    const test::FixtureDirs& f = test::SynthFixture(test::FixtureSpec{});
    fs::copy(f.checkpoint, model_.path(), fs::copy_options::recursive);
    fs::copy(f.prepared, prep_.path(), fs::copy_options::recursive);
    Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), prep_.path());
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    manifest_ = p->manifest;
    ASSERT_TRUE(manifest_.vision.has_value());
  }
  PreparedReport Run(const std::string& against = "") {
    PreparedOptions o;
    o.dir = prep_.path();
    o.deep = true;
    o.against = against;
    o.jobs = 2;
    o.progress = ProgressMode::kNone;
    Result<PreparedReport> r = VerifyPrepared(Env::Default(), o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : PreparedReport{};
  }
  test::TempDir model_, prep_;
  prepared::Manifest manifest_;
};

TEST_F(VerifyVision, EveryVisionRegionIsHashedAndComparedWithTheCheckpoint) {
  size_t vision = 0;
  for (const prepared::Region& r : manifest_.regions) vision += r.file == "vision.bin";
  ASSERT_EQ(vision, 18u);  // tiny: 2 blocks x 6 + patch embed, position grid, final norm + 3
  const PreparedReport deep = Run();
  EXPECT_TRUE(deep.Verdict().ok()) << RenderPreparedText(deep);
  const PreparedReport against = Run(model_.path());
  EXPECT_TRUE(against.Verdict().ok()) << RenderPreparedText(against);
  EXPECT_GE(against.items_compared, vision);
}

TEST_F(VerifyVision, FlippedVisionByteNamesTensorFileAndOffset) {
  const std::string name = "vision_tower.encoder.blocks.1.wqkv.weight";
  const prepared::Region* reg = manifest_.FindRegion(name);
  ASSERT_NE(reg, nullptr);
  test::FlipByte(prep_.Join("vision.bin"), reg->offset + 5);
  const Status v = Run().Verdict();
  EXPECT_EQ(v.code(), Code::kIntegrity);
  EXPECT_THAT(v.message(), HasSubstr("region \"" + name + "\""));
  EXPECT_THAT(v.message(), HasSubstr("vision.bin, offset " + std::to_string(reg->offset)));
}

TEST_F(VerifyVision, SourceVisionTensorChangedAfterPackingIsNamed) {
  const std::string name = "mm_projector.proj.2.weight";
  Result<st::CheckpointIndex> idx = st::CheckpointIndex::Open(Env::Default(), model_.path());
  ASSERT_TRUE(idx.ok());
  const st::CheckpointIndex::Location* loc = idx->Find(name);
  ASSERT_NE(loc, nullptr);
  test::FlipByte(loc->shard->path, loc->file_offset() + 9);
  const PreparedReport r = Run(model_.path());
  ASSERT_EQ(r.problems.size(), 1u) << RenderPreparedText(r);
  EXPECT_THAT(r.problems[0].message(), HasSubstr("region \"" + name + "\""));
  EXPECT_THAT(r.problems[0].message(), HasSubstr("first differing byte at offset 9 of the region"));
}

TEST_F(VerifyVision, TruncatedVisionBinIsNamed) {
  fs::resize_file(prep_.Join("vision.bin"), fs::file_size(prep_.Join("vision.bin")) - 4096);
  const Status v = Run().Verdict();
  EXPECT_FALSE(v.ok());
  EXPECT_THAT(v.message(), HasSubstr("vision.bin"));
}

// Without an index file, the shards are checked against config.json: a missing tower shard is
// named through the vision_config's tensors (with the index, the index names it).
TEST_F(VerifyVision, ShardsWithoutTheTowerShardAndIndexAreIncomplete) {
  ShardsOptions o;
  o.model_dir = model_.path();
  o.progress = ProgressMode::kNone;
  Result<ShardsReport> good = VerifyShards(Env::Default(), o);
  ASSERT_TRUE(good.ok());
  EXPECT_TRUE(good->Verdict().ok()) << RenderShardsText(*good);
  fs::remove(model_.Join("model.safetensors.index.json"));
  fs::remove(model_.Join("model-00016-of-000016.safetensors"));
  Result<ShardsReport> r = VerifyShards(Env::Default(), o);
  ASSERT_TRUE(r.ok());
  const Status v = r->Verdict();
  EXPECT_EQ(v.code(), Code::kInvalid);
  EXPECT_THAT(RenderShardsText(*r),
              HasSubstr("15 of 18 vision tensors that config.json's vision_config implies are "
                        "in no shard"));
  EXPECT_THAT(RenderShardsText(*r), HasSubstr("first: vision_tower.patch_embed.proj.weight"));
}

}  // namespace
}  // namespace k3::verify
