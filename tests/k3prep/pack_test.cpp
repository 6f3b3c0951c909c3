// k3prep pack: synth → pack → the prepared directory opens, and every packed byte and hash is
// checked against the source read independently (CheckpointIndex + Env here, not the packer's
// plan). Failure modes each get a test: refusal, missing config, faults, free space, resume.
#include "k3prep/pack/pack.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/env.h"
#include "common/hash.h"
#include "formats/config.h"
#include "formats/download_manifest.h"
#include "formats/prepared_manifest.h"
#include "formats/safetensors.h"
#include "formats/vision_config.h"
#include "k3prep/pack/command.h"
#include "k3prep/synth/checkpoint.h"
#include "k3prep/synth/presets.h"
#include "tests/support/fault_env.h"
#include "tests/support/synth_fixture.h"
#include "tests/support/temp_dir.h"

namespace k3::prep {
namespace {

namespace fs = std::filesystem;
using test::FaultEnv;
using test::FaultRule;
using test::TempDir;

Env* D() { return Env::Default(); }

// tiny: 13 layers, first_k_dense_replace 1, 8 experts of 3 x (64·32 + 64·2) = 6528 bytes.
void Synth(const std::string& dir, const std::string& preset = "tiny", int shards = 0) {
  synth::SynthOptions o;
  o.preset = preset;
  o.out = dir;
  o.shards = shards;
  Result<synth::SynthResult> r = synth::RunSynth(D(), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
}

PackOptions Opts(const std::string& model, const std::string& out,
                 prepared::ExpertsMode mode = prepared::ExpertsMode::kLink) {
  PackOptions o;
  o.model_dir = model;
  o.out = out;
  o.experts = mode;
  return o;
}

std::string ReadAll(const std::string& path) {
  Result<std::string> s = ReadFileToString(D(), path);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? *s : std::string();
}

std::string ReadRange(const std::string& path, uint64_t off, uint64_t len) {
  std::string out(len, '\0');
  Result<std::unique_ptr<File>> f = D()->Open(path, OpenMode::kRead);
  EXPECT_TRUE(f.ok()) << path;
  if (!f.ok()) return {};
  Status s = (*f)->ReadExact(off, len, out.data());
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

std::string SourceTensor(const st::CheckpointIndex& idx, const std::string& name) {
  const st::CheckpointIndex::Location* loc = idx.Find(name);
  EXPECT_NE(loc, nullptr) << name;
  if (loc == nullptr) return {};
  return ReadRange(loc->shard->path, loc->file_offset(), loc->tensor->nbytes());
}

// Opens PREPARED and checks every region and expert against the source checkpoint.
void CheckAgainstSource(const std::string& prepared, const std::string& model) {
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(D(), prepared);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  Result<st::CheckpointIndex> idx = st::CheckpointIndex::Open(D(), model);
  ASSERT_TRUE(idx.ok()) << idx.status().ToString();
  size_t tensor_regions = 0;
  for (const prepared::Region& r : p->manifest.regions) {
    const std::string got = ReadRange(JoinPath(prepared, r.file), r.offset, r.length);
    std::string want;
    if (r.file == "trunk.bin" || r.file == "resident.bin" || r.file == "vision.bin") {
      want = SourceTensor(*idx, r.name);
      ++tensor_regions;
    } else if (r.file.rfind("tokenizer/", 0) == 0) {
      want = ReadAll(JoinPath(model, r.file.substr(10)));
    } else {
      want = got;  // experts.idx: checked through the records below
    }
    ASSERT_EQ(got, want) << "region " << r.name;
    EXPECT_EQ(r.xxh3_128, Xxh3_128(want.data(), want.size())) << "region " << r.name;
  }
  // Every non-expert tensor is a region (the vision ones in vision.bin).
  size_t non_expert = 0;
  for (const auto& loc : idx->All()) {
    // Vision tensors are carried only when the config has a vision_config.
    if (IsVisionTensorName(loc.tensor->name) && !p->manifest.vision) continue;
    if (loc.tensor->name.find(".experts.") == std::string::npos) ++non_expert;
  }
  EXPECT_EQ(tensor_regions, non_expert);
  const ModelConfig& c = p->manifest.config;
  ASSERT_EQ(p->experts.records.size(),
            static_cast<size_t>(c.n_moe_layers()) * static_cast<size_t>(c.n_experts));
  for (int layer = c.first_dense; layer < c.n_layers; ++layer) {
    for (int e = 0; e < c.n_experts; ++e) {
      const prepared::ExpertRecord& rec = p->experts.At(static_cast<uint32_t>(layer),
                                              static_cast<uint32_t>(e));
      std::string want;
      for (int s = 0; s < prepared::kExpertSubCount; ++s) want += SourceTensor(*idx, prepared::ExpertTensorName(layer, e, s));
      const std::string got = ReadRange(p->expert_paths[rec.file_id], rec.offset, rec.length);
      ASSERT_EQ(got, want) << "layer " << layer << " expert " << e;
      EXPECT_EQ(rec.xxh3_64, Xxh3_64(want.data(), want.size()))
          << "layer " << layer << " expert " << e;
    }
  }
}

// Files that exist only when a pack finished.
const char* const kFinalNames[] = {"k3.json", "k3.sum", "trunk.bin", "resident.bin",
                                   "experts.idx", "vision.bin"};

void ExpectNoFinalNames(const std::string& out) {
  for (const char* name : kFinalNames) {
    EXPECT_FALSE(fs::exists(JoinPath(out, name))) << name << " exists under its final name";
  }
  if (fs::exists(JoinPath(out, "experts"))) {
    for (const auto& e : fs::directory_iterator(JoinPath(out, "experts"))) {
      EXPECT_NE(e.path().extension(), ".bin") << e.path();
    }
  }
}

std::map<std::string, std::string> HashTree(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const std::string data = ReadAll(e.path().string());
    out[fs::relative(e.path(), dir).string()] = Xxh3_128(data.data(), data.size()).Hex();
  }
  return out;
}

// The tiny checkpoint is the run's shared fixture (built once per CTest run, read-only: tests
// that alter a checkpoint copy it first; fixtures.check fails if any byte of it changed).
class PackTiny : public ::testing::Test {
 protected:
  static std::string Model() {
    return test::SynthFixture({"tiny", 0, prepared::ExpertsMode::kCopy}).checkpoint;
  }
  TempDir tmp_;
};

TEST_F(PackTiny, LinkModeOpensAndEveryByteMatchesTheSource) {
  const std::string out = tmp_.Join("prep");
  Result<PackResult> r = RunPack(D(), Opts(Model(), out));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  CheckAgainstSource(out, Model());
  const prepared::Manifest& m = r->manifest;
  EXPECT_EQ(m.experts_mode, prepared::ExpertsMode::kLink);
  // Link paths are shard names relative to model_dir; no expert bytes were copied.
  for (const prepared::FileEntry& f : m.expert_files) EXPECT_EQ(f.path.find('/'), std::string::npos);
  EXPECT_FALSE(fs::exists(JoinPath(out, "experts")));
  EXPECT_TRUE(fs::exists(JoinPath(out, "tokenizer/tiktoken.model")));
  EXPECT_TRUE(fs::exists(JoinPath(out, "tokenizer/tokenizer_config.json")));
  EXPECT_FALSE(fs::exists(JoinPath(out, std::string(kPackJournalFile))));
  EXPECT_EQ(m.source.model_dir_given, Model());
  EXPECT_EQ(m.source.model_dir_abs, fs::canonical(Model()).string());
}

TEST_F(PackTiny, CopyModeOpensAndEveryByteMatchesTheSource) {
  const std::string out = tmp_.Join("prep");
  Result<PackResult> r = RunPack(D(), Opts(Model(), out, prepared::ExpertsMode::kCopy));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  CheckAgainstSource(out, Model());
  // One file per MoE layer (12), each expert 4096-aligned.
  EXPECT_EQ(r->manifest.expert_files.size(), 12u);
  EXPECT_TRUE(fs::exists(JoinPath(out, "experts/layer-001.bin")));
}

TEST_F(PackTiny, CopyModeStripeOverTwoDirsFollowsTheStripeRule) {
  const std::string out = tmp_.Join("prep");
  PackOptions o = Opts(Model(), out, prepared::ExpertsMode::kCopy);
  o.stripe_dirs = {tmp_.Join("d0"), tmp_.Join("d1")};
  Result<PackResult> r = RunPack(D(), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  CheckAgainstSource(out, Model());
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(D(), out);
  ASSERT_TRUE(p.ok());
  const ModelConfig& c = p->manifest.config;
  const std::string d0 = fs::canonical(tmp_.Join("d0")).string();
  const std::string d1 = fs::canonical(tmp_.Join("d1")).string();
  for (int layer = c.first_dense; layer < c.n_layers; ++layer) {
    for (int e = 0; e < c.n_experts; ++e) {
      const prepared::ExpertRecord& rec = p->experts.At(static_cast<uint32_t>(layer), static_cast<uint32_t>(e));
      const std::string& path = p->experts.files[rec.file_id];
      const std::string& want = (layer * c.n_experts + e) % 2 == 0 ? d0 : d1;
      EXPECT_EQ(path.rfind(want + "/", 0), 0u) << "layer " << layer << " expert " << e << ": " << path;
      EXPECT_EQ(rec.offset % 4096, 0u);
    }
  }
  EXPECT_FALSE(fs::exists(JoinPath(out, "experts")));
}

TEST_F(PackTiny, LinkModeWithStripeIsAUsageError) {
  PackOptions o = Opts(Model(), tmp_.Join("prep"));
  o.stripe_dirs = {tmp_.Join("d0")};
  Result<PackResult> r = RunPack(D(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_NE(r.status().message().find("--experts copy"), std::string::npos);
  EXPECT_FALSE(fs::exists(tmp_.Join("prep")));
}

// Nothing time- or thread-dependent: two packs (different --jobs and window sizes) give the
// same bytes everywhere.
TEST_F(PackTiny, PackingTwiceIsByteIdenticalAcrossJobsAndWindows) {
  for (prepared::ExpertsMode mode : {prepared::ExpertsMode::kLink, prepared::ExpertsMode::kCopy}) {
    PackOptions a = Opts(Model(), tmp_.Join(std::string("a-") + prepared::ExpertsModeName(mode)), mode);
    a.jobs = 1;
    PackOptions b = Opts(Model(), tmp_.Join(std::string("b-") + prepared::ExpertsModeName(mode)), mode);
    b.jobs = 2;
    b.window_bytes = 8192;  // many window boundaries inside tensors and experts
    ASSERT_TRUE(RunPack(D(), a).ok());
    ASSERT_TRUE(RunPack(D(), b).ok());
    EXPECT_EQ(ReadAll(JoinPath(a.out, "k3.json")), ReadAll(JoinPath(b.out, "k3.json")));
    EXPECT_EQ(HashTree(a.out), HashTree(b.out));
  }
}

TEST_F(PackTiny, SourceSha256ComesOnlyFromTheDownloadManifest) {
  TempDir model;
  fs::copy(Model(), model.path(), fs::copy_options::recursive);
  Result<PackResult> none = RunPack(D(), Opts(model.path(), tmp_.Join("p0")));
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  for (const prepared::SourceShard& s : none->manifest.source.shards) EXPECT_TRUE(s.sha256.empty()) << s.name;

  const std::string shard = none->manifest.source.shards[2].name;
  dl::DownloadManifest dm;
  dm.repo = "moonshotai/Kimi-K3";
  dm.commit = std::string(40, 'a');
  dm.endpoint = "https://huggingface.co";
  dm.files.push_back(dl::DownloadFile{shard, none->manifest.source.shards[2].size,
                                      std::string(64, 'b'), "2025-11-29T08:55:01Z"});
  ASSERT_TRUE(dl::WriteDownloadManifest(D(), model.Join("k3-download.json"), dm).ok());
  Result<PackResult> some = RunPack(D(), Opts(model.path(), tmp_.Join("p1")));
  ASSERT_TRUE(some.ok()) << some.status().ToString();
  for (const prepared::SourceShard& s : some->manifest.source.shards) {
    EXPECT_EQ(s.sha256, s.name == shard ? std::string(64, 'b') : std::string()) << s.name;
  }
  EXPECT_NE(ReadAll(JoinPath(tmp_.Join("p1"), "k3.json")).find(std::string(64, 'b')),
            std::string::npos);
}

TEST_F(PackTiny, ShardSizeContradictingTheDownloadManifestIsAnIntegrityFailure) {
  TempDir model;
  fs::copy(Model(), model.path(), fs::copy_options::recursive);
  Result<st::CheckpointIndex> idx = st::CheckpointIndex::Open(D(), model.path());
  ASSERT_TRUE(idx.ok());
  const std::string shard = idx->shards()[0]->name;
  dl::DownloadManifest dm;
  dm.repo = "moonshotai/Kimi-K3";
  dm.commit = std::string(40, 'a');
  dm.endpoint = "https://huggingface.co";
  dm.files.push_back(dl::DownloadFile{shard, idx->shards()[0]->header.file_size + 1,
                                      std::string(64, 'b'), "2025-11-29T08:55:01Z"});
  ASSERT_TRUE(dl::WriteDownloadManifest(D(), model.Join("k3-download.json"), dm).ok());
  Result<PackResult> r = RunPack(D(), Opts(model.path(), tmp_.Join("p")));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().exit_code(), 3);
  EXPECT_NE(r.status().message().find(shard), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("k3verify shards"), std::string::npos);
  EXPECT_FALSE(fs::exists(tmp_.Join("p")));
}

// Rewrites the shard holding layer `layer` with expert `e`'s w1.weight_scale and
// w2.weight_packed swapped in data order (names, dtypes and shapes unchanged).
void ReorderExpert(const std::string& model, int layer, int e) {
  Result<st::CheckpointIndex> idx = st::CheckpointIndex::Open(D(), model);
  ASSERT_TRUE(idx.ok());
  const st::CheckpointIndex::Location* loc = idx->Find(prepared::ExpertTensorName(layer, e, 1));
  ASSERT_NE(loc, nullptr);
  const std::string path = loc->shard->path;
  std::vector<const st::TensorInfo*> order;
  for (const st::TensorInfo& t : loc->shard->header.tensors) order.push_back(&t);
  auto a = std::find_if(order.begin(), order.end(),
                        [&](auto* t) { return t->name == prepared::ExpertTensorName(layer, e, 1); });
  auto b = std::find_if(order.begin(), order.end(),
                        [&](auto* t) { return t->name == prepared::ExpertTensorName(layer, e, 2); });
  ASSERT_TRUE(a != order.end() && b != order.end());
  std::iter_swap(a, b);
  std::vector<std::string> data;
  for (const st::TensorInfo* t : order) {
    data.push_back(ReadRange(path, loc->shard->header.data_offset + t->begin, t->nbytes()));
  }
  st::Writer w(D(), path);
  for (const st::TensorInfo* t : order) w.Add(t->name, t->dtype, t->shape);
  ASSERT_TRUE(w.Begin().ok());
  for (const std::string& d : data) ASSERT_TRUE(w.Append(d.data(), d.size()).ok());
  ASSERT_TRUE(w.Finish().ok());
}

TEST_F(PackTiny, LinkModeRefusesANonContiguousExpertNamingItAndCopyModePacksIt) {
  TempDir model;
  fs::copy(Model(), model.path(), fs::copy_options::recursive);
  ReorderExpert(model.path(), 5, 3);
  const std::string out = tmp_.Join("link");
  Result<PackResult> r = RunPack(D(), Opts(model.path(), out));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  const std::string& msg = r.status().message();
  EXPECT_NE(msg.find("layer 5 expert 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--experts copy"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(out));

  const std::string copy = tmp_.Join("copy");
  Result<PackResult> c = RunPack(D(), Opts(model.path(), copy, prepared::ExpertsMode::kCopy));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  CheckAgainstSource(copy, model.path());
}

// The public C99 engine's test generator: one model.safetensors and a flat config.json
// without quantization_config; U8 experts mean MXFP4.
TEST_F(PackTiny, SingleFileCheckpointWithFlatConfigPacks) {
  TempDir t;
  const std::string one = t.Join("one");
  Synth(one, "tiny", 1);
  const std::string model = t.Join("flat");
  fs::create_directories(model);
  Result<st::CheckpointIndex> idx = st::CheckpointIndex::Open(D(), one);
  ASSERT_TRUE(idx.ok());
  ASSERT_EQ(idx->shards().size(), 1u);
  fs::copy_file(idx->shards()[0]->path, JoinPath(model, "model.safetensors"));
  Result<ModelConfig> c = LoadModelConfig(D(), JoinPath(one, "config.json"));
  ASSERT_TRUE(c.ok());
  nlohmann::json flat = nlohmann::json::parse(CanonicalConfigJson(*c));
  flat.erase("experts_mxfp4");
  flat.erase("mxfp4_group_size");
  t.WriteFile("flat/config.json", flat.dump(1));
  Result<ModelConfig> parsed = LoadModelConfig(D(), JoinPath(model, "config.json"));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_FALSE(parsed->experts_mxfp4);  // the case under test: no quantization_config

  for (prepared::ExpertsMode mode : {prepared::ExpertsMode::kLink, prepared::ExpertsMode::kCopy}) {
    const std::string out = t.Join(std::string("p-") + prepared::ExpertsModeName(mode));
    Result<PackResult> r = RunPack(D(), Opts(model, out, mode));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->manifest.config.experts_mxfp4);
    ASSERT_EQ(r->manifest.source.shards.size(), 1u);
    EXPECT_EQ(r->manifest.source.shards[0].name, "model.safetensors");
    CheckAgainstSource(out, model);
  }
}

TEST_F(PackTiny, MissingConfigIsInvalidInputNamingIt) {
  TempDir model;
  fs::copy(Model(), model.path(), fs::copy_options::recursive);
  fs::remove(model.Join("config.json"));
  Result<PackResult> r = RunPack(D(), Opts(model.path(), tmp_.Join("p")));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_NE(r.status().message().find("config.json"), std::string::npos);
  EXPECT_FALSE(fs::exists(tmp_.Join("p")));
}

// A FIFO named like a shard blocked the pack forever in open(2); it is refused by name.
TEST_F(PackTiny, FifoNamedLikeAShardIsRefusedNotWaitedOn) {
  TempDir model;
  fs::copy(Model(), model.path(), fs::copy_options::recursive);
  std::string shard;
  for (const auto& e : fs::directory_iterator(model.path())) {
    if (e.path().extension() == ".safetensors") shard = e.path().string();
  }
  ASSERT_FALSE(shard.empty());
  fs::remove(shard);
  ASSERT_EQ(::mkfifo(shard.c_str(), 0644), 0);
  Result<PackResult> r = RunPack(D(), Opts(model.path(), tmp_.Join("p")));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_NE(r.status().message().find(shard + ": is a FIFO (named pipe), expected a regular file"),
            std::string::npos)
      << r.status().message();
}

TEST_F(PackTiny, MissingModelDirIsInvalidInput) {
  Result<PackResult> r = RunPack(D(), Opts(tmp_.Join("nope"), tmp_.Join("p")));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_NE(r.status().message().find(tmp_.Join("nope")), std::string::npos);
}

TEST_F(PackTiny, NotEnoughFreeSpaceWritesNothingAndNamesBothSizes) {
  FaultEnv env;
  env.SetFreeSpace(100000);
  const std::string out = tmp_.Join("p");
  Result<PackResult> r = RunPack(&env, Opts(Model(), out, prepared::ExpertsMode::kCopy));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().exit_code(), 1);
  const std::string& msg = r.status().message();
  EXPECT_NE(msg.find("not enough disk space"), std::string::npos) << msg;
  EXPECT_NE(msg.find("needs"), std::string::npos) << msg;
  EXPECT_NE(msg.find("100000 bytes"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(PackTiny, EnospcDuringTrunkWriteLeavesNoFinalNames) {
  FaultEnv env;
  const std::string out = tmp_.Join("p");
  env.SetRule(JoinPath(out, "trunk.bin"), FaultRule::EnospcAfter(20000));
  PackOptions o = Opts(Model(), out);
  o.window_bytes = 8192;
  Result<PackResult> r = RunPack(&env, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().exit_code(), 1);
  EXPECT_NE(r.status().message().find("trunk.bin"), std::string::npos) << r.status().message();
  ExpectNoFinalNames(out);
}

TEST_F(PackTiny, EioReadingAShardLeavesNoFinalNamesAndNamesTheShard) {
  Result<st::CheckpointIndex> idx = st::CheckpointIndex::Open(D(), Model());
  ASSERT_TRUE(idx.ok());
  const std::string shard = idx->shards()[3]->path;
  for (prepared::ExpertsMode mode : {prepared::ExpertsMode::kLink, prepared::ExpertsMode::kCopy}) {
    FaultEnv env;
    env.SetRule(shard, FaultRule::EioAt(idx->shards()[3]->header.file_size - 10));
    const std::string out = tmp_.Join(std::string("p-") + prepared::ExpertsModeName(mode));
    Result<PackResult> r = RunPack(&env, Opts(Model(), out, mode));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().exit_code(), 1);
    EXPECT_NE(r.status().message().find(shard), std::string::npos) << r.status().message();
    ExpectNoFinalNames(out);
  }
}

TEST_F(PackTiny, FsyncFailureLeavesNoFinalNames) {
  FaultEnv env;
  const std::string out = tmp_.Join("p");
  env.SetRule(JoinPath(out, "resident.bin"), FaultRule::SyncFails());
  Result<PackResult> r = RunPack(&env, Opts(Model(), out));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().exit_code(), 1);
  EXPECT_NE(r.status().message().find("resident.bin"), std::string::npos) << r.status().message();
  ExpectNoFinalNames(out);
}

TEST_F(PackTiny, RenameFailureLeavesNoFinalNames) {
  // resident.bin is renamed after trunk.bin; the finished rename must be rolled back.
  for (const char* failing : {"resident.bin", "experts.idx", "k3.sum"}) {
    FaultEnv env;
    const std::string out = tmp_.Join(std::string("p-") + failing);
    env.SetRule(JoinPath(out, failing), FaultRule::RenameFails());
    Result<PackResult> r = RunPack(&env, Opts(Model(), out, prepared::ExpertsMode::kCopy));
    ASSERT_FALSE(r.ok()) << failing;
    EXPECT_EQ(r.status().exit_code(), 1);
    EXPECT_NE(r.status().message().find("--resume"), std::string::npos) << r.status().message();
    ExpectNoFinalNames(out);
    // ... and the temporaries are all there, so --resume finishes with nothing to redo.
    PackOptions o = Opts(Model(), out, prepared::ExpertsMode::kCopy);
    o.resume = true;
    Result<PackResult> again = RunPack(D(), o);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->stats.units_reused, again->stats.units_total) << failing;
    CheckAgainstSource(out, Model());
  }
}

TEST_F(PackTiny, EarlierPackOutputIsRefusedWithoutResume) {
  FaultEnv env;
  const std::string out = tmp_.Join("p");
  env.SetRule(JoinPath(out, "resident.bin"), FaultRule::EnospcAfter(0));
  ASSERT_FALSE(RunPack(&env, Opts(Model(), out)).ok());
  Result<PackResult> r = RunPack(D(), Opts(Model(), out));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_NE(r.status().message().find("--resume"), std::string::npos) << r.status().message();
}

TEST_F(PackTiny, CompletePreparedDirIsRefusedEvenWithResume) {
  const std::string out = tmp_.Join("p");
  ASSERT_TRUE(RunPack(D(), Opts(Model(), out)).ok());
  for (bool resume : {false, true}) {
    PackOptions o = Opts(Model(), out);
    o.resume = resume;
    Result<PackResult> r = RunPack(D(), o);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().exit_code(), 2);
    EXPECT_NE(r.status().message().find("k3.sum"), std::string::npos) << r.status().message();
  }
}

// Packs `model` into `out` in link mode and stops after k3.sum landed, before the journal was
// removed (the last step; the failing unlink stands in for a kill there).
void PackLeavingTheJournal(const std::string& model, const std::string& out) {
  const std::string journal = JoinPath(out, std::string(kPackJournalFile));
  FaultEnv env;
  env.SetRule(journal, FaultRule::RemoveFails());
  ASSERT_FALSE(RunPack(&env, Opts(model, out)).ok());
  ASSERT_TRUE(D()->Exists(JoinPath(out, std::string(prepared::kSumFile))));
  ASSERT_TRUE(D()->Exists(journal));
}

// Without --resume the leftover journal is refused naming it; --resume checks the directory,
// removes the journal and re-reads nothing.
TEST_F(PackTiny, JournalLeftAfterTheSumIsRemovedByResume) {
  const std::string out = tmp_.Join("p");
  const std::string journal = JoinPath(out, std::string(kPackJournalFile));
  ASSERT_NO_FATAL_FAILURE(PackLeavingTheJournal(Model(), out));

  Result<PackResult> plain = RunPack(D(), Opts(Model(), out));
  ASSERT_FALSE(plain.ok());
  EXPECT_EQ(plain.status().exit_code(), 2);
  EXPECT_NE(plain.status().message().find(journal), std::string::npos) << plain.status().message();
  EXPECT_NE(plain.status().message().find("--resume"), std::string::npos);
  EXPECT_TRUE(D()->Exists(journal));

  const std::map<std::string, std::string> before = HashTree(out);
  PackOptions o = Opts(Model(), out);
  o.resume = true;
  Result<PackResult> r = RunPack(D(), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->already_complete);
  EXPECT_EQ(r->stats.bytes_read, 0u);
  EXPECT_FALSE(D()->Exists(journal));
  std::map<std::string, std::string> after = HashTree(out);
  after[std::string(kPackJournalFile)] = before.at(std::string(kPackJournalFile));
  EXPECT_EQ(after, before);  // nothing but the journal changed
  CheckAgainstSource(out, Model());
}

// The leftover journal must be this plan's: a --resume in another experts mode is refused and
// the journal stays for the user to look at.
TEST_F(PackTiny, JournalLeftAfterTheSumOfAnotherPlanIsRefused) {
  const std::string out = tmp_.Join("p");
  const std::string journal = JoinPath(out, std::string(kPackJournalFile));
  ASSERT_NO_FATAL_FAILURE(PackLeavingTheJournal(Model(), out));
  PackOptions copy = Opts(Model(), out, prepared::ExpertsMode::kCopy);
  copy.resume = true;
  Result<PackResult> r = RunPack(D(), copy);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_NE(r.status().message().find("belongs to another pack"), std::string::npos)
      << r.status().message();
  EXPECT_TRUE(D()->Exists(journal));
}

// Interrupt with ENOSPC part-way through the expert files, then resume with a healthy disk: the
// result is identical to an uninterrupted pack and finished units were re-verified, not redone.
TEST_F(PackTiny, ResumeAfterEnospcIsIdenticalAndReusesFinishedUnits) {
  const std::string ref = tmp_.Join("ref");
  ASSERT_TRUE(RunPack(D(), Opts(Model(), ref, prepared::ExpertsMode::kCopy)).ok());

  const std::string out = tmp_.Join("p");
  FaultEnv env;
  env.SetRule(JoinPath(out, "experts/layer-007.bin"), FaultRule::EnospcAfter(3 * 8192));
  PackOptions o = Opts(Model(), out, prepared::ExpertsMode::kCopy);
  o.window_bytes = 8192;
  o.journal_flush_bytes = 16384;
  Result<PackResult> failed = RunPack(&env, o);
  ASSERT_FALSE(failed.ok());
  ExpectNoFinalNames(out);
  ASSERT_TRUE(fs::exists(JoinPath(out, std::string(kPackJournalFile))));

  o.resume = true;
  Result<PackResult> r = RunPack(D(), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // Trunk (13 runs) + resident (5) + vision (18 tensors: 2 blocks x 6, 3 tower, 3 projector) +
  // experts of layers 1..6 (48) finished before layer 7 failed; of layer 7, only experts whose
  // bytes and padding fit in 3 windows (2 x 8192 each, padded).
  const uint64_t finished_before = 13 + 5 + 18 + 6 * 8;
  EXPECT_GE(r->stats.units_reused, finished_before);
  EXPECT_LT(r->stats.units_reused, r->stats.units_total);
  EXPECT_EQ(r->stats.units_total, 13u + 5u + 18u + 12u * 8u);
  EXPECT_GT(r->stats.regions_reused, 0u);
  EXPECT_GE(r->stats.experts_reused, 6u * 8u);
  EXPECT_EQ(HashTree(out), HashTree(ref));
  CheckAgainstSource(out, Model());
}

TEST_F(PackTiny, ResumeRedoesAUnitWhoseTemporaryBytesChanged) {
  const std::string ref = tmp_.Join("ref");
  ASSERT_TRUE(RunPack(D(), Opts(Model(), ref)).ok());
  const std::string out = tmp_.Join("p");
  FaultEnv env;
  env.SetRule(JoinPath(out, "resident.bin"), FaultRule::EnospcAfter(0));
  PackOptions o = Opts(Model(), out);
  ASSERT_FALSE(RunPack(&env, o).ok());
  // Flip one byte inside layer 2's run of the finished trunk temporary.
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(D(), ref);
  ASSERT_TRUE(p.ok());
  const uint64_t at = p->manifest.runs[2].offset + 100;
  {
    Result<std::unique_ptr<File>> f = D()->Open(JoinPath(out, "trunk.bin.k3tmp"), OpenMode::kReadWrite);
    ASSERT_TRUE(f.ok());
    char byte = 0;
    ASSERT_TRUE((*f)->ReadExact(at, 1, &byte).ok());
    byte = static_cast<char>(byte ^ 0x40);
    ASSERT_TRUE((*f)->WriteExact(at, &byte, 1).ok());
  }
  o.resume = true;
  Result<PackResult> r = RunPack(D(), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stats.units_reused, 12u);  // 13 trunk runs, one of them redone
  EXPECT_EQ(HashTree(out), HashTree(ref));
}

TEST_F(PackTiny, ResumeDiscardsAJournalOfAnotherPlanAndATornLine) {
  const std::string out = tmp_.Join("p");
  FaultEnv env;
  env.SetRule(JoinPath(out, "resident.bin"), FaultRule::EnospcAfter(0));
  ASSERT_FALSE(RunPack(&env, Opts(Model(), out)).ok());
  // A torn last line (a crash while appending) is ignored, the lines before it still count.
  const std::string journal = JoinPath(out, std::string(kPackJournalFile));
  {
    Result<std::unique_ptr<File>> f = D()->Open(journal, OpenMode::kReadWrite);
    ASSERT_TRUE(f.ok());
    Result<uint64_t> size = (*f)->Size();
    ASSERT_TRUE(size.ok());
    const std::string torn = "u 13 0123";
    ASSERT_TRUE((*f)->WriteExact(*size, torn.data(), torn.size()).ok());
  }
  // The same directory resumed in copy mode: another output plan, so nothing is reused.
  PackOptions copy = Opts(Model(), out, prepared::ExpertsMode::kCopy);
  copy.resume = true;
  Result<PackResult> r = RunPack(D(), copy);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stats.units_reused, 0u);
  CheckAgainstSource(out, Model());
}

TEST_F(PackTiny, ResumeIgnoresATornJournalLine) {
  const std::string out = tmp_.Join("p");
  FaultEnv env;
  env.SetRule(JoinPath(out, "resident.bin"), FaultRule::EnospcAfter(0));
  ASSERT_FALSE(RunPack(&env, Opts(Model(), out)).ok());
  const std::string journal = JoinPath(out, std::string(kPackJournalFile));
  std::string text = ReadAll(journal);
  ASSERT_GT(text.size(), 100u);
  // Cut the last line in half: that unit is redone, the others are kept.
  text.resize(text.size() - 30);
  ASSERT_TRUE(WriteFileAtomic(D(), journal, text).ok());
  PackOptions o = Opts(Model(), out);
  o.resume = true;
  Result<PackResult> r = RunPack(D(), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stats.units_reused, 12u);  // 13 trunk runs journaled, the last line torn
  CheckAgainstSource(out, Model());
}

TEST_F(PackTiny, JobsBelowOneIsAUsageError) {
  PackOptions o = Opts(Model(), tmp_.Join("p"));
  o.jobs = 0;
  Result<PackResult> r = RunPack(D(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_NE(r.status().message().find("--jobs"), std::string::npos);
}

TEST_F(PackTiny, CheckpointWithoutTokenizerPacksWithoutTokenizerDir) {
  TempDir model;
  fs::copy(Model(), model.path(), fs::copy_options::recursive);
  fs::remove(model.Join("tiktoken.model"));
  fs::remove(model.Join("tokenizer_config.json"));
  const std::string out = tmp_.Join("p");
  Result<PackResult> r = RunPack(D(), Opts(model.path(), out));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(fs::exists(JoinPath(out, "tokenizer")));
  for (const prepared::Region& reg : r->manifest.regions) EXPECT_NE(reg.file.rfind("tokenizer/", 0), 0u);
  CheckAgainstSource(out, model.path());
}

// ---- vision.bin ----

TEST_F(PackTiny, VisionTowerAndProjectorGoToVisionBinInCanonicalOrder) {
  const std::string out = tmp_.Join("p");
  Result<PackResult> r = RunPack(D(), Opts(Model(), out));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const prepared::Manifest& m = r->manifest;
  ASSERT_TRUE(m.vision.has_value());
  EXPECT_EQ(m.vision->text_hidden, m.config.hidden);
  const std::vector<VisionTensor> want = VisionTensors(*m.vision);
  std::vector<const prepared::Region*> got;
  for (const prepared::Region& reg : m.regions) {
    if (reg.file == "vision.bin") got.push_back(&reg);
  }
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i]->name, want[i].name);
    EXPECT_EQ(got[i]->offset % 4096, 0u) << want[i].name;
    EXPECT_EQ(got[i]->shape, want[i].shape);
  }
  const prepared::FileEntry* f = m.FindFile("vision.bin");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->size, fs::file_size(JoinPath(out, "vision.bin")));
  CheckAgainstSource(out, Model());  // every vision byte equals the shards' (and its hash)
}

TEST_F(PackTiny, NoVisionMakesATextOnlyDirectoryThatOpens) {
  const std::string out = tmp_.Join("p");
  PackOptions o = Opts(Model(), out);
  o.vision = false;
  Result<PackResult> r = RunPack(D(), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->manifest.vision.has_value());
  EXPECT_FALSE(fs::exists(JoinPath(out, "vision.bin")));
  for (const prepared::Region& reg : r->manifest.regions) EXPECT_NE(reg.file, "vision.bin");
  CheckAgainstSource(out, Model());
}

TEST_F(PackTiny, VisionConfigWithoutVisionTensorsIsRefusedNamingTheTensor) {
  TempDir model;
  synth::SynthOptions so;
  so.preset = "tiny";
  so.out = model.path();
  so.vision = false;  // shards without the vision part ...
  ASSERT_TRUE(synth::RunSynth(D(), so).ok());
  Result<ModelConfig> c = synth::ResolveSynthConfig(so);
  ASSERT_TRUE(c.ok());
  Result<VisionConfig> v = synth::PresetVision("tiny", c->hidden);
  ASSERT_TRUE(v.ok());
  // ... under a config.json that has a vision_config.
  ASSERT_TRUE(WriteFileAtomic(D(), model.Join("config.json"), ReleasedConfigJson(*c, &*v)).ok());
  const std::string out = tmp_.Join("p");
  Result<PackResult> r = RunPack(D(), Opts(model.path(), out));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalid);
  EXPECT_NE(r.status().message().find("vision_tower.patch_embed.proj.weight: missing"),
            std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("--no-vision"), std::string::npos);
  ExpectNoFinalNames(out);
  PackOptions o = Opts(model.path(), out);
  o.vision = false;
  ASSERT_TRUE(RunPack(D(), o).ok());  // the way out the message names
}

