// k3prep doctor: one test per rule (blocking vs warning), the probe's cleanup on every failure,
// what DIR holds → the next command, the JSON object and the CLI's exit codes. No timed
// assertions: probe rates are only checked to exist.
#include "k3prep/doctor/doctor.h"

#include <sys/vfs.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/align.h"
#include "common/env.h"
#include "formats/config.h"
#include "formats/prepared_layout.h"
#include "k3prep/doctor/budget.h"
#include "k3prep/doctor/probe.h"
#include "k3prep/pack/pack.h"
#include "k3prep/split/split.h"
#include "k3prep/synth/checkpoint.h"
#include "tests/support/fault_env.h"
#include "tests/support/synth_fixture.h"
#include "tests/support/temp_dir.h"

namespace k3::prep {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using test::FaultEnv;
using test::FaultRule;
using test::TempDir;

Env* D() { return Env::Default(); }

// A fast doctor: no probe unless a test asks, memory pinned so rules do not depend on the host.
DoctorOptions Quick(const std::string& dir, uint64_t mem = 50'000'000'000) {
  DoctorOptions o;
  o.dir = dir;
  o.probe = false;
  o.mem_available = mem;
  return o;
}

std::string Joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += l + "\n";
  return s;
}

bool DirectIoWorks(const std::string& dir) { return CheckDirectIo(D(), dir).available; }

// The run's shared tiny checkpoint and its link-mode prepared directory (built once per CTest
// run, read-only). The checkpoint is reached through a path with a space ("tiny model", a
// symlink): the commands the doctor prints must quote it.
class DoctorTiny : public ::testing::Test {
 protected:
  static const test::FixtureDirs& Fixture() {
    return test::SynthFixture({"tiny", 0, prepared::ExpertsMode::kLink});
  }
  static void SetUpTestSuite() {
    root_ = new TempDir();
    std::filesystem::create_directory_symlink(Fixture().checkpoint, root_->Join("tiny model"));
  }
  static void TearDownTestSuite() {
    delete root_;
    root_ = nullptr;
  }
  static std::string Checkpoint() { return root_->Join("tiny model"); }
  static std::string Prepared() { return Fixture().prepared; }
  static TempDir* root_;
};
TempDir* DoctorTiny::root_ = nullptr;

// tiny: latent 64, moe_inter 64 (DESIGN.md §8); one MXFP4 matrix = 64·64/2 packed + 64·64/32
// scales = 2,176 B; three matrices per expert.
constexpr uint64_t kTinyExpertBytes = 3 * (64 * 64 / 2 + 64 * 64 / 32);

// ---- DIR itself ---------------------------------------------------------------------------

TEST(Doctor, MissingDirIsBlocking) {
  TempDir tmp;
  const std::string dir = tmp.Join("not-there");
  DoctorReport r = RunDoctor(D(), Quick(dir));
  Status v = r.Verdict();
  EXPECT_EQ(v.exit_code(), 1);
  EXPECT_THAT(v.message(), HasSubstr(dir + ": no such directory"));
  EXPECT_THAT(v.message(), HasSubstr("mkdir -p"));
  EXPECT_FALSE(r.probe.ran);
  EXPECT_TRUE(r.next_command.empty());
}

TEST(Doctor, FileInsteadOfDirIsBlocking) {
  TempDir tmp;
  const std::string file = tmp.WriteFile("plain", "x");
  Status v = RunDoctor(D(), Quick(file)).Verdict();
  EXPECT_EQ(v.exit_code(), 1);
  EXPECT_THAT(v.message(), HasSubstr(file + ": not a directory"));
}

TEST(Doctor, UnwritableDirIsBlocking) {
  TempDir tmp;
  FaultEnv env;
  env.SetRule(tmp.path(), FaultRule::EnospcAfter(0));  // every write in DIR fails
  DoctorReport r = RunDoctor(&env, Quick(tmp.path()));
  EXPECT_EQ(r.Verdict().exit_code(), 1);
  EXPECT_THAT(r.Verdict().message(), HasSubstr(tmp.path() + " is not writable"));
  EXPECT_FALSE(r.writable.writable);
  EXPECT_TRUE(tmp.List().empty()) << "the writability check left a file";
}

