// formats/expert_share: the contiguous map (Begin/End/Owner, Describe), the rank-count rule and
// the model identity. Shares on disk are in prepared_dir_test.cpp; k3prep split in
// tests/k3prep/split_test.cpp.
#include "formats/expert_share.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "tests/formats/prepared_fixture.h"

namespace k3::prepared {
namespace {

void ExpectInvalid(const Status& s, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kInvalid);
  for (const std::string& p : parts) {
    EXPECT_NE(s.message().find(p), std::string::npos) << "missing \"" << p << "\" in: " << s.message();
  }
}

TEST(ExpertMap, RangesTileTheExpertsAndOwnerAgrees) {
  const std::vector<std::pair<int, int>> cases = {{1, 8},  {2, 8},   {3, 8},   {8, 8},  {3, 7},
                                                  {5, 13}, {7, 896}, {4, 896}, {1, 1},  {896, 896},
                                                  {4096, 65536}, {13, 13}};
  for (const auto& [n, e] : cases) {
    const ExpertMap map{n, e};
    EXPECT_EQ(map.Begin(0), 0) << n << "/" << e;
    EXPECT_EQ(map.End(n - 1), e) << n << "/" << e;
    for (int r = 0; r < n; ++r) {
      ASSERT_LT(map.Begin(r), map.End(r)) << "rank " << r << " of " << n << " owns nothing of " << e;
      // Contiguous: sizes differ by at most one.
      EXPECT_LE(map.End(r) - map.Begin(r), e / n + 1);
      EXPECT_GE(map.End(r) - map.Begin(r), e / n);
    }
    for (int x = 0; x < e; ++x) {
      const int o = map.Owner(x);
      ASSERT_GE(o, 0);
      ASSERT_LT(o, n);
      ASSERT_LE(map.Begin(o), x) << "expert " << x << " of " << e << " over " << n;
      ASSERT_LT(x, map.End(o)) << "expert " << x << " of " << e << " over " << n;
    }
  }
}

TEST(ExpertMap, ThreeRanksOfEightExpertsAreTheDocumentedRanges) {
  const ExpertMap map{3, 8};
  EXPECT_EQ(map.Begin(0), 0);
  EXPECT_EQ(map.Begin(1), 2);
  EXPECT_EQ(map.Begin(2), 5);
  EXPECT_EQ(map.End(2), 8);
  const int owners[8] = {0, 0, 1, 1, 1, 2, 2, 2};
  for (int x = 0; x < 8; ++x) EXPECT_EQ(map.Owner(x), owners[x]) << x;
}

TEST(ExpertMap, OneExpertPerRankWhenRanksEqualExperts) {
  const ExpertMap map{8, 8};
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(map.Begin(r), r);
    EXPECT_EQ(map.End(r), r + 1);
    EXPECT_EQ(map.Owner(r), r);
  }
}

TEST(ExpertMap, DescribeListsInclusiveRanges) {
  EXPECT_EQ((ExpertMap{4, 896}).Describe(),
            "contiguous over 4 ranks: rank 0 experts 0-223, rank 1 224-447, rank 2 448-671, "
            "rank 3 672-895");
  EXPECT_EQ((ExpertMap{3, 8}).Describe(),
            "contiguous over 3 ranks: rank 0 experts 0-1, rank 1 2-4, rank 2 5-7");
  EXPECT_EQ((ExpertMap{1, 8}).Describe(), "contiguous over 1 rank: rank 0 experts 0-7");
  EXPECT_EQ((ExpertMap{2, 2}).Describe(), "contiguous over 2 ranks: rank 0 experts 0, rank 1 1");
  EXPECT_EQ((ExpertMap{1, 0}).Describe(), "contiguous over 1 rank: no routed experts");
  // Many ranks: the first few and the last, not thousands of ranges.
  const std::string many = (ExpertMap{100, 896}).Describe();
  EXPECT_NE(many.find("rank 6 "), std::string::npos) << many;
  EXPECT_NE(many.find(", …, rank 99 887-895"), std::string::npos) << many;
  EXPECT_EQ(many.find("rank 50 "), std::string::npos) << many;
}

