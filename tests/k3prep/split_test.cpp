// k3prep split: every rank of N = 1..4 ranks on the tiny synthetic model opens, holds exactly its
// experts byte for byte, passes k3verify --deep, and the ranks together hold every expert once;
// the model identity ties shares and packs of one model together; each failure mode (a corrupted
// source byte, an occupied DIR, a share as input, bad flags, write faults) gets a test.
#include "k3prep/split/split.h"

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/env.h"
#include "common/hash.h"
#include "formats/expert_share.h"
#include "formats/prepared_manifest.h"
#include "k3verify/tensor_source.h"
#include "k3verify/verify_prepared.h"
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

// The run's shared tiny model (13 layers, 12 MoE layers of 8 experts), packed in copy mode (the
// CTest fixture "tiny") and in link mode, read-only.
const std::string& CopyFull() {
  return test::SynthFixture({"tiny", 0, prepared::ExpertsMode::kCopy}).prepared;
}
const std::string& LinkFull() {
  return test::SynthFixture({"tiny", 0, prepared::ExpertsMode::kLink}).prepared;
}

SplitOptions Opts(const std::string& prepared, const std::string& out, int ranks, int rank) {
  SplitOptions o;
  o.prepared = prepared;
  o.out = out;
  o.ranks = ranks;
  o.rank = rank;
  return o;
}

Status SplitStatus(Env* env, const SplitOptions& o) {
  Result<SplitResult> r = RunSplit(env, o);
  return r.ok() ? Status::Ok() : r.status();
}

void ExpectError(const Status& s, Code code, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), code) << s.ToString();
  for (const std::string& p : parts) {
    EXPECT_NE(s.message().find(p), std::string::npos) << "missing \"" << p << "\" in: " << s.message();
  }
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

prepared::PreparedDir Open(const std::string& dir) {
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(D(), dir);
  EXPECT_TRUE(p.ok()) << dir << ": " << p.status().ToString();
  return p.ok() ? std::move(p).value() : prepared::PreparedDir{};
}

std::string ExpertBytes(const prepared::PreparedDir& p, uint32_t layer, uint32_t e) {
  const prepared::ExpertRecord& r = p.experts.At(layer, e);
  return ReadRange(p.expert_paths[r.file_id], r.offset, r.length);
}

// Files under `dir`, recursively (relative paths).
std::vector<std::string> FilesUnder(const std::string& dir) {
  std::vector<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    out.push_back(fs::relative(e.path(), dir).string());
  }
  return out;
}

// A writable copy of the copy-mode fixture (the shared one must not change).
std::string CopyOfFull(const TempDir& tmp) {
  const std::string dst = tmp.Join("full");
  fs::copy(CopyFull(), dst, fs::copy_options::recursive);
  return dst;
}

// ---- every rank of N = 1..4 ----------------------------------------------------------------

