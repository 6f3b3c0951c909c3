// k3prep synth end to end: generated checkpoints load with our safetensors and config readers,
// agree with their index and layout, are deterministic, and failures write nothing.
#include "k3prep/synth/checkpoint.h"

#include <omp.h>

#include <cmath>
#include <map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/env.h"
#include "common/hash.h"
#include "formats/config.h"
#include "formats/mxfp4.h"
#include "formats/safetensors.h"
#include "k3prep/synth/pipeline.h"
#include "k3prep/synth/presets.h"
#include "k3prep/synth/weights.h"
#include "tests/support/fault_env.h"
#include "tests/support/temp_dir.h"

namespace k3::synth {
namespace {

using json = nlohmann::json;

SynthResult MustSynth(const std::string& out, const std::string& preset, uint64_t seed = 0,
                      SmallDType small = SmallDType::kMixed, Env* env = Env::Default()) {
  SynthOptions o;
  o.preset = preset;
  o.out = out;
  o.seed = seed;
  o.small = small;
  Result<SynthResult> r = RunSynth(env, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : SynthResult{};
}

std::map<std::string, std::string> HashFiles(const std::string& dir) {
  std::map<std::string, std::string> out;
  Result<std::vector<DirEntry>> entries = Env::Default()->ListDir(dir);
  EXPECT_TRUE(entries.ok());
  for (const DirEntry& e : *entries) {
    Result<Hash128> h = Xxh3_128File(Env::Default(), JoinPath(dir, e.name));
    EXPECT_TRUE(h.ok()) << e.name;
    out[e.name] = h.ok() ? h->Hex() : "";
  }
  return out;
}

std::vector<uint8_t> ReadTensor(const st::CheckpointIndex& idx, const std::string& name) {
  const st::CheckpointIndex::Location* loc = idx.Find(name);
  EXPECT_NE(loc, nullptr) << name;
  if (loc == nullptr) return {};
  std::vector<uint8_t> bytes(loc->tensor->nbytes());
  Result<std::unique_ptr<File>> f = Env::Default()->Open(loc->shard->path, OpenMode::kRead);
  EXPECT_TRUE(f.ok());
  EXPECT_TRUE((*f)->ReadExact(loc->file_offset(), bytes.size(), bytes.data()).ok());
  return bytes;
}

// Everything a reader can check about one generated checkpoint against its layout.
void CheckCheckpoint(const std::string& dir, const Layout& layout) {
  Result<st::CheckpointIndex> idx = st::CheckpointIndex::Open(Env::Default(), dir);
  ASSERT_TRUE(idx.ok()) << idx.status().ToString();  // includes index ↔ shards agreement
  ASSERT_EQ(idx->tensor_count(), layout.tensors.size());
  ASSERT_EQ(idx->shards().size(), layout.shards.size());
  for (const TensorPlan& t : layout.tensors) {
    const st::CheckpointIndex::Location* loc = idx->Find(t.name);
    ASSERT_NE(loc, nullptr) << t.name;
    EXPECT_EQ(loc->tensor->dtype, t.dtype) << t.name;
    EXPECT_EQ(loc->tensor->shape, t.shape) << t.name;
    EXPECT_EQ(loc->shard->name, layout.shards[t.shard].name) << t.name;
    EXPECT_EQ(loc->file_offset(), layout.shards[t.shard].data_offset + t.begin) << t.name;
  }
  // The index file itself: every tensor, its shard, and the sum of tensor bytes.
  Result<std::string> text =
      ReadFileToString(Env::Default(), JoinPath(dir, "model.safetensors.index.json"));
  ASSERT_TRUE(text.ok());
  const json index = json::parse(*text);
  uint64_t total = 0;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    const st::CheckpointIndex::Location* loc = idx->Find(name);
    ASSERT_NE(loc, nullptr) << name;
    EXPECT_EQ(shard.get<std::string>(), loc->shard->name);
    total += loc->tensor->nbytes();
  }
  EXPECT_EQ(index["weight_map"].size(), layout.tensors.size());
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  // The config reads back with the preset's values.
  Result<ModelConfig> c = LoadModelConfig(Env::Default(), JoinPath(dir, "config.json"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(CanonicalConfigJson(*c), CanonicalConfigJson(layout.config));
  EXPECT_EQ(c->bos_token_id, layout.config.vocab - 256);
  EXPECT_EQ(c->eos_token_id, layout.config.vocab - 254);
  EXPECT_EQ(c->pad_token_id, layout.config.vocab - 1);
  EXPECT_EQ(c->media_placeholder_token_id, layout.config.vocab - 235);
  EXPECT_TRUE(c->experts_mxfp4);
  // No temporaries left behind.
  Result<std::vector<DirEntry>> entries = Env::Default()->ListDir(dir);
  ASSERT_TRUE(entries.ok());
  for (const DirEntry& e : *entries) {
    EXPECT_EQ(e.name.find(".k3"), std::string::npos) << e.name;
  }
  EXPECT_TRUE(Env::Default()->Exists(JoinPath(dir, "tiktoken.model")));
  EXPECT_TRUE(Env::Default()->Exists(JoinPath(dir, "tokenizer_config.json")));
}

void ExpectNoScale255(const std::string& dir, const Layout& layout) {
  Result<st::CheckpointIndex> idx = st::CheckpointIndex::Open(Env::Default(), dir);
  ASSERT_TRUE(idx.ok());
  uint64_t scales = 0;
  for (const TensorPlan& t : layout.tensors) {
    if (t.part != ExpertPart::kW1Scale && t.part != ExpertPart::kW2Scale &&
        t.part != ExpertPart::kW3Scale) {
      continue;
    }
    for (uint8_t b : ReadTensor(*idx, t.name)) {
      ASSERT_NE(b, mxfp4::kScaleNaN) << t.name;
      ++scales;
    }
  }
  EXPECT_EQ(scales, layout.expert_bytes / 17);  // scale bytes are 1/17 of MXFP4 bytes
}

// ---- tiny ----

class SynthTiny : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new k3::test::TempDir();
    result_ = new SynthResult(MustSynth(dir_->Join("a"), "tiny"));
  }
  static void TearDownTestSuite() {
    delete result_;
    delete dir_;
  }
  static k3::test::TempDir* dir_;
  static SynthResult* result_;
};
k3::test::TempDir* SynthTiny::dir_ = nullptr;
SynthResult* SynthTiny::result_ = nullptr;

TEST_F(SynthTiny, LoadsAndAgreesWithIndexLayoutAndConfig) {
  CheckCheckpoint(dir_->Join("a"), result_->layout);
}

TEST_F(SynthTiny, EveryMxfp4ScaleByteIsNot255) {
  ExpectNoScale255(dir_->Join("a"), result_->layout);
}

TEST_F(SynthTiny, SameSeedGivesIdenticalFilesAtAnyThreadCount) {
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  MustSynth(dir_->Join("same"), "tiny");
  omp_set_num_threads(threads);
  EXPECT_EQ(HashFiles(dir_->Join("same")), HashFiles(dir_->Join("a")));
}

TEST_F(SynthTiny, DifferentSeedChangesEveryShard) {
  MustSynth(dir_->Join("seed7"), "tiny", 7);
  const auto a = HashFiles(dir_->Join("a"));
  const auto b = HashFiles(dir_->Join("seed7"));
  ASSERT_EQ(a.size(), b.size());
  for (const ShardPlan& sp : result_->layout.shards) {
    EXPECT_NE(a.at(sp.name), b.at(sp.name)) << sp.name;
  }
}

// The values follow the recipe (docs/SYNTH.md): matrices ~N(0, 0.02) on tiny, expert gate/up
// ~N(0, 1.2) after MXFP4, A_log linspace(−0.4, 1.2) zero-padded, bias linspace(−0.03, 0.03).
TEST_F(SynthTiny, ValuesFollowTheRecipe) {
  Result<st::CheckpointIndex> idx = st::CheckpointIndex::Open(Env::Default(), dir_->Join("a"));
  ASSERT_TRUE(idx.ok());
  auto bf16 = [&](const std::string& name) {
    std::vector<uint8_t> b = ReadTensor(*idx, name);
    std::vector<float> v(b.size() / 2);
    for (size_t i = 0; i < v.size(); ++i) {
      const uint32_t bits = static_cast<uint32_t>(b[2 * i] | (b[2 * i + 1] << 8)) << 16;
      std::memcpy(&v[i], &bits, 4);
    }
    return v;
  };
  auto f32 = [&](const std::string& name) {
    std::vector<uint8_t> b = ReadTensor(*idx, name);
    std::vector<float> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), b.size());
    return v;
  };
  auto sd = [](const std::vector<float>& v) {
    double s = 0, ss = 0;
    for (float x : v) { s += x; ss += double(x) * x; }
    const double n = static_cast<double>(v.size());
    return std::sqrt(ss / n - (s / n) * (s / n));
  };
  const std::string p = LayerPrefix(1);
  EXPECT_NEAR(sd(bf16(p + "self_attn.q_proj.weight")), 0.02, 0.002);
  EXPECT_NEAR(sd(f32(p + "self_attn.dt_bias")), 0.5, 0.1);
  const std::vector<float> a_log = f32(p + "self_attn.A_log");
  ASSERT_EQ(a_log.size(), 16u);
  EXPECT_FLOAT_EQ(a_log[0], -0.4f);
  EXPECT_FLOAT_EQ(a_log[3], 1.2f);
  for (size_t i = 4; i < 16; ++i) EXPECT_EQ(a_log[i], 0.0f) << i;
  const std::vector<float> bias = f32(p + "block_sparse_moe.gate.e_score_correction_bias");
  EXPECT_FLOAT_EQ(bias.front(), -0.03f);
  EXPECT_FLOAT_EQ(bias.back(), 0.03f);
  const std::vector<uint8_t> packed = ReadTensor(*idx, p + "block_sparse_moe.experts.3.w1.weight_packed");
  const std::vector<uint8_t> scale = ReadTensor(*idx, p + "block_sparse_moe.experts.3.w1.weight_scale");
  std::vector<float> w(packed.size() * 2);
  for (size_t r = 0; r < 64; ++r) {
    mxfp4::DecodeRow(&packed[r * 32], &scale[r * 2], 64, &w[r * 64]);
  }
  EXPECT_NEAR(sd(w), 1.2, 0.15);
}