TEST(ValidateRanks, AcceptsOneToTheExpertCount) {
  for (int n : {1, 2, 7, 8}) EXPECT_TRUE(ValidateRanks(n, 8, "--ranks").ok()) << n;
  EXPECT_TRUE(ValidateRanks(1, 0, "--ranks").ok());
  EXPECT_TRUE(ValidateRanks(kMaxRanks, 65536, "--ranks").ok());
}

TEST(ValidateRanks, ZeroRanksRefusedNamingTheFlag) {
  ExpectInvalid(ValidateRanks(0, 8, "--ranks"), {"--ranks", "0 ranks", "1 to 8"});
}

TEST(ValidateRanks, MoreRanksThanExpertsRefused) {
  ExpectInvalid(ValidateRanks(9, 8, "k3.json: share.ranks"),
                {"k3.json: share.ranks", "9 ranks", "8 experts", "1 to 8"});
}

TEST(ValidateRanks, MoreThanTheBoundRefused) {
  ExpectInvalid(ValidateRanks(kMaxRanks + 1, 65536, "--ranks"), {"4097 ranks", "1 to 4096"});
}

TEST(ValidateRanks, ModelWithoutExpertsAllowsOneRankOnly) {
  ExpectInvalid(ValidateRanks(2, 0, "--ranks"), {"no routed experts", "only 1"});
}

TEST(ExpertShare, HoldsAndTheAbsentReasonNameTheShare) {
  const ExpertShare s{4, 1, "contiguous"};
  EXPECT_FALSE(s.Holds(0, 8));
  EXPECT_TRUE(s.Holds(2, 8));
  EXPECT_TRUE(s.Holds(3, 8));
  EXPECT_FALSE(s.Holds(4, 8));
  EXPECT_EQ(DescribeShare(s), "rank 1 of 4 (contiguous)");
  EXPECT_EQ(AbsentExpertReason(s),
            "not in this prepared directory (it holds rank 1 of 4's share; run it as rank 1 of "
            "mpirun -np 4 … --mpi)");
}

// A manifest in memory: the tiny config and its trunk/resident regions with distinct hashes.
Manifest IdentityManifest() {
  Manifest m;
  m.config = test::TinyConfig();
  Result<Layout> layout = BuildLayout(m.config, test::TinyTensors());
  EXPECT_TRUE(layout.ok()) << layout.status().ToString();
  if (!layout.ok()) return m;
  uint64_t k = 1;
  for (const std::vector<Region>* part : {&layout->trunk, &layout->resident}) {
    for (Region r : *part) {
      r.xxh3_128 = Hash128{k, ~k};
      ++k;
      m.regions.push_back(r);
    }
  }
  m.regions.push_back(Region{"experts.idx", "experts.idx", 0, 128, DType::kU8, {128}, {7, 7}});
  return m;
}

TEST(ModelIdentity, IgnoresWhatSharesAndModesChange) {
  const Manifest m = IdentityManifest();
  const Hash128 id = ModelIdentity(m);
  Manifest other = m;
  other.experts_mode = ExpertsMode::kLink;
  other.share = ExpertShare{4, 3, "contiguous"};
  other.expert_files = {FileEntry{"experts/layer-001.bin", 4096}};
  other.source.model_dir_abs = "/elsewhere";
  other.regions.back().xxh3_128 = Hash128{8, 8};  // experts.idx differs between shares
  other.regions.push_back(Region{"tokenizer/tiktoken.model", "tokenizer/tiktoken.model", 0, 9,
                                 DType::kU8, {9}, {1, 2}});
  EXPECT_EQ(ModelIdentity(other), id);
}

TEST(ModelIdentity, ChangesWithAnyTrunkHashOffsetOrTheConfig) {
  const Manifest m = IdentityManifest();
  const Hash128 id = ModelIdentity(m);
  Manifest hash = m;
  hash.regions[3].xxh3_128.low ^= 1;
  EXPECT_NE(ModelIdentity(hash), id);
  Manifest offset = m;
  offset.regions[3].offset += 64;
  EXPECT_NE(ModelIdentity(offset), id);
  Manifest name = m;
  name.regions[3].name += "x";
  EXPECT_NE(ModelIdentity(name), id);
  Manifest config = m;
  config.config.rms_eps *= 2;
  EXPECT_NE(ModelIdentity(config), id);
}

}  // namespace
}  // namespace k3::prepared