TEST_F(PackTiny, ManifestVisionRulesAreChecked) {
  const std::string out = tmp_.Join("p");
  Result<PackResult> r = RunPack(D(), Opts(Model(), out));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(prepared::ValidateManifest(r->manifest, "k3.json").ok());
  const auto first_vision = [](prepared::Manifest* m) {
    for (prepared::Region& reg : m->regions) {
      if (reg.file == "vision.bin") return &reg;
    }
    return static_cast<prepared::Region*>(nullptr);
  };
  {  // a region moved off the canonical offset
    prepared::Manifest m = r->manifest;
    prepared::Region* reg = first_vision(&m);
    ASSERT_NE(reg, nullptr);
    reg->offset += 64;
    const Status s = prepared::ValidateManifest(m, "k3.json");
    EXPECT_NE(s.message().find("the format places it at offset 0"), std::string::npos) << s.ToString();
  }
  {  // vision.bin without its config
    prepared::Manifest m = r->manifest;
    m.vision.reset();
    const Status s = prepared::ValidateManifest(m, "k3.json");
    EXPECT_NE(s.message().find("vision.bin is listed but \"vision\""), std::string::npos)
        << s.ToString();
  }
  {  // a config whose blocks do not match the regions
    prepared::Manifest m = r->manifest;
    m.vision->layers += 1;
    const Status s = prepared::ValidateManifest(m, "k3.json");
    EXPECT_NE(s.message().find("vision_tower.encoder.blocks.2.norm0.weight: missing"),
              std::string::npos) << s.ToString();
  }
  {  // a projector for another text width
    prepared::Manifest m = r->manifest;
    m.vision->text_hidden = 256;
    const Status s = prepared::ValidateManifest(m, "k3.json");
    EXPECT_NE(s.message().find("vision.text_hidden_size 256 differs"), std::string::npos)
        << s.ToString();
  }
  // The manifest round-trips through its text with the vision key.
  Result<std::string> text = prepared::RenderManifest(r->manifest);
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("\"vision\": {"), std::string::npos);
  Result<prepared::Manifest> back = prepared::ParseManifest(*text, "k3.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->vision, r->manifest.vision);
}