TEST(Doctor, ODirectRefusedIsWarningNotFailure) {
  // FaultEnv files cannot switch to O_DIRECT: the same answer tmpfs gives on older kernels.
  TempDir tmp;
  FaultEnv env;
  DoctorOptions o = Quick(tmp.path());
  o.probe = true;
  DoctorReport r = RunDoctor(&env, o);
  EXPECT_TRUE(r.Verdict().ok()) << r.Verdict().ToString();
  EXPECT_FALSE(r.direct.available);
  EXPECT_FALSE(r.direct.reason.empty());
  EXPECT_THAT(Joined(r.warnings), HasSubstr("O_DIRECT refused on " + tmp.path()));
  EXPECT_FALSE(r.probe.ran);
  EXPECT_THAT(r.probe.skipped, HasSubstr("O_DIRECT refused"));
  EXPECT_TRUE(tmp.List().empty());
}

TEST(Doctor, TmpfsIsReportedNotCrashed) {
  struct statfs st {};
  if (::statfs("/dev/shm", &st) != 0 || static_cast<uint32_t>(st.f_type) != 0x01021994u) {
    GTEST_SKIP() << "/dev/shm is not tmpfs here";
  }
  TempDir tmp("/dev/shm");
  DoctorOptions o = Quick(tmp.path());
  o.probe = true;
  o.probe_bytes = 8 << 20;
  o.probe_seconds = 0.2;
  DoctorReport r = RunDoctor(D(), o);
  EXPECT_TRUE(r.Verdict().ok()) << r.Verdict().ToString();
  EXPECT_EQ(r.fs.name, "tmpfs");
  // Kernels before 6.6 refuse O_DIRECT on tmpfs; later ones accept it. Either way the report
  // must say there is no disk to measure, and not measure memory as if it were one.
  if (r.direct.available) {
    EXPECT_THAT(Joined(r.warnings), HasSubstr("is on tmpfs, i.e. in memory"));
  } else {
    EXPECT_THAT(Joined(r.warnings), HasSubstr("O_DIRECT refused on " + tmp.path()));
  }
  EXPECT_FALSE(r.probe.ran);
  EXPECT_TRUE(tmp.List().empty());
}

TEST(Doctor, LeftoverScratchFileIsReported) {
  TempDir tmp;
  const std::string left = tmp.WriteFile(".k3-doctor-probe-4242.k3tmp", "x");
  DoctorReport r = RunDoctor(D(), Quick(tmp.path()));
  EXPECT_TRUE(r.Verdict().ok());
  EXPECT_THAT(Joined(r.warnings), HasSubstr(left + " was left by an interrupted doctor"));
}

// ---- the read probe -----------------------------------------------------------------------

TEST(DoctorProbe, TinyProbeOnRegularDir) {
  TempDir tmp;
  if (!DirectIoWorks(tmp.path())) GTEST_SKIP() << tmp.path() << " has no O_DIRECT";
  DoctorOptions o = Quick(tmp.path());
  o.probe = true;
  o.probe_bytes = 8 << 20;
  o.probe_seconds = 0.2;
  DoctorReport r = RunDoctor(D(), o);
  ASSERT_TRUE(r.probe.ran) << r.probe.skipped;
  EXPECT_TRUE(r.Verdict().ok());
  ASSERT_EQ(r.probe.result.depths.size(), 2u);
  EXPECT_EQ(r.probe.result.depths[0].queue_depth, 1);
  EXPECT_EQ(r.probe.result.depths[1].queue_depth, 16);
  for (const DepthResult& d : r.probe.result.depths) {
    EXPECT_GE(d.reads, uint64_t(d.queue_depth));  // at least one full batch
    EXPECT_EQ(d.bytes, d.reads * r.probe.result.read_bytes);
  }
  EXPECT_EQ(r.probe.result.file_bytes, uint64_t{8} << 20);
  // The released expert (17,547,264 B) does not fit an 8 MiB file: clamped and said so.
  EXPECT_EQ(r.probe.requested_read_bytes, 17'547'264u);
  EXPECT_EQ(r.probe.result.read_bytes, uint64_t{8} << 20);
  EXPECT_THAT(Joined(r.warnings), HasSubstr("pass a larger --probe-mb"));
  EXPECT_THAT(Joined(r.notes), HasSubstr("bypasses the page cache"));
  EXPECT_TRUE(tmp.List().empty()) << "scratch file left behind";
}

