// Rank BPE on the hand-made vocabulary of test_vocab.h; expected ids worked out by hand.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "k3run/text/bpe.h"
#include "test_vocab.h"

namespace k3::tok {
namespace {

class BpeTest : public ::testing::Test {
 protected:
  BpeTest() : vocab_(test::TestVocab()) {
    ranks_.Build(std::vector<std::string_view>(vocab_.tokens.begin(), vocab_.tokens.end()));
  }
  std::vector<int32_t> Scan(std::string_view s) {
    std::vector<int32_t> out;
    BytePairEncodeScan(s, ranks_, &out);
    return out;
  }
  std::vector<int32_t> Heap(std::string_view s) {
    std::vector<int32_t> out;
    BytePairEncodeHeap(s, ranks_, &out);
    return out;
  }
  tiktoken::Vocab vocab_;
  RankMap ranks_;
};

using Ids = std::vector<int32_t>;

TEST_F(BpeTest, LowestRankMergesFirst) {
  // "abc": pairs ab (258) and bc (257): bc merges first, then a+bc = abc (260).
  EXPECT_EQ(Scan("abc"), (Ids{260}));
  EXPECT_EQ(Heap("abc"), (Ids{260}));
}

TEST_F(BpeTest, TiesMergeLeftmostFirst) {
  // "aaa": aa (256) at 0 and 1: the left one merges → [aa, a].
  EXPECT_EQ(Scan("aaa"), (Ids{256, 'a'}));
  EXPECT_EQ(Heap("aaa"), (Ids{256, 'a'}));
  // "aaaaa": aa|aa|a, then aa+aa = aaaa (259) → [aaaa, a].
  EXPECT_EQ(Scan("aaaaa"), (Ids{259, 'a'}));
  EXPECT_EQ(Heap("aaaaa"), (Ids{259, 'a'}));
}

TEST_F(BpeTest, NoMergesLeavesBytes) {
  EXPECT_EQ(Scan("xyz"), (Ids{'x', 'y', 'z'}));
  EXPECT_EQ(Heap("xyz"), (Ids{'x', 'y', 'z'}));
}

TEST_F(BpeTest, ScanAndHeapAgreeOnRandomPieces) {
  std::mt19937 rng(12345);
  const std::string alphabet = "aabbcc wolr";
  for (int n = 0; n < 3000; ++n) {
    std::string s(1 + rng() % 300, ' ');
    for (char& c : s) c = alphabet[rng() % alphabet.size()];
    ASSERT_EQ(Scan(s), Heap(s)) << s;
  }
}

TEST_F(BpeTest, RankMapFindsEveryKeyAndNothingElse) {
  for (size_t r = 0; r < vocab_.tokens.size(); ++r) {
    ASSERT_EQ(ranks_.Find(vocab_.tokens[r]), static_cast<int32_t>(r));
  }
  EXPECT_EQ(ranks_.Find("abcd"), RankMap::kNone);
  EXPECT_EQ(ranks_.Find(""), RankMap::kNone);
  EXPECT_EQ(RankMap().Find("a"), RankMap::kNone);
}

TEST_F(BpeTest, LongRunIsFast) {
  const std::string s(1 << 20, 'a');  // 2^18 × "aaaa"
  std::vector<int32_t> out;
  BytePairEncode(s, ranks_, &out);
  ASSERT_EQ(out.size(), size_t{1} << 18);
  for (int32_t id : out) ASSERT_EQ(id, 259);
}

}  // namespace
}  // namespace k3::tok
