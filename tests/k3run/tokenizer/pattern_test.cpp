// The pattern translation (&& → lookahead, Han script, White_Space) and the compiled
// pre-tokenizer's splits on hand-checked inputs.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/env.h"
#include "k3run/text/pattern.h"
#include "k3run/text/pretokenizer.h"
#include "k3run/text/tokenizer.h"

namespace k3::tok {
namespace {

std::vector<std::string> Pieces(std::string_view text) {
  Result<std::string> p = KimiPatternForPcre2(KimiPattern());
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  Result<PreTokenizer> pre = PreTokenizer::Create(*p);
  EXPECT_TRUE(pre.ok()) << pre.status().ToString();
  std::vector<std::string> out;
  pre->Split(text, [&](std::string_view s) { out.emplace_back(s); });
  return out;
}

TEST(KimiPattern, EqualsReleasedPatternFile) {
  Result<std::string> file = ReadFileToString(
      Env::Default(), std::string(K3_SOURCE_DIR) + "/tests/k3run/tokenizer/data/tokenizer-pattern.txt");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  std::string joined;
  size_t start = 0;
  while (start < file->size()) {
    size_t nl = file->find('\n', start);
    if (nl == std::string::npos) nl = file->size();
    if (!joined.empty()) joined += '|';
    joined += file->substr(start, nl - start);
    start = nl + 1;
  }
  EXPECT_EQ(std::string(KimiPattern()), joined);
}

TEST(RewriteClassIntersections, NegatedOperandBecomesNegativeLookahead) {
  Result<std::string> r = RewriteClassIntersections(R"(x[\p{Lu}\p{M}&&[^\p{Han}]]+y)");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, R"(x(?:(?!\p{Han})[\p{Lu}\p{M}])+y)");
}

TEST(RewriteClassIntersections, PositiveOperandBecomesLookahead) {
  Result<std::string> r = RewriteClassIntersections(R"([a-z&&[aeiou]])");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, R"((?:(?=[aeiou])[a-z]))");
}

TEST(RewriteClassIntersections, ClassesWithoutIntersectionAndEscapesUntouched) {
  const std::string p = R"([^\r\n\p{L}\p{N}]?\[&&\]|[\]&]+)";
  Result<std::string> r = RewriteClassIntersections(p);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, p);
}

TEST(RewriteClassIntersections, ReleasedPatternHasFourLookaheadsAndNoAmpersands) {
  Result<std::string> r = RewriteClassIntersections(KimiPattern());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->find("&&"), std::string::npos);
  size_t count = 0;
  for (size_t at = r->find(R"((?:(?!\p{Han})[)"); at != std::string::npos;
       at = r->find(R"((?:(?!\p{Han})[)", at + 1)) {
    ++count;
  }
  EXPECT_EQ(count, 4u);
}

TEST(RewriteClassIntersections, UnsupportedFormIsRefusedWithOffset) {
  Result<std::string> r = RewriteClassIntersections(R"(ab[x&&y])");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalid);
  EXPECT_NE(r.status().message().find("at byte 2"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("[x&&y]"), std::string::npos) << r.status().message();
}

TEST(RewriteClassIntersections, UnterminatedClassIsRefusedWithOffset) {
  Result<std::string> r = RewriteClassIntersections(R"(a|[\p{L}&&[^x])");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unterminated"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("at byte 2"), std::string::npos) << r.status().message();
}

TEST(KimiPatternForPcre2, HanBecomesScriptAndSpaceBecomesWhiteSpaceClass) {
  Result<std::string> r = KimiPatternForPcre2(R"([\p{Han}]+|[^\s\p{L}]|\s+(?!\S))");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::string ws = R"(\x{9}-\x{D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
  EXPECT_EQ(*r, R"([\p{sc:Han}]+|[^)" + ws + R"(\p{L}]|[)" + ws + "]+(?![^" + ws + "])");
}

TEST(KimiPatternForPcre2, ScriptPropertiesOtherThanHanAreRefused) {
  Result<std::string> r = KimiPatternForPcre2(R"(a\p{Greek}+)");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("Greek"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("at byte 1"), std::string::npos) << r.status().message();
}

TEST(PreTokenizer, BadPatternIsRefusedWithOffset) {
  Result<PreTokenizer> pre = PreTokenizer::Create("ab(c");
  ASSERT_FALSE(pre.ok());
  EXPECT_EQ(pre.status().code(), Code::kInvalid);
  EXPECT_NE(pre.status().message().find("at byte 4"), std::string::npos) << pre.status().message();
}

using V = std::vector<std::string>;

TEST(PreTokenizer, WordsSpacesAndContractions) {
  EXPECT_EQ(Pieces("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(Pieces("I'M don't"), (V{"I'M", " don't"}));
  EXPECT_EQ(Pieces("HELLOworld"), (V{"HELLOworld"}));
}

TEST(PreTokenizer, DigitsInGroupsOfThree) {
  EXPECT_EQ(Pieces("1234567"), (V{"123", "456", "7"}));
}

TEST(PreTokenizer, HanRunsSplitFromKanaAndPunctuation) {
  // 日本語 (Han) | のテキスト (kana: letters, not Han) | 。 (Common script; Han only by
  // Script_Extensions, which must NOT count).
  EXPECT_EQ(Pieces("日本語のテキスト。"), (V{"日本語", "のテキスト", "。"}));
  EXPECT_EQ(Pieces("中文、"), (V{"中文", "、"}));
}

TEST(PreTokenizer, WhitespaceRulesAndNewlines) {
  EXPECT_EQ(Pieces("a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(Pieces("a\r\n\r\nb"), (V{"a", "\r\n\r\n", "b"}));
  EXPECT_EQ(Pieces("x  "), (V{"x", "  "}));
}

TEST(PreTokenizer, MongolianVowelSeparatorIsNotWhitespace) {
  // U+180E is not White_Space (tiktoken's \s; it was before Unicode 6.3): it is
  // punctuation-like here (alternative 5) and glues to the following newline.
  EXPECT_EQ(Pieces("a\xE1\xA0\x8E\n"), (V{"a", "\xE1\xA0\x8E\n"}));
}

}  // namespace
}  // namespace k3::tok