TEST(DoctorProbe, ReadSizeFlagOverrides) {
  TempDir tmp;
  if (!DirectIoWorks(tmp.path())) GTEST_SKIP() << tmp.path() << " has no O_DIRECT";
  DoctorOptions o = Quick(tmp.path());
  o.probe = true;
  o.probe_bytes = 8 << 20;
  o.probe_seconds = 0;
  o.read_size = 26'112;  // small's expert: not a multiple of 4096, so reads are widened
  DoctorReport r = RunDoctor(D(), o);
  ASSERT_TRUE(r.probe.ran) << r.probe.skipped;
  EXPECT_EQ(r.probe.read_source, "--read-size");
  EXPECT_EQ(r.probe.result.read_bytes, 26'112u);
}

TEST(DoctorProbe, RefusesWhenFreeSpaceBelowProbePlusMargin) {
  TempDir tmp;
  FaultEnv env;
  const uint64_t file = uint64_t{8} << 20;
  env.SetFreeSpace(file + kProbeFreeMargin - 1);
  ProbeOptions o;
  o.dir = tmp.path();
  o.file_bytes = file;
  o.require_direct = false;
  Result<ProbeReport> r = RunDiskProbe(&env, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().exit_code(), 1);
  EXPECT_THAT(r.status().message(), HasSubstr("read probe refused: " + tmp.path()));
  EXPECT_THAT(r.status().message(), HasSubstr("+ 1 GB to spare"));
  EXPECT_THAT(r.status().message(), HasSubstr("--probe-mb 7 or less"));
  EXPECT_TRUE(tmp.List().empty());
}

TEST(DoctorProbe, WriteFailureRemovesScratchFile) {
  TempDir tmp;
  FaultEnv env;
  env.SetRule(tmp.path(), FaultRule::EnospcAfter(1 << 20));
  ProbeOptions o;
  o.dir = tmp.path();
  o.file_bytes = 8 << 20;
  o.require_direct = false;
  Result<ProbeReport> r = RunDiskProbe(&env, o);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("read probe (" + tmp.path() + "/.k3-doctor-probe-"));
  EXPECT_TRUE(tmp.List().empty()) << "scratch file left behind after a failed write";
}

TEST(DoctorProbe, ReadFailureRemovesScratchFile) {
  TempDir tmp;
  FaultEnv env;
  env.SetRule(tmp.path(), FaultRule::EioAt(4096));
  ProbeOptions o;
  o.dir = tmp.path();
  o.file_bytes = 1 << 20;
  o.read_bytes = 1 << 20;  // every read covers the faulty offset
  o.seconds_per_depth = 0;
  o.require_direct = false;
  Result<ProbeReport> r = RunDiskProbe(&env, o);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr(".k3-doctor-probe-"));
  EXPECT_THAT(r.status().message(), HasSubstr("4096"));
  EXPECT_TRUE(tmp.List().empty()) << "scratch file left behind after a failed read";
}

TEST(DoctorProbe, ProbeFailureIsWarningNotFailure) {
  TempDir tmp;
  FaultEnv env;
  env.SetFreeSpace(uint64_t{1} << 20);
  DoctorOptions o = Quick(tmp.path());
  o.probe = true;
  o.require_direct = false;
  DoctorReport r = RunDoctor(&env, o);
  EXPECT_TRUE(r.Verdict().ok()) << r.Verdict().ToString();
  EXPECT_FALSE(r.probe.ran);
  EXPECT_THAT(Joined(r.warnings), HasSubstr("read probe refused"));
}

// ---- memory and budgets -------------------------------------------------------------------