TEST(SplitTiny, EveryRankOfOneToFourRanksOpensVerifiesAndHoldsExactlyItsExperts) {
  const prepared::PreparedDir full = Open(CopyFull());
  const ModelConfig& c = full.manifest.config;
  ASSERT_EQ(c.n_experts, 8);
  const Hash128 identity = prepared::ModelIdentity(full.manifest);
  TempDir tmp;
  for (int n = 1; n <= 4; ++n) {
    std::map<uint64_t, int> holders;  // record index → shares holding it
    for (int r = 0; r < n; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r) + " of " + std::to_string(n));
      const std::string out = tmp.Join("s" + std::to_string(n) + "-" + std::to_string(r));
      Result<SplitResult> split = RunSplit(D(), Opts(CopyFull(), out, n, r));
      ASSERT_TRUE(split.ok()) << split.status().ToString();
      const prepared::PreparedDir share = Open(out);
      ASSERT_TRUE(share.manifest.share.has_value());
      EXPECT_EQ(share.manifest.share->ranks, uint32_t(n));
      EXPECT_EQ(share.manifest.share->rank, uint32_t(r));
      EXPECT_EQ(share.manifest.share->map, "contiguous");
      EXPECT_EQ(share.manifest.experts_mode, prepared::ExpertsMode::kCopy);
      EXPECT_EQ(prepared::ModelIdentity(share.manifest), identity);
      for (const char* f : {"trunk.bin", "resident.bin", "tokenizer/tiktoken.model"}) {
        EXPECT_EQ(ReadAll(JoinPath(out, f)), ReadAll(JoinPath(CopyFull(), f))) << f;
      }
      const prepared::ExpertMap map{n, c.n_experts};
      uint64_t held = 0;
      for (int layer = c.first_dense; layer < c.n_layers; ++layer) {
        for (int e = 0; e < c.n_experts; ++e) {
          const auto L = uint32_t(layer), E = uint32_t(e);
          const bool mine = map.Owner(e) == r;
          ASSERT_EQ(share.experts.At(L, E).absent(), !mine) << "layer " << layer << " expert " << e;
          if (!mine) continue;
          ++held;
          ++holders[prepared::ExpertRecordIndex(c, layer, e)];
          ASSERT_EQ(ExpertBytes(share, L, E), ExpertBytes(full, L, E))
              << "layer " << layer << " expert " << e;
          EXPECT_EQ(share.experts.At(L, E).xxh3_64, full.experts.At(L, E).xxh3_64);
        }
      }
      EXPECT_EQ(split->stats.experts_held, held);
      EXPECT_EQ(split->stats.experts_total, full.experts.records.size());
      // Only the files its own experts are in: one per MoE layer.
      EXPECT_EQ(share.manifest.expert_files.size(), size_t(c.n_moe_layers()));

      verify::PreparedOptions vo;
      vo.dir = out;
      vo.deep = true;
      vo.progress = ProgressMode::kNone;
      Result<verify::PreparedReport> report = verify::VerifyPrepared(D(), vo);
      ASSERT_TRUE(report.ok()) << report.status().ToString();
      EXPECT_TRUE(report->Verdict().ok()) << verify::RenderPreparedText(*report);
      EXPECT_EQ(report->experts_present, held);
      // Every region, every present expert and experts.idx; the absent ones are never read.
      EXPECT_EQ(report->items_hashed, share.manifest.regions.size() + held);
    }
    ASSERT_EQ(holders.size(), full.experts.records.size()) << n << " ranks";
    for (const auto& [rec, count] : holders) EXPECT_EQ(count, 1) << "record " << rec;
  }
}

TEST(SplitTiny, OneRankIsTheCopyModeLayoutExactly) {
  TempDir tmp;
  const std::string out = tmp.Join("one");
  ASSERT_TRUE(SplitStatus(D(), Opts(CopyFull(), out, 1, 0)).ok());
  EXPECT_EQ(ReadAll(JoinPath(out, "experts.idx")), ReadAll(JoinPath(CopyFull(), "experts.idx")));
  const prepared::PreparedDir full = Open(CopyFull());
  for (const prepared::FileEntry& f : full.manifest.expert_files) {
    EXPECT_EQ(ReadAll(JoinPath(out, f.path)), ReadAll(JoinPath(CopyFull(), f.path))) << f.path;
  }
}

TEST(SplitTiny, LinkAndCopySourcesGiveTheSameShare) {
  TempDir tmp;
  const std::string a = tmp.Join("from-copy"), b = tmp.Join("from-link");
  ASSERT_TRUE(SplitStatus(D(), Opts(CopyFull(), a, 3, 1)).ok());
  ASSERT_TRUE(SplitStatus(D(), Opts(LinkFull(), b, 3, 1)).ok());
  std::vector<std::string> files = FilesUnder(a);
  EXPECT_EQ(files, FilesUnder(b));
  for (const std::string& f : files) {
    if (f == "k3.json" || f == "k3.sum" || fs::is_directory(JoinPath(a, f))) continue;  // source differs
    EXPECT_EQ(ReadAll(JoinPath(a, f)), ReadAll(JoinPath(b, f))) << f;
  }
}