TEST_F(PackTiny, SubcommandParsesFlagsAndPacks) {
  CLI::App app("k3prep", "k3prep");
  OutputOptions out;
  CLI::App* cmd = AddPackCommand(&app, &out);
  const std::string dir = tmp_.Join("p");
  const std::string d0 = tmp_.Join("s0"), d1 = tmp_.Join("s1");
  std::vector<std::string> args = {"k3prep", "pack", Model(), "--out", dir, "--experts", "copy",
                                   "--stripe", d0 + "," + d1, "--jobs", "1", "--quiet"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  ASSERT_NO_THROW(app.parse(static_cast<int>(argv.size()), argv.data()));
  ASSERT_TRUE(cmd->parsed());
  Status s = RunPackCommand(cmd);
  ASSERT_TRUE(s.ok()) << s.ToString();
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(D(), dir);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->manifest.experts_mode, prepared::ExpertsMode::kCopy);
  EXPECT_TRUE(fs::exists(JoinPath(d0, "layer-001.bin")));
  EXPECT_TRUE(fs::exists(JoinPath(d1, "layer-001.bin")));
}

// The small preset (93 layers, 64 experts, the released layer map; the run's shared checkpoint,
// read-only): copy mode striped over two dirs, and link mode.
TEST(PackSmall, LinkAndStripedCopyMatchTheSource) {
  TempDir t;
  const std::string model =
      test::SynthFixture({"small", 0, prepared::ExpertsMode::kCopy}).checkpoint;
  const std::string link = t.Join("link");
  Result<PackResult> a = RunPack(D(), Opts(model, link));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  CheckAgainstSource(link, model);
  PackOptions o = Opts(model, t.Join("copy"), prepared::ExpertsMode::kCopy);
  o.stripe_dirs = {t.Join("d0"), t.Join("d1")};
  Result<PackResult> b = RunPack(D(), o);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  CheckAgainstSource(t.Join("copy"), model);
}

}  // namespace
}  // namespace k3::prep