TEST(DoctorBudget, PresetsAreTheDesignTable) {
  // DESIGN.md §6: laptop 8, desktop 32, workstation 96, server 128, max 224 (GB, TOTAL).
  ASSERT_EQ(RunPresets().size(), 5u);
  EXPECT_EQ(LargestPresetWithin(7'999'999'999), nullptr);
  EXPECT_STREQ(LargestPresetWithin(8'000'000'000)->name, "laptop");
  EXPECT_STREQ(LargestPresetWithin(31'999'999'999)->name, "laptop");
  EXPECT_STREQ(LargestPresetWithin(32'000'000'000)->name, "desktop");
  EXPECT_STREQ(LargestPresetWithin(100'000'000'000)->name, "workstation");
  EXPECT_STREQ(LargestPresetWithin(200'000'000'000)->name, "server");
  EXPECT_STREQ(LargestPresetWithin(1'000'000'000'000)->name, "max");
  EXPECT_EQ(LargestPresetWithin(31'999'999'999, 9'000'000'000), nullptr);
}

TEST(DoctorBudget, SuggestsLargestPresetWithin80PercentOfMemAvailable) {
  TempDir tmp;
  DoctorReport r = RunDoctor(D(), Quick(tmp.path(), 40'000'000'000));  // 80 % = 32 GB
  EXPECT_EQ(r.memory.usable, 32'000'000'000u);
  EXPECT_EQ(r.memory.suggested_preset, "desktop");
  r = RunDoctor(D(), Quick(tmp.path(), 39'999'999'990));
  EXPECT_EQ(r.memory.suggested_preset, "laptop");
}

TEST(DoctorBudget, ReleasedExpertSizeMatchesReleasedConfig) {
  Result<ModelConfig> c =
      LoadModelConfig(D(), std::string(K3_SOURCE_DIR) + "/tests/data/config/released_config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(prepared::ExpertBytes(*c), kReleasedExpertBytes);
}

TEST(DoctorBudget, ReleasedFloorFromReleasedConfig) {
  Result<ModelConfig> c =
      LoadModelConfig(D(), std::string(K3_SOURCE_DIR) + "/tests/data/config/released_config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Result<BudgetFloor> f = FloorFromConfig(*c);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  // DESIGN.md §7: layer 0's run is 2.34 GB; the trunk minimum is two of them, 4 KiB-rounded.
  EXPECT_NEAR(double(f->largest_run), 2.34e9, 0.01e9);
  EXPECT_EQ(f->trunk_min, 2 * AlignUp(f->largest_run, 4096));
  // top-k + 1 = 17 expert slots of 17,547,264 B (already a multiple of 64).
  EXPECT_EQ(f->cache_min, 17u * 17'547'264u);
  EXPECT_LT(f->total(), kReleasedFloorBytes);
}

TEST(DoctorBudget, SmallMachineSaysReleasedCannotRunAndNamesSynthPreset) {
  TempDir tmp;
  DoctorReport r = RunDoctor(D(), Quick(tmp.path(), 4'000'000'000));  // 80 % = 3.2 GB
  EXPECT_TRUE(r.Verdict().ok()) << "an empty DIR holds no model: nothing is blocked";
  EXPECT_FALSE(r.memory.released_fits);
  EXPECT_THAT(Joined(r.warnings), HasSubstr("the released model cannot run here"));
  EXPECT_THAT(Joined(r.warnings), HasSubstr("8.00 GB (the laptop preset"));
  // bench's floor is tens of MB (2 × a ~17 MB layer-0 run + 17 × 208,896 B), far below 3.2 GB.
  ASSERT_TRUE(r.memory.largest_synth.has_value());
  EXPECT_EQ(r.memory.largest_synth->preset, "bench");
  EXPECT_EQ(r.next_command, "k3prep synth --preset bench --out " + tmp.path() + "/synth-bench");
}

TEST(DoctorBudget, ReleasedFitsAtExactlyTheFloor) {
  TempDir tmp;
  DoctorReport r = RunDoctor(D(), Quick(tmp.path(), 10'000'000'000));  // 80 % = 8 GB
  EXPECT_TRUE(r.memory.released_fits);
  EXPECT_EQ(r.memory.suggested_preset, "laptop");
  EXPECT_EQ(r.next_command, "k3prep download moonshotai/Kimi-K3 --dest " + tmp.path() + "/kimi-k3");
  r = RunDoctor(D(), Quick(tmp.path(), 9'999'999'990));
  EXPECT_FALSE(r.memory.released_fits);
}

// ---- what DIR holds -----------------------------------------------------------------------

TEST_F(DoctorTiny, CheckpointNextCommandIsPack) {
  DoctorReport r = RunDoctor(D(), Quick(Checkpoint()));
  EXPECT_TRUE(r.Verdict().ok()) << r.Verdict().ToString();
  EXPECT_EQ(r.model.kind, ModelKind::kCheckpoint);
  EXPECT_TRUE(r.model.problem.empty()) << r.model.problem;
  ASSERT_TRUE(r.model.floor.has_value());
  EXPECT_EQ(r.model.expert_bytes, kTinyExpertBytes);
  EXPECT_EQ(r.next_command,
            "k3prep pack '" + Checkpoint() + "' --out '" + Checkpoint() + ".prep'");
}

TEST_F(DoctorTiny, PreparedNextCommandIsK3run) {
  DoctorReport r = RunDoctor(D(), Quick(Prepared(), 40'000'000'000));
  EXPECT_TRUE(r.Verdict().ok()) << r.Verdict().ToString();
  EXPECT_EQ(r.model.kind, ModelKind::kPrepared);
  EXPECT_EQ(r.model.expert_bytes, kTinyExpertBytes);
  EXPECT_EQ(r.probe.requested_read_bytes, kTinyExpertBytes);
  EXPECT_EQ(r.probe.read_source, "the largest expert record in experts.idx");
  EXPECT_EQ(r.next_command, "k3run " + Prepared() + " --preset desktop --prompt \"...\"");
}

TEST_F(DoctorTiny, PreparedOnSmallMachineUsesBudgetFlag) {
  // 80 % of 1 GB fits no preset but is far above tiny's floor.
  DoctorReport r = RunDoctor(D(), Quick(Prepared(), 1'000'000'000));
  EXPECT_TRUE(r.Verdict().ok()) << r.Verdict().ToString();
  EXPECT_EQ(r.next_command, "k3run " + Prepared() + " --budget-gb 0.800 --prompt \"...\"");
}

TEST_F(DoctorTiny, MemAvailableBelowModelFloorIsBlocking) {
  DoctorReport r = RunDoctor(D(), Quick(Prepared(), 1000));
  Status v = r.Verdict();
  EXPECT_EQ(v.exit_code(), 1);
  EXPECT_THAT(v.message(), HasSubstr("below the smallest budget the model in " + Prepared()));
  EXPECT_THAT(v.message(), HasSubstr("top-k + 1 slots"));
}

TEST_F(DoctorTiny, BrokenCheckpointPointsAtVerify) {
  TempDir tmp;
  tmp.WriteFile("config.json", "{ not json");
  tmp.WriteFile("model-00001-of-000001.safetensors", "");
  DoctorReport r = RunDoctor(D(), Quick(tmp.path()));
  EXPECT_TRUE(r.Verdict().ok());
  EXPECT_EQ(r.model.kind, ModelKind::kCheckpoint);
  EXPECT_THAT(Joined(r.warnings), HasSubstr("holds a checkpoint that does not open"));
  EXPECT_THAT(Joined(r.warnings), HasSubstr("config.json"));
  EXPECT_EQ(r.next_command, "k3verify shards " + tmp.path());
}

TEST_F(DoctorTiny, AlteredPreparedPointsAtVerify) {
  TempDir tmp;
  std::filesystem::copy(Prepared(), tmp.Join("p"), std::filesystem::copy_options::recursive);
  tmp.WriteFile("p/k3.sum", "xxh3-128 00000000000000000000000000000000 k3.json\n");
  DoctorReport r = RunDoctor(D(), Quick(tmp.Join("p")));
  EXPECT_EQ(r.model.kind, ModelKind::kPrepared);
  EXPECT_THAT(Joined(r.warnings), HasSubstr("holds a prepared directory that does not open"));
  EXPECT_EQ(r.next_command, "k3verify prepared " + tmp.Join("p"));
}

// ---- --ranks N: what each rank of an MPI run needs ------------------------------------------

uint64_t FilesBytes(const std::string& dir) {
  uint64_t n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) n += e.file_size();
  }
  return n;
}

TEST_F(DoctorTiny, RanksPrintEachRanksTrunkShareBudgetAndDisk) {
  DoctorOptions o = Quick(Prepared(), 40'000'000'000);  // one process: --preset desktop
  o.ranks = 3;
  DoctorReport r = RunDoctor(D(), o);
  EXPECT_TRUE(r.Verdict().ok()) << r.Verdict().ToString();
  ASSERT_TRUE(r.ranks.has_value());
  const RanksReport& k = *r.ranks;
  EXPECT_EQ(k.map, "contiguous over 3 ranks: rank 0 experts 0-1, rank 1 2-4, rank 2 5-7");
  EXPECT_EQ(k.rank0_base, 32'000'000'000u);
  ASSERT_EQ(k.per_rank.size(), 3u);
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(D(), Prepared());
  ASSERT_TRUE(p.ok());
  const uint64_t trunk = p->manifest.FindFile("trunk.bin")->size + p->manifest.FindFile("resident.bin")->size;
  const uint64_t slot = AlignUp(kTinyExpertBytes, 64);
  const int begins[3] = {0, 2, 5}, counts[3] = {2, 3, 3};
  TempDir tmp;
  for (int rank = 0; rank < 3; ++rank) {
    const RankNeeds& n = k.per_rank[static_cast<size_t>(rank)];
    EXPECT_EQ(n.rank, rank);
    EXPECT_EQ(n.expert_begin, begins[rank]);
    EXPECT_EQ(n.expert_end, begins[rank] + counts[rank]);
    EXPECT_EQ(n.experts, uint64_t(counts[rank]) * 12);  // 12 MoE layers
    EXPECT_EQ(n.trunk_bytes, trunk);
    EXPECT_EQ(n.reads_trunk, rank == 0);
    EXPECT_EQ(n.share_ram_bytes, n.experts * slot);
    EXPECT_EQ(n.budget_bytes, (rank == 0 ? 32'000'000'000u : kRankMarginBytes) + n.share_ram_bytes);
    // The disk is what `k3prep split` writes (k3.json estimated with a little room).
    const std::string share = tmp.Join("rank" + std::to_string(rank));
    SplitOptions so;
    so.prepared = Prepared();
    so.out = share;
    so.ranks = 3;
    so.rank = rank;
    ASSERT_TRUE(RunSplit(D(), so).ok());
    const uint64_t actual = FilesBytes(share);
    EXPECT_GE(n.disk_bytes, actual);
    EXPECT_LE(n.disk_bytes, actual + 8192);
  }
  const std::string text = RenderDoctorText(r);
  EXPECT_THAT(text, HasSubstr("  ranks "));
  EXPECT_THAT(text, HasSubstr("experts 2-4 of each MoE layer = 36 in RAM"));
  EXPECT_THAT(text, HasSubstr("on disk (not read)"));
  EXPECT_THAT(text, HasSubstr("budget --budget-gb 32.001"));
  EXPECT_THAT(text, HasSubstr("budget --budget-gb 0.257"));
  EXPECT_THAT(Joined(r.notes), HasSubstr("they read no trunk"));
  EXPECT_THAT(Joined(r.notes), HasSubstr("k3prep split " + Prepared() + " --ranks 3 --rank R"));
  EXPECT_THAT(Joined(r.notes), HasSubstr("only rank 0 reads it"));
  nlohmann::json j = nlohmann::json::parse(RenderDoctorJson(r));
  EXPECT_EQ(j["ranks"]["ranks"], 3);
  EXPECT_EQ(j["ranks"]["per_rank"][2]["experts"], 36);
  EXPECT_EQ(j["ranks"]["per_rank"][1]["reads_trunk"], false);
  EXPECT_EQ(j["ranks"]["per_rank"][0]["budget_bytes"], k.per_rank[0].budget_bytes);
}

TEST_F(DoctorTiny, RanksAboveTheExpertCountIsAUsageErrorNamingTheFlag) {
  DoctorOptions o = Quick(Prepared());
  o.ranks = 9;  // tiny has 8 experts per layer
  DoctorReport r = RunDoctor(D(), o);
  const Status v = r.Verdict();
  EXPECT_EQ(v.code(), Code::kInvalid) << v.ToString();
  EXPECT_THAT(v.message(), HasSubstr("--ranks: 9 ranks is out of range"));
  EXPECT_FALSE(r.ranks.has_value());
}

TEST_F(DoctorTiny, RanksOfAShareWarnToSplitTheFullDirectory) {
  TempDir tmp;
  SplitOptions so;
  so.prepared = Prepared();
  so.out = tmp.Join("share");
  so.ranks = 2;
  so.rank = 1;
  ASSERT_TRUE(RunSplit(D(), so).ok());
  DoctorOptions o = Quick(so.out);
  o.ranks = 2;
  DoctorReport r = RunDoctor(D(), o);
  EXPECT_TRUE(r.Verdict().ok()) << r.Verdict().ToString();
  EXPECT_THAT(r.model.summary, HasSubstr("the share of rank 1 of 2 (contiguous)"));
  EXPECT_THAT(Joined(r.warnings), HasSubstr("is a share (rank 1 of 2 (contiguous))"));
  ASSERT_TRUE(r.ranks.has_value());
  EXPECT_EQ(r.ranks->per_rank[1].experts, 48u);
}

TEST(Doctor, RanksOnAnEmptyDirPlanTheReleasedModel) {
  TempDir tmp;
  DoctorOptions o = Quick(tmp.path());
  o.ranks = 8;
  DoctorReport r = RunDoctor(D(), o);
  EXPECT_TRUE(r.Verdict().ok()) << r.Verdict().ToString();
  ASSERT_TRUE(r.ranks.has_value());
  EXPECT_THAT(r.ranks->basis, HasSubstr("released config"));
  ASSERT_EQ(r.ranks->per_rank.size(), 8u);
  const RankNeeds& one = r.ranks->per_rank[1];
  EXPECT_EQ(one.expert_begin, 112);
  EXPECT_EQ(one.expert_end, 224);
  EXPECT_EQ(one.experts, 112u * 92);  // 93 layers, the first dense
  EXPECT_EQ(one.share_ram_bytes, one.experts * AlignUp(kReleasedExpertBytes, 64));
  EXPECT_EQ(one.budget_bytes, kRankMarginBytes + one.share_ram_bytes);
}

TEST_F(DoctorTiny, WithoutRanksThereIsNoPlan) {
  DoctorReport r = RunDoctor(D(), Quick(Prepared()));
  EXPECT_FALSE(r.ranks.has_value());
  EXPECT_TRUE(nlohmann::json::parse(RenderDoctorJson(r))["ranks"].is_null());
  EXPECT_THAT(RenderDoctorText(r), Not(HasSubstr("  rank 0 ")));
}

// ---- output -------------------------------------------------------------------------------

TEST_F(DoctorTiny, JsonHasTheFields) {
  DoctorReport r = RunDoctor(D(), Quick(Prepared(), 40'000'000'000));
  nlohmann::json j = nlohmann::json::parse(RenderDoctorJson(r));
  EXPECT_EQ(j["format"], "k3-doctor");
  EXPECT_EQ(j["version"], 1);
  EXPECT_TRUE(j["cpu"]["avx2"].is_boolean());
  EXPECT_TRUE(j["cpu"]["sha_ni"].is_boolean());
  EXPECT_TRUE(j["cores"].is_number_integer());
  EXPECT_EQ(j["memory"]["mem_available_bytes"], 40'000'000'000u);
  EXPECT_EQ(j["memory"]["suggested_preset"], "desktop");
  EXPECT_EQ(j["memory"]["released_floor_bytes"], 8'000'000'000u);
  EXPECT_TRUE(j["io_uring"]["available"].is_boolean());
  EXPECT_TRUE(j["o_direct"]["available"].is_boolean());
  EXPECT_TRUE(j["directory"]["free_bytes"].is_number_unsigned());
  EXPECT_EQ(j["model"]["kind"], "prepared");
  EXPECT_EQ(j["model"]["expert_bytes"], kTinyExpertBytes);
  EXPECT_TRUE(j["model"]["floor"]["total_bytes"].is_number_unsigned());
  EXPECT_EQ(j["probe"]["ran"], false);
  EXPECT_EQ(j["probe"]["skipped"], "--no-probe");
  EXPECT_THAT(j["next_command"].get<std::string>(), StartsWith("k3run "));
  EXPECT_TRUE(j["warnings"].is_array());
  EXPECT_TRUE(j["blocking"].is_array());
}

TEST(DoctorOutput, JsonProbeHasRatesPerDepth) {
  TempDir tmp;
  if (!DirectIoWorks(tmp.path())) GTEST_SKIP() << tmp.path() << " has no O_DIRECT";
  DoctorOptions o = Quick(tmp.path());
  o.probe = true;
  o.probe_bytes = 8 << 20;
  o.probe_seconds = 0;
  nlohmann::json j = nlohmann::json::parse(RenderDoctorJson(RunDoctor(D(), o)));
  ASSERT_EQ(j["probe"]["ran"], true);
  ASSERT_EQ(j["probe"]["depths"].size(), 2u);
  EXPECT_EQ(j["probe"]["depths"][1]["queue_depth"], 16);
  EXPECT_TRUE(j["probe"]["depths"][0]["mb_per_s"].is_number());
  EXPECT_TRUE(j["probe"]["depths"][0]["iops"].is_number());
  EXPECT_EQ(j["probe"]["page_cache_bypassed"], true);
}

TEST(DoctorOutput, TextTableIsAligned) {
  TempDir tmp;
  const std::string text = RenderDoctorText(RunDoctor(D(), Quick(tmp.path())));
  size_t column = 0;
  int rows = 0;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.rfind("  ", 0) != 0) continue;
    // Labels may contain single spaces ("kernel path"); the value starts after the first run of
    // two or more spaces following the label.
    const size_t gap = line.find("  ", 2);
    const size_t value = line.find_first_not_of(' ', gap);
    if (column == 0) column = value;
    EXPECT_EQ(value, column) << line;
    ++rows;
  }
  EXPECT_GE(rows, 10);
  EXPECT_THAT(text, HasSubstr("next: k3prep download"));
}

// ---- the command line ---------------------------------------------------------------------

struct ProcResult {
  int exit_code = -1;
  std::string out;
};
// Runs the built k3prep; stdout only, or stdout and stderr together.
ProcResult RunK3prep(const std::string& args, bool with_stderr = true) {
  const std::string cmd =
      std::string(K3_BINARY_DIR) + "/k3prep/k3prep " + args + (with_stderr ? " 2>&1" : "");
  ProcResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(DoctorCli, MissingDirExitsOneWithMessage) {
  TempDir tmp;
  ProcResult r = RunK3prep("doctor " + tmp.Join("nope") + " --no-probe");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("k3prep: error: I/O error: 1 blocking problem: " +
                               tmp.Join("nope") + ": no such directory"));
}

TEST(DoctorCli, JsonParses) {
  TempDir tmp;
  ProcResult r = RunK3prep("doctor " + tmp.path() + " --no-probe --json", false);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["format"], "k3-doctor");
  EXPECT_EQ(j["dir"], tmp.path());
  EXPECT_EQ(j["model"]["kind"], "none");
}

TEST(DoctorCli, RanksTheModelCannotBeSplitIntoIsExitTwo) {
  const std::string prepared = test::SynthFixture({"tiny", 0, prepared::ExpertsMode::kLink}).prepared;
  ProcResult r = RunK3prep("doctor " + prepared + " --no-probe --ranks 9");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("k3prep: error: invalid input: --ranks: 9 ranks is out of range"));
  EXPECT_THAT(r.out, HasSubstr("k3prep doctor "));  // the report is still printed
  ProcResult zero = RunK3prep("doctor " + prepared + " --no-probe --ranks 0");
  EXPECT_EQ(zero.exit_code, 2) << zero.out;
  EXPECT_THAT(zero.out, HasSubstr("--ranks: 0 is out of range: allowed 1 to 4096"));
}

TEST(DoctorCli, BadFlagIsUsageError) {
  ProcResult r = RunK3prep("doctor --probe-mb 0");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--probe-mb"));
}

// Every k3prep subcommand's numeric flags: NaN/inf refused, bounds printed as written (CLI11's
// own messages said "0.000000 to 1797693134862315708145..." and let NaN through).
TEST(K3prepCli, NumericFlagsRefuseNonFiniteAndOutOfRangeValuesReadably) {
  TempDir tmp;
  const std::string d = tmp.path();
  struct Case {
    std::string args;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {"doctor " + d + " --no-probe --probe-seconds nan",
            "--probe-seconds: nan is not a finite number: allowed 0 to 3600"},
           {"doctor " + d + " --no-probe --probe-mb 0",
            "--probe-mb: 0 is out of range: allowed 1 to 1048576"},
           {"pack " + d + " --out " + d + "/p --jobs 0", "--jobs: 0 is out of range: allowed 1 to 256"},
           {"pack " + d + " --out " + d + "/p --jobs 100000",
            "--jobs: 100000 is out of range: allowed 1 to 256"},
           {"synth --out " + d + "/s --shards 0", "--shards: 0 is out of range: allowed 1 or more"},
           {"download org/model --dest " + d + " --jobs 65",
            "--jobs: 65 is out of range: allowed 1 to 64"},
           {"download org/model --dest " + d + " --stall-seconds 0",
            "--stall-seconds: 0 is out of range: allowed 1 to 86400"},
           {"download org/model --dest " + d + " --stall-bytes-per-s 0",
            "--stall-bytes-per-s: 0 is out of range: allowed 1 or more"}}) {
    ProcResult r = RunK3prep(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << ": " << r.out;
    EXPECT_THAT(r.out, HasSubstr(c.says)) << c.args;
    EXPECT_THAT(r.out, Not(HasSubstr("0.000000"))) << c.args;
    EXPECT_THAT(r.out, Not(HasSubstr("1797"))) << c.args;
  }
}

}  // namespace
}  // namespace k3::prep