TEST(SynthSmallDtype, F32AndBf16VariantsLoadWithTheirDtypes) {
  k3::test::TempDir dir;
  for (SmallDType small : {SmallDType::kF32, SmallDType::kBF16}) {
    const std::string out = dir.Join(SmallDTypeName(small));
    const SynthResult r = MustSynth(out, "tiny", 0, small);
    CheckCheckpoint(out, r.layout);
    Result<st::CheckpointIndex> idx = st::CheckpointIndex::Open(Env::Default(), out);
    ASSERT_TRUE(idx.ok());
    const DType want = small == SmallDType::kF32 ? DType::kF32 : DType::kBF16;
    for (const char* n : {"self_attn.A_log", "self_attn.q_conv1d.weight", "input_layernorm.weight",
                          "block_sparse_moe.gate.e_score_correction_bias"}) {
      const st::CheckpointIndex::Location* loc = idx->Find(LayerPrefix(1) + n);
      ASSERT_NE(loc, nullptr) << n;
      EXPECT_EQ(loc->tensor->dtype, want) << n;
    }
  }
}

// ---- small (≈ 280 MB) ----

TEST(SynthSmall, LoadsDeterministicallyWithValidScales) {
  k3::test::TempDir dir;
  const SynthResult r = MustSynth(dir.Join("a"), "small");
  CheckCheckpoint(dir.Join("a"), r.layout);
  ExpectNoScale255(dir.Join("a"), r.layout);
  MustSynth(dir.Join("b"), "small");
  EXPECT_EQ(HashFiles(dir.Join("a")), HashFiles(dir.Join("b")));
}

