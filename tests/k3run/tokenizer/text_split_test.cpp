// UTF-8 repair and upstream's 400,000 / 25,000-character splitting. Expected values are
// Python 3's bytes.decode("utf-8", errors="replace") and str.isspace(), recorded by hand.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "k3run/text/text_split.h"

namespace k3::tok {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

TEST(ReplaceInvalidUtf8, ValidTextUnchanged) {
  const std::string s = "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF";
  EXPECT_TRUE(IsValidUtf8(s));
  EXPECT_EQ(ReplaceInvalidUtf8(s), s);
}

TEST(ReplaceInvalidUtf8, StrayContinuationAndInvalidLeadBytes) {
  EXPECT_FALSE(IsValidUtf8("a\x80z"));
  EXPECT_EQ(ReplaceInvalidUtf8("a\x80z"), "a" + kFffd + "z");
  EXPECT_EQ(ReplaceInvalidUtf8("\xFF\xFE"), kFffd + kFffd);
  EXPECT_EQ(ReplaceInvalidUtf8("\xC0\xAF"), kFffd + kFffd);  // overlong lead: per byte
}

TEST(ReplaceInvalidUtf8, TruncatedSequenceIsOneReplacement) {
  EXPECT_EQ(ReplaceInvalidUtf8("\xF0\x9F\x98"), kFffd);
  EXPECT_EQ(ReplaceInvalidUtf8("\xF0\x9F\x98x"), kFffd + "x");
  EXPECT_EQ(ReplaceInvalidUtf8("\xE2\x82"), kFffd);
}

TEST(ReplaceInvalidUtf8, SurrogatesAndOverlongThreeByteArePerByte) {
  // b"\xed\xa0\x80".decode(errors="replace") == "\ufffd\ufffd\ufffd"
  EXPECT_EQ(ReplaceInvalidUtf8("\xED\xA0\x80"), kFffd + kFffd + kFffd);
  EXPECT_EQ(ReplaceInvalidUtf8("\xE0\x80\x80"), kFffd + kFffd + kFffd);
  // Above U+10FFFF: b"\xf4\x90\x80\x80" → four replacements.
  EXPECT_EQ(ReplaceInvalidUtf8("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);
}

TEST(ReplaceInvalidUtf8, ValidPrefixThenBadByte) {
  // b"\xe2\x82\x41" → "\ufffdA"; b"\xf0\x9f\x41" → "\ufffdA"
  EXPECT_EQ(ReplaceInvalidUtf8("\xE2\x82\x41"), kFffd + "A");
  EXPECT_EQ(ReplaceInvalidUtf8("\xF0\x9F\x41"), kFffd + "A");
}

TEST(IsPythonSpace, MatchesPythonIsspace) {
  // [hex(c) for c in range(0x110000) if chr(c).isspace()] in Python 3.11.
  const std::vector<char32_t> spaces = {0x9, 0xA, 0xB, 0xC, 0xD, 0x1C, 0x1D, 0x1E, 0x1F, 0x20,
                                        0x85, 0xA0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003,
                                        0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200A,
                                        0x2028, 0x2029, 0x202F, 0x205F, 0x3000};
  size_t count = 0;
  for (char32_t c = 0; c < 0x110000; ++c) {
    if (IsPythonSpace(c)) ++count;
  }
  EXPECT_EQ(count, spaces.size());
  for (char32_t c : spaces) EXPECT_TRUE(IsPythonSpace(c)) << std::hex << static_cast<uint32_t>(c);
  EXPECT_FALSE(IsPythonSpace(0x180E));
  EXPECT_FALSE(IsPythonSpace(0x200B));
}

std::vector<std::pair<size_t, size_t>> Ranges(std::string_view s, size_t piece, size_t run) {
  std::vector<std::pair<size_t, size_t>> out;
  for (const ByteRange& r : SplitForEncoding(s, piece, run)) out.emplace_back(r.begin, r.end);
  return out;
}
using R = std::vector<std::pair<size_t, size_t>>;

TEST(SplitForEncoding, EmptyTextHasNoPieces) { EXPECT_TRUE(SplitForEncoding("").empty()); }

TEST(SplitForEncoding, ShortRunsAreNotSplit) {
  EXPECT_EQ(Ranges("ab cd  ef", 100, 3), (R{{0, 9}}));
}

TEST(SplitForEncoding, OverlongRunIsCutAfterMaxChars) {
  // upstream with max 3: "aaaa bb" → "aaa", "a bb"
  EXPECT_EQ(Ranges("aaaa bb", 100, 3), (R{{0, 3}, {3, 7}}));
  // "x" + 7 spaces: cut when the space run exceeds 3: "x   ", "   ", " "
  EXPECT_EQ(Ranges("x       ", 100, 3), (R{{0, 4}, {4, 7}, {7, 8}}));
}

TEST(SplitForEncoding, CountsCharactersNotBytes) {
  // Four 3-byte characters, max run 3 → cut before the fourth (byte 9).
  EXPECT_EQ(Ranges("\xE4\xB8\xAD\xE4\xB8\xAD\xE4\xB8\xAD\xE4\xB8\xAD", 100, 3), (R{{0, 9}, {9, 12}}));
  // U+3000 is a space for str.isspace(): no run exceeds 3.
  EXPECT_EQ(Ranges("ab\xE3\x80\x80" "cd", 100, 3), (R{{0, 7}}));
}

TEST(SplitForEncoding, PiecesOfMaxCharsAndRunCountRestartsPerPiece) {
  // Pieces of 5 characters; each piece starts a fresh run count (upstream splits first).
  EXPECT_EQ(Ranges("abcdefghij", 5, 4), (R{{0, 4}, {4, 5}, {5, 9}, {9, 10}}));
  EXPECT_EQ(Ranges("abcdefg", 5, 100), (R{{0, 5}, {5, 7}}));
}

TEST(SplitForEncoding, DefaultLimitsCutA25001CharRun) {
  const std::string s(25001, 'a');
  EXPECT_EQ(Ranges(s, kMaxEncodeChars, kMaxRunChars), (R{{0, 25000}, {25000, 25001}}));
}

}  // namespace
}  // namespace k3::tok