TEST(ModelIdentity, EqualForLinkAndCopyPacksAndTheirSharesDifferentForAnotherSeed) {
  const Hash128 copy = prepared::ModelIdentity(Open(CopyFull()).manifest);
  EXPECT_EQ(prepared::ModelIdentity(Open(LinkFull()).manifest), copy);
  TempDir tmp;
  ASSERT_TRUE(SplitStatus(D(), Opts(LinkFull(), tmp.Join("share"), 2, 1)).ok());
  EXPECT_EQ(prepared::ModelIdentity(Open(tmp.Join("share")).manifest), copy);
  const std::string& other = test::SynthFixture({"tiny", 1, prepared::ExpertsMode::kLink}).prepared;
  EXPECT_NE(prepared::ModelIdentity(Open(other).manifest), copy);
  // k3.sum tells shares apart; the identity does not.
  EXPECT_NE(ReadAll(JoinPath(tmp.Join("share"), "k3.sum")), ReadAll(JoinPath(LinkFull(), "k3.sum")));
}

// ---- what k3verify says about a share ---------------------------------------------------------

TEST(SplitTiny, VerifyReportNamesTheShare) {
  TempDir tmp;
  const std::string out = tmp.Join("share");
  ASSERT_TRUE(SplitStatus(D(), Opts(CopyFull(), out, 2, 1)).ok());
  verify::PreparedOptions vo;
  vo.dir = out;
  vo.progress = ProgressMode::kNone;
  Result<verify::PreparedReport> report = verify::VerifyPrepared(D(), vo);
  ASSERT_TRUE(report.ok());
  const std::string text = verify::RenderPreparedText(*report);
  EXPECT_NE(text.find("share: rank 1 of 2 (contiguous), experts 48 of 96 present\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("verdict: OK"), std::string::npos) << text;
  const std::string json = verify::RenderPreparedJson(*report);
  EXPECT_NE(json.find("\"share\": \"rank 1 of 2 (contiguous)\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"experts_present\": 48"), std::string::npos) << json;
}

TEST(SplitTiny, TensorLookupOfAnAbsentExpertNamesTheRankThatHoldsIt) {
  TempDir tmp;
  const std::string out = tmp.Join("share");
  ASSERT_TRUE(SplitStatus(D(), Opts(CopyFull(), out, 2, 1)).ok());
  Result<verify::TensorDir> dir = verify::TensorDir::Open(D(), out, "");
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  const std::string absent = prepared::ExpertTensorName(3, 2, 0);
  auto raw = dir->Find(absent, false);
  ExpectError(raw.ok() ? Status::Ok() : raw.status(), Code::kInvalid,
              {absent, "layer 3, expert 2", "in another rank's share (rank 0's)",
               "it holds rank 1 of 2's share"});
  auto mx = dir->Find("language_model.model.layers.3.block_sparse_moe.experts.2.w1", true);
  EXPECT_FALSE(mx.ok());
  auto present = dir->Find(prepared::ExpertTensorName(3, 5, 0), false);
  ASSERT_TRUE(present.ok()) << present.status().ToString();
  EXPECT_TRUE(present->has_value());
  // --emit records only what the share holds.
  uint64_t skipped = 0;
  size_t experts = 0;
  for (const verify::TensorRef& ref : dir->All(&skipped)) {
    if (ref.name.find(".experts.") != std::string::npos) ++experts;
  }
  EXPECT_EQ(experts, 48u * 3);  // w1, w2, w3 of each held expert
}

// ---- failure modes ----------------------------------------------------------------------------

TEST(SplitErrors, CorruptedSourceExpertByteIsAnIntegrityFailureLeavingNoFinalFiles) {
  TempDir tmp;
  const std::string full = CopyOfFull(tmp);
  const prepared::PreparedDir p = Open(full);
  // Layer 5 expert 1 (rank 0's of 2): one byte in the middle of its bytes.
  const prepared::ExpertRecord& rec = p.experts.At(5, 1);
  const std::string path = p.expert_paths[rec.file_id];
  std::string bytes = ReadAll(path);
  bytes[rec.offset + rec.length / 2] ^= 0x5a;
  ASSERT_TRUE(WriteFileAtomic(D(), path, bytes).ok());
  const std::string out = tmp.Join("share");
  ExpectError(SplitStatus(D(), Opts(full, out, 2, 0)), Code::kIntegrity,
              {path, "layer 5 expert 1", "byte offset " + std::to_string(rec.offset), "XXH3-64",
               "experts.idx records"});
  EXPECT_FALSE(fs::exists(JoinPath(out, "k3.sum")));
  EXPECT_EQ(FilesUnder(out), std::vector<std::string>{});
  // Rank 1's experts are intact: its share splits.
  EXPECT_TRUE(SplitStatus(D(), Opts(full, tmp.Join("other"), 2, 1)).ok());
  // The same DIR can be split into again once the source is mended.
  bytes[rec.offset + rec.length / 2] ^= 0x5a;
  ASSERT_TRUE(WriteFileAtomic(D(), path, bytes).ok());
  EXPECT_TRUE(SplitStatus(D(), Opts(full, out, 2, 0)).ok());
}

TEST(SplitErrors, CorruptedTrunkByteNamesTheRegion) {
  TempDir tmp;
  const std::string full = CopyOfFull(tmp);
  const prepared::PreparedDir p = Open(full);
  const prepared::Region* q = p.manifest.FindRegion("language_model.model.layers.2.mlp_res_norm.weight");
  ASSERT_NE(q, nullptr);
  std::string trunk = ReadAll(JoinPath(full, "trunk.bin"));
  trunk[q->offset] ^= 1;
  ASSERT_TRUE(WriteFileAtomic(D(), JoinPath(full, "trunk.bin"), trunk).ok());
  const std::string out = tmp.Join("share");
  ExpectError(SplitStatus(D(), Opts(full, out, 4, 3)), Code::kIntegrity,
              {JoinPath(full, "trunk.bin"), "region \"" + q->name + "\"",
               "byte offset " + std::to_string(q->offset), "XXH3-128", "k3.json records"});
  EXPECT_EQ(FilesUnder(out), std::vector<std::string>{});
}

TEST(SplitErrors, NonEmptyOutIsRefusedAndLeftAlone) {
  TempDir tmp;
  const std::string out = tmp.Join("busy");
  tmp.WriteFile("busy/notes.txt", "mine");
  ExpectError(SplitStatus(D(), Opts(CopyFull(), out, 2, 0)), Code::kInvalid,
              {out, "not empty", "notes.txt", "remove it or choose another --out"});
  EXPECT_EQ(FilesUnder(out), std::vector<std::string>{"notes.txt"});
  // An empty existing directory is fine.
  fs::create_directory(tmp.Join("empty"));
  EXPECT_TRUE(SplitStatus(D(), Opts(CopyFull(), tmp.Join("empty"), 2, 0)).ok());
}

TEST(SplitErrors, AShareAsInputIsRefused) {
  TempDir tmp;
  ASSERT_TRUE(SplitStatus(D(), Opts(CopyFull(), tmp.Join("share"), 2, 0)).ok());
  ExpectError(SplitStatus(D(), Opts(tmp.Join("share"), tmp.Join("again"), 2, 0)), Code::kInvalid,
              {tmp.Join("share"), "already a share (rank 0 of 2); split the full directory"});
  EXPECT_FALSE(fs::exists(tmp.Join("again")));
}

TEST(SplitErrors, RanksAndRankOutOfRangeNameTheFlag) {
  TempDir tmp;
  ExpectError(SplitStatus(D(), Opts(CopyFull(), tmp.Join("x"), 9, 0)), Code::kInvalid,
              {"--ranks", "9 ranks", "8 experts", "1 to 8"});
  ExpectError(SplitStatus(D(), Opts(CopyFull(), tmp.Join("x"), 2, 2)), Code::kInvalid,
              {"--rank 2", "below --ranks 2"});
  ExpectError(SplitStatus(D(), Opts(CopyFull(), tmp.Join("x"), 0, 0)), Code::kInvalid, {"--ranks 0"});
  EXPECT_FALSE(fs::exists(tmp.Join("x")));
}

TEST(SplitErrors, WriteFailureLeavesNoFinalFiles) {
  TempDir tmp;
  const std::string out = tmp.Join("share");
  FaultEnv env;
  env.SetRule(JoinPath(out, "experts"), FaultRule::EnospcAfter(10000));
  Status s = SplitStatus(&env, Opts(CopyFull(), out, 2, 1));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kIo) << s.ToString();
  EXPECT_EQ(FilesUnder(out), std::vector<std::string>{});
}

TEST(SplitErrors, RenameFailureLeavesNoFinalFiles) {
  TempDir tmp;
  const std::string out = tmp.Join("share");
  FaultEnv env;
  env.SetRule(JoinPath(out, "resident.bin"), FaultRule::RenameFails());
  EXPECT_FALSE(SplitStatus(&env, Opts(CopyFull(), out, 2, 1)).ok());
  EXPECT_EQ(FilesUnder(out), std::vector<std::string>{});
}

TEST(SplitErrors, SourceReadErrorNamesTheFile) {
  TempDir tmp;
  const prepared::PreparedDir p = Open(CopyFull());
  const prepared::ExpertRecord& rec = p.experts.At(4, 6);
  FaultEnv env;
  env.SetRule(p.expert_paths[rec.file_id], FaultRule::EioAt(rec.offset + 10));
  const std::string out = tmp.Join("share");
  Status s = SplitStatus(&env, Opts(CopyFull(), out, 2, 1));
  ExpectError(s, Code::kIo, {p.expert_paths[rec.file_id], "layer 4 expert 6"});
  EXPECT_EQ(FilesUnder(out), std::vector<std::string>{});
}

// ---- the command line ---------------------------------------------------------------------

struct ProcResult {
  int exit_code = -1;
  std::string out;
};
ProcResult RunK3prep(const std::string& args) {
  const std::string cmd = std::string(K3_BINARY_DIR) + "/k3prep/k3prep " + args + " 2>&1";
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

TEST(SplitCli, SplitsAndSaysWhatItDidAndWhatIsNext) {
  TempDir tmp;
  const std::string out = tmp.Join("share");
  ProcResult r = RunK3prep("split " + CopyFull() + " --ranks 2 --rank 1 --out " + out +
                           " --progress none");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("split " + CopyFull() + " -> " + out + ": rank 1 of 2, experts 48 of 96 ("),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("map: contiguous over 2 ranks: rank 0 experts 0-3, rank 1 4-7"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("next: k3verify prepared " + out + " --deep"), std::string::npos) << r.out;
}

TEST(SplitCli, BadFlagsAreExitTwoNamingTheFlag) {
  TempDir tmp;
  const std::string base = "split " + CopyFull() + " --out " + tmp.Join("x");
  struct Case {
    std::string args;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {base + " --ranks 0 --rank 0", "--ranks: 0 is out of range: allowed 1 to 4096"},
           {base + " --ranks 2 --rank -1", "--rank: -1 is out of range"},
           {base + " --ranks 9 --rank 0", "--ranks: 9 ranks is out of range"},
           {base + " --ranks 2 --rank 2", "--rank 2: must be below --ranks 2"},
           {base + " --rank 0", "--ranks is required"}}) {
    ProcResult r = RunK3prep(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << ": " << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.args << ": " << r.out;
  }
  EXPECT_FALSE(fs::exists(tmp.Join("x")));
}

TEST(SplitCli, CorruptSourceIsExitThree) {
  TempDir tmp;
  const std::string full = CopyOfFull(tmp);
  const prepared::PreparedDir p = Open(full);
  const prepared::ExpertRecord& rec = p.experts.At(1, 0);
  std::string bytes = ReadAll(p.expert_paths[rec.file_id]);
  bytes[rec.offset] ^= 1;
  ASSERT_TRUE(WriteFileAtomic(D(), p.expert_paths[rec.file_id], bytes).ok());
  ProcResult r = RunK3prep("split " + full + " --ranks 2 --rank 0 --out " + tmp.Join("s") +
                           " --progress none");
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_NE(r.out.find("layer 1 expert 0"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace k3::prep