TEST(SynthSmall, DifferentSeedChangesTheBytes) {
  // In memory (no second 280 MB write): layer 5's shard for seeds 0 and 1.
  Result<ModelConfig> c = PresetConfig("small");
  ASSERT_TRUE(c.ok());
  Result<Layout> l = BuildLayout(Env::Default(), *c, SmallDType::kMixed, 0);
  ASSERT_TRUE(l.ok());
  auto shard_hash = [&](uint64_t seed) {
    const WeightGenerator gen(*l, seed);
    Xxh3_128Stream h;
    EXPECT_TRUE(RunPipeline(*l, gen, 5, 6, kDefaultChunkBytes, [&](const Chunk& ch) {
                  h.Update(ch.data.data(), ch.data.size());
                  return Status::Ok();
                }).ok());
    return h.Digest();
  };
  EXPECT_NE(shard_hash(0), shard_hash(1));
  EXPECT_EQ(shard_hash(1), shard_hash(1));
}

// ---- the bench shortcut: codes drawn from the quantiser's exact distribution ----

TEST(SynthExpertShortcut, DrawsValidScalesWithTheQuantisedSpread) {
  Result<ModelConfig> c = PresetConfig("tiny");
  ASSERT_TRUE(c.ok());
  Result<Layout> l = BuildLayout(Env::Default(), *c, SmallDType::kMixed, 0);
  ASSERT_TRUE(l.ok());
  Layout big = *l;
  big.expert_bytes = WeightGenerator::kShortcutExpertBytes + 1;  // as if experts were > 1 GB
  const WeightGenerator exact(*l, 3), shortcut(big, 3);
  ASSERT_FALSE(exact.expert_shortcut());
  ASSERT_TRUE(shortcut.expert_shortcut());
  const std::vector<Job> jobs = ShardJobs(big, 2, kMaxJobBytes);
  double ss[2] = {0, 0};
  size_t n = 0;
  for (const Job& j : jobs) {
    if (!j.expert) continue;
    std::vector<uint8_t> a(j.nbytes), b(j.nbytes);
    exact.Fill(j, a.data());
    shortcut.Fill(j, b.data());
    EXPECT_NE(a, b);
    // w1: packed [64][32] then scale [64][2].
    const uint8_t* bufs[2] = {a.data(), b.data()};
    for (int k = 0; k < 2; ++k) {
      for (size_t r = 0; r < 64; ++r) {
        const uint8_t* sc = bufs[k] + 64 * 32 + r * 2;
        EXPECT_NE(sc[0], mxfp4::kScaleNaN);
        float row[64];
        mxfp4::DecodeRow(bufs[k] + r * 32, sc, 64, row);
        for (float v : row) ss[k] += double(v) * v;
      }
    }
    n += 64 * 64;
  }
  ASSERT_GT(n, 0u);
  const double sd_exact = std::sqrt(ss[0] / double(n)), sd_short = std::sqrt(ss[1] / double(n));
  EXPECT_NEAR(sd_short, sd_exact, 0.1 * sd_exact);
}

