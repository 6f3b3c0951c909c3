// Tests for k3prep/bpe_trainer: the pre-split rule, merges on hand-computed examples, the stop
// rules, determinism, and a speed sanity run over the shipped corpus (reported, not asserted).
#include "k3prep/synth/bpe_trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

namespace k3::bpe {
namespace {

std::vector<std::string> Split(std::string_view text) {
  std::vector<std::string> out;
  for (std::string_view p : PreSplit(text)) out.emplace_back(p);
  return out;
}

using Pieces = std::vector<std::string>;

TEST(PreSplit, WordsPunctuationAndLeadingSpace) {
  EXPECT_EQ(Split("Hello, world!"), (Pieces{"Hello", ",", " world", "!"}));
  // Only the last space of a whitespace run joins the next piece.
  EXPECT_EQ(Split("a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(Split("x\n\ny"), (Pieces{"x", "\n\n", "y"}));
  EXPECT_EQ(Split(" lead"), (Pieces{" lead"}));
  EXPECT_EQ(Split("end "), (Pieces{"end", " "}));
}

TEST(PreSplit, DigitsAndPunctuationRuns) {
  EXPECT_EQ(Split("abc123def"), (Pieces{"abc", "123", "def"}));
  EXPECT_EQ(Split("f(x);"), (Pieces{"f", "(", "x", ");"}));
  EXPECT_EQ(Split("a == 42"), (Pieces{"a", " ==", " 42"}));
}

TEST(PreSplit, ScriptChangeSplits) {
  // Latin, Cyrillic, Greek, Han, Hiragana, Hangul, Arabic: one piece per script run.
  EXPECT_EQ(Split("abcабвαβγ"), (Pieces{"abc", "абв", "αβγ"}));
  EXPECT_EQ(Split("人権のため"), (Pieces{"人権", "のため"}));
  EXPECT_EQ(Split("한국어 عربي"), (Pieces{"한국어", " عربي"}));
  // Latin letters with diacritics stay in the Latin run (Vietnamese, Polish).
  EXPECT_EQ(Split("Việt Łódź"), (Pieces{"Việt", " Łódź"}));
}

TEST(PreSplit, CombiningMarksContinueTheRun) {
  // "e" + U+0301 COMBINING ACUTE ACCENT, then Devanagari with its vowel signs.
  EXPECT_EQ(Split("cafe\xCC\x81 नमस्ते"), (Pieces{"cafe\xCC\x81", " नमस्ते"}));
}

TEST(PreSplit, EmojiSequencesStayWhole) {
  // Family: man ZWJ woman ZWJ girl; thumbs up + skin tone; heart + VS16.
  const std::string family = "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7";
  const std::string thumbs = "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD";
  const std::string heart = "\xE2\x9D\xA4\xEF\xB8\x8F";
  EXPECT_EQ(Split("hi " + family + " " + thumbs + heart),
            (Pieces{"hi", " " + family, " " + thumbs + heart}));
}

TEST(PreSplit, InvalidBytesStandAlone) {
  EXPECT_EQ(Split("a\xFF\xFE" "b"), (Pieces{"a", "\xFF", "\xFE", "b"}));
  // Truncated sequence, overlong encoding, encoded surrogate: every byte alone.
  EXPECT_EQ(Split("x\xE4\xB8"), (Pieces{"x", "\xE4", "\xB8"}));
  EXPECT_EQ(Split("\xC0\xAF"), (Pieces{"\xC0", "\xAF"}));
  EXPECT_EQ(Split("\xED\xA0\x80"), (Pieces{"\xED", "\xA0", "\x80"}));
}

TEST(PreSplit, PiecesConcatenateToInput) {
  const std::string text = "Mixed: Ελληνικά, 中文。 \t emoji 😀! \xF0 bad";
  std::string joined;
  for (std::string_view p : PreSplit(text)) {
    EXPECT_FALSE(p.empty());
    joined += p;
  }
  EXPECT_EQ(joined, text);
}

// Worked by hand. Pieces: "ab" ×3, "abc" ×2, "bc" ×1.
//   pairs: (a,b) = 3 + 2 = 5, (b,c) = 2 + 1 = 3      → merge 1: a+b = "ab"
//   words: [ab] ×3, [ab,c] ×2, [b,c] ×1
//   pairs: (ab,c) = 2, (b,c) = 1                     → merge 2: ab+c = "abc"
//   words: [ab] ×3, [abc] ×2, [b,c] ×1
//   pairs: (b,c) = 1 < 2                             → stop, exhausted
TEST(Train, HandComputedMerges) {
  const PieceCounts counts = {{"ab", 3}, {"abc", 2}, {"bc", 1}};
  TrainStats stats;
  EXPECT_EQ(Train(counts, 100, &stats), (Pieces{"ab", "abc"}));
  EXPECT_TRUE(stats.exhausted);
  EXPECT_EQ(stats.new_tokens, 2);
  EXPECT_EQ(stats.last_pair_count, 2);
  EXPECT_EQ(stats.unique_pieces, 3);
}

// Overlapping pair, by hand. Piece "aaaaa" ×2:
//   (a,a) = 4 occurrences × 2 = 8                        → "aa"; word [aa,aa,a]
//   (aa,aa) = 2, (aa,a) = 2: tie, "aaa" < "aaaa"         → "aaa"; word [aa,aaa]
//   (aa,aaa) = 2                                         → "aaaaa"; word [aaaaa]
TEST(Train, OverlappingPairsMergeLeftToRight) {
  EXPECT_EQ(Train({{"aaaaa", 2}}, 100), (Pieces{"aa", "aaa", "aaaaa"}));
}

// Equal counts: the smaller concatenated bytes wins, whatever the insertion order.
TEST(Train, TiesBrokenBySmallestConcatenation) {
  EXPECT_EQ(Train({{"xy", 2}, {"ab", 2}, {"ba", 2}}, 100), (Pieces{"ab", "ba", "xy"}));
}

TEST(Train, StopsAtMaxMerges) {
  TrainStats stats;
  EXPECT_EQ(Train({{"ab", 3}, {"abc", 2}, {"bc", 1}}, 1, &stats), (Pieces{"ab"}));
  EXPECT_FALSE(stats.exhausted);
  EXPECT_TRUE(Train({{"ab", 3}}, 0).empty());
}

TEST(Train, PairSeenOnceIsNotMerged) {
  TrainStats stats;
  EXPECT_TRUE(Train({{"ab", 1}, {"cd", 1}}, 100, &stats).empty());
  EXPECT_TRUE(stats.exhausted);
}

PieceCounts CorpusCounts(bool reverse_files = false) {
  std::vector<std::filesystem::path> files;
  for (const auto& e :
       std::filesystem::directory_iterator(std::string(K3_SOURCE_DIR) + "/tests/data/corpus")) {
    if (e.path().extension() == ".txt") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (reverse_files) std::reverse(files.begin(), files.end());
  PieceCounts counts;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    CountPieces(text, &counts);
  }
  return counts;
}

// Every learned token is the concatenation of two tokens that existed before it, all tokens
// are distinct, and the run is deterministic (file order does not matter) and prefix-stable.
TEST(Train, CorpusMergesAreWellFormedAndDeterministic) {
  const PieceCounts counts = CorpusCounts();
  ASSERT_GT(counts.size(), 1000u);
  const auto t0 = std::chrono::steady_clock::now();
  TrainStats stats;
  const std::vector<std::string> merges = Train(counts, 1 << 30, &stats);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "corpus: " << counts.size() << " unique pieces, " << merges.size()
            << " merges (exhausted=" << stats.exhausted << ", reused=" << stats.reused_merges
            << ") in " << seconds << " s\n";
  ::testing::Test::RecordProperty("learned_merges", static_cast<int>(merges.size()));
  EXPECT_TRUE(stats.exhausted);
  EXPECT_GT(merges.size(), 5000u);

  std::set<std::string> known;
  for (int i = 0; i < 256; ++i) known.insert(std::string(1, static_cast<char>(i)));
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& m = merges[i];
    bool split_found = false;
    for (size_t k = 1; k < m.size() && !split_found; ++k) {
      split_found = known.count(m.substr(0, k)) && known.count(m.substr(k));
    }
    ASSERT_TRUE(split_found) << "merge " << i << " is not two earlier tokens";
    ASSERT_TRUE(known.insert(m).second) << "merge " << i << " duplicates a token";
  }

  EXPECT_EQ(Train(CorpusCounts(/*reverse_files=*/true), 1 << 30), merges);
  const std::vector<std::string> first = Train(counts, 1000);
  ASSERT_EQ(first.size(), 1000u);
  EXPECT_TRUE(std::equal(first.begin(), first.end(), merges.begin()));
}

}  // namespace
}  // namespace k3::bpe