// ---- refusals and failures write nothing ----

TEST(SynthRefusal, NotEnoughDiskWritesNothingAndNamesBothSizes) {
  k3::test::TempDir dir;
  k3::test::FaultEnv env;
  env.SetFreeSpace(1000);
  SynthOptions o;
  o.preset = "tiny";
  o.out = dir.path();
  Result<SynthResult> r = RunSynth(&env, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kIo);
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("not enough disk"), std::string::npos) << m;
  EXPECT_NE(m.find("1000 bytes"), std::string::npos) << m;
  Result<ModelConfig> c = PresetConfig("tiny");
  Result<Layout> l = BuildLayout(Env::Default(), *c, SmallDType::kMixed, 0);
  ASSERT_TRUE(l.ok());
  // "needs N bytes": N covers at least every shard.
  const size_t at = m.find("needs ");
  ASSERT_NE(at, std::string::npos) << m;
  EXPECT_GE(std::stoull(m.substr(at + 6)), l->total_file_bytes) << m;
  EXPECT_TRUE(dir.List().empty());
}

TEST(SynthRefusal, NotEnoughDiskForAMissingOutDirCreatesNothing) {
  k3::test::TempDir dir;
  k3::test::FaultEnv env;
  env.SetFreeSpace(1000);
  SynthOptions o;
  o.preset = "tiny";
  o.out = dir.Join("new/sub");
  Result<SynthResult> r = RunSynth(&env, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kIo);
  EXPECT_TRUE(dir.List().empty());
}

TEST(SynthRefusal, ForeignShardInOutIsRejectedNamingIt) {
  k3::test::TempDir dir;
  dir.WriteFile("model-00001-of-000003.safetensors", "old");
  SynthOptions o;
  o.preset = "tiny";
  o.out = dir.path();
  Result<SynthResult> r = RunSynth(Env::Default(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalid);
  EXPECT_NE(r.status().message().find("model-00001-of-000003.safetensors"), std::string::npos);
  EXPECT_EQ(dir.List().size(), 1u);
}

TEST(SynthFailure, DiskFullMidwayLeavesNoShardOrTemporary) {
  k3::test::TempDir dir;
  k3::test::FaultEnv env;
  k3::test::FaultRule full;
  full.enospc_after_bytes = 1'000'000;  // tiny writes ~4 MB
  env.SetRule(dir.path(), full);
  SynthOptions o;
  o.preset = "tiny";
  o.out = dir.path();
  Result<SynthResult> r = RunSynth(&env, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kIo);
  for (const std::string& name : dir.List()) {
    EXPECT_EQ(name.find(".safetensors"), std::string::npos) << name;
  }
}

}  // namespace
}  // namespace k3::synth
