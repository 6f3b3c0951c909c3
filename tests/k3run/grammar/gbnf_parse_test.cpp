// Grammar::Parse: what the GBNF subset accepts (each construct checked through a Matcher) and
// every refusal with its exact message.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "k3run/grammar/grammar.h"
#include "k3run/grammar/matcher.h"

namespace k3::run::grammar {
namespace {

const std::vector<std::string> kSpecials = {"<|open|>", "<|close|>", "<|sep|>", "[EOS]", "<think>"};

std::shared_ptr<const Grammar> MustParse(const std::string& text) {
  auto g = Grammar::Parse(text, kSpecials, "test.gbnf");
  EXPECT_TRUE(g.ok()) << g.status().ToString() << "\n" << text;
  return g.ok() ? *g : nullptr;
}

// Whether the whole of `s` is a sentence of the grammar.
bool Matches(const std::shared_ptr<const Grammar>& g, std::string_view s) {
  Matcher m(g);
  return m.AcceptBytes(s) && m.CanEnd();
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(GbnfParse, LlamaJsonGrammarAcceptsAndRefuses) {
  const std::string text =
      ReadFile(std::string(K3_SOURCE_DIR) + "/tests/k3run/grammar/data/json.gbnf");
  ASSERT_FALSE(text.empty());
  auto g = MustParse(text);
  ASSERT_NE(g, nullptr);
  for (const char* ok :
       {"{}", "{\"a\": 1}", "{\"a\":[1,2,{\"b\":null}],\"c\":\"x\\u00e9y\"}", "{ \"k\" : true }",
        "{\"n\": -0.5e+3}", "{\"s\": \"caf\xC3\xA9 \xF0\x9F\x98\x80\"}", "{\"a\":\n  [ ]\n}",
        "{\"e\": \"\\\"\\\\\\n\"}"}) {
    EXPECT_TRUE(Matches(g, ok)) << ok;
  }
  for (const char* bad :
       {"", "[1,2]", "{\"a\":}", "{\"a\":01}", "{\"a\":\"\\x\"}", "{\"a\":\"\x7F\"}", "{\"a\":\"x",
        "{\"a\" 1}", "{\"a\":1,}", "{\"a\": \"\xFF\"}", "{\"a\": \"\xC0\x80\"}", "{\"a\":1e10}"}) {
    EXPECT_FALSE(Matches(g, bad)) << bad;
  }
}

TEST(GbnfParse, RepetitionBounds) {
  auto g = MustParse("root ::= \"a\"{2,4} \"b\"{3} \"c\"{2,} \"d\"{,2} \"e\"? \"f\"+ \"g\"*\n");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(g, "aabbbccf"));
  EXPECT_TRUE(Matches(g, "aaaabbbcccccddefggg"));
  EXPECT_FALSE(Matches(g, "abbbccf"));      // a{2,4}: one a
  EXPECT_FALSE(Matches(g, "aaaaabbbccf"));  // five a
  EXPECT_FALSE(Matches(g, "aabbccf"));      // b{3}: two b
  EXPECT_FALSE(Matches(g, "aabbbcf"));      // c{2,}: one c
  EXPECT_FALSE(Matches(g, "aabbbccdddf"));  // d{,2}: three d
  EXPECT_FALSE(Matches(g, "aabbbcceef"));   // e?: two e
  EXPECT_FALSE(Matches(g, "aabbbcc"));      // f+: none
  auto zero = MustParse("root ::= \"x\" \"a\"{0} \"y\"{0,0}\n");
  EXPECT_TRUE(Matches(zero, "x"));
  EXPECT_FALSE(Matches(zero, "xa"));
  // A repeated group and a repeated literal repeat as a whole.
  auto group = MustParse("root ::= (\"ab\" | \"c\"){2} \"xy\"{2}\n");
  EXPECT_TRUE(Matches(group, "abcxyxy"));
  EXPECT_FALSE(Matches(group, "abcxy"));
}

TEST(GbnfParse, Utf8ClassesWithMultibyteRanges) {
  auto g = MustParse("root ::= [α-ω]+ [一-龥] [^a-z]\n");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(g, "\xCE\xB1\xCF\x89\xE4\xB8\x80Z"));         // αω一Z
  EXPECT_TRUE(Matches(g, "\xCE\xB2\xE9\xBE\xA5\xF0\x9F\x98\x80"));  // β龥😀
  EXPECT_FALSE(Matches(g, "\xCE\xB1\xE4\xB8\x80z"));                // [^a-z] refuses z
  EXPECT_FALSE(Matches(g, "\xCE\x91\xE4\xB8\x80Z"));                // Α (U+0391) is not α-ω
  EXPECT_FALSE(Matches(g, "\xCE\xB1\xE4\xB8\x80\xFF"));             // 0xFF is never a character
  EXPECT_FALSE(Matches(g, "\xCE\xB1\xE4\xB8\x80\xED\xA0\x80"));     // an encoded surrogate
  EXPECT_FALSE(Matches(g, "\xCE\xB1\xE4\xB8\x80\xC1\x81"));         // an overlong 'A'
  // Range edges at every encoded-length boundary.
  auto edges = MustParse("root ::= [\\u0100-\\U0001F600]\n");
  for (const char* ok : {"\xC4\x80", "\xDF\xBF", "\xE0\xA0\x80", "\xEF\xBF\xBF", "\xF0\x90\x80\x80",
                         "\xF0\x9F\x98\x80", "\xED\x9F\xBF", "\xEE\x80\x80"}) {
    EXPECT_TRUE(Matches(edges, ok)) << ok;
  }
  for (const char* bad : {"\xC3\xBF", "\xF0\x9F\x98\x81", "A", "\xED\xA0\x80", "\xE0\x9F\xBF"}) {
    EXPECT_FALSE(Matches(edges, bad)) << bad;
  }
  // '.' is any code point (1..4 bytes), never a lone byte of one; \x escapes are code points.
  auto any = MustParse("root ::= . \"\\xFF\"\n");
  EXPECT_TRUE(Matches(any, "\xF4\x8F\xBF\xBF\xC3\xBF"));
  EXPECT_FALSE(Matches(any, "a\xFF"));
  EXPECT_FALSE(Matches(any, "\xF4\x90\x80\x80\xC3\xBF"));  // above U+10FFFF
}

TEST(GbnfParse, PartialCharacterCannotEnd) {
  auto g = MustParse("root ::= [^\\x00]*\n");
  Matcher m(g);
  ASSERT_TRUE(m.AcceptBytes("\xE4\xB8"));
  EXPECT_FALSE(m.CanEnd());  // inside a 3-byte character
  ASSERT_TRUE(m.AcceptByte(0x80));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_FALSE(m.AcceptByte(0x80));  // a continuation byte cannot start a character
}

TEST(GbnfParse, SpecialTokenTerminals) {
  auto g = MustParse("root ::= <|open|> \"x\" <|close|> <[EOS]> | <think> \"t\"\n");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->SpecialSymbol("<|close|>"), 1);
  Matcher m(g);
  EXPECT_FALSE(m.AcceptBytes("<|open|>"));  // the text of a special is not the special
  EXPECT_FALSE(m.AcceptSpecial(1));
  ASSERT_TRUE(m.AcceptSpecial(0));
  ASSERT_TRUE(m.AcceptByte('x'));
  ASSERT_TRUE(m.AcceptSpecial(1));
  EXPECT_FALSE(m.CanEnd());
  ASSERT_TRUE(m.AcceptSpecial(3));
  EXPECT_TRUE(m.Finished());
  Matcher t(g);
  EXPECT_TRUE(t.AcceptSpecial(4) && t.AcceptByte('t') && t.Finished());
}

TEST(GbnfParse, LayoutCommentsAndEmptyAlternatives) {
  auto g = MustParse(
      "# a comment\n"
      "root ::=\n"
      "  item (\n"
      "    \",\" item  # inside parentheses a newline continues the rule\n"
      "  )* |\n"
      "  \"\"\n"
      "\r\n"
      "item ::= [0-9]+ | # empty alternative follows\n"
      "\n");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(g, "1,22,,3"));
  EXPECT_TRUE(Matches(g, ""));
  EXPECT_FALSE(Matches(g, "1;2"));
}

TEST(GbnfParse, RightRecursionIsAccepted) {
  auto g = MustParse("root ::= \"(\" root \")\" | \"x\"\nlist ::= \"a\" list | \"\"\n");
  EXPECT_TRUE(Matches(g, "(((x)))"));
  EXPECT_FALSE(Matches(g, "((x)"));
}

struct Refusal {
  const char* name;
  std::string grammar;
  std::string message;
};

class GbnfRefusal : public ::testing::TestWithParam<Refusal> {};

TEST_P(GbnfRefusal, ExactMessage) {
  const Refusal& r = GetParam();
  auto g = Grammar::Parse(r.grammar, kSpecials, "test.gbnf");
  ASSERT_FALSE(g.ok()) << r.grammar;
  EXPECT_EQ(g.status().code(), Code::kInvalid);
  EXPECT_EQ(g.status().message(), r.message);
}

INSTANTIATE_TEST_SUITE_P(
    Grammar, GbnfRefusal,
    ::testing::Values(
        Refusal{"UndefinedRule", "root ::= \"a\" foo\n", "test.gbnf:1:14: undefined rule \"foo\""},
        Refusal{"DirectLeftRecursion",
                "root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]\n",
                "test.gbnf:2:1: left recursion: rule \"expr\" can reach itself before matching "
                "any input (expr -> expr)"},
        Refusal{"LeftRecursionThroughNullable", "root ::= a\na ::= b \"x\"\nb ::= \"c\"? a\n",
                "test.gbnf:2:1: left recursion: rule \"a\" can reach itself before matching any "
                "input (a -> b -> a)"},
        Refusal{"RepetitionOfNullable", "root ::= (\"a\"?)*\n",
                "test.gbnf:1:16: left recursion: this repetition repeats something that can "
                "match the empty string"},
        Refusal{"UnknownSpecial", "root ::= <|foo|>\n",
                "test.gbnf:1:10: unknown special token \"<|foo|>\""},
        Refusal{"UnknownBracketSpecial", "root ::= <[BOS]>\n",
                "test.gbnf:1:10: unknown special token \"[BOS]\""},
        Refusal{
            "TokenId", "root ::= <[123]>\n",
            "test.gbnf:1:10: token ids such as <[123]> are not accepted: name the special token"},
        Refusal{"NegatedSpecial", "root ::= !<|open|>\n",
                "test.gbnf:1:10: negated special tokens (!<...>) are not supported"},
        Refusal{"BadEscape", "root ::= \"\\q\"\n",
                "test.gbnf:1:11: bad escape \"\\q\" (known: \\n \\r \\t \\\\ \\\" \\[ \\] \\xHH "
                "\\uHHHH \\UHHHHHHHH)"},
        Refusal{"ShortHexEscape", "root ::= \"\\x4\"\n",
                "test.gbnf:1:11: bad escape: \\x needs 2 hex digits"},
        Refusal{"SurrogateEscape", "root ::= \"\\uD800\"\n",
                "test.gbnf:1:11: bad escape: a surrogate (U+D800..U+DFFF) is not a character"},
        Refusal{"EscapeAboveUnicode", "root ::= [\\U00110000]\n",
                "test.gbnf:1:11: bad escape: code point above U+10FFFF"},
        Refusal{"EmptyGrammar", "", "test.gbnf:1:1: empty grammar: no rules"},
        Refusal{"OnlyComments", "# nothing\n\n  # here\n",
                "test.gbnf:1:1: empty grammar: no rules"},
        Refusal{"NoRoot", "item ::= \"x\"\n",
                "test.gbnf:1:1: no rule named \"root\" (the start rule)"},
        Refusal{"DefinedTwice", "root ::= \"a\"\nroot ::= \"b\"\n",
                "test.gbnf:2:1: rule \"root\" is defined twice (first at test.gbnf:1:1)"},
        Refusal{"MissingDefinitionSign", "root = \"a\"\n",
                "test.gbnf:1:6: expected \"::=\" after the rule name \"root\""},
        Refusal{"UnterminatedLiteral", "root ::= \"abc\n",
                "test.gbnf:1:10: unterminated string literal"},
        Refusal{"UnterminatedClass", "root ::= [abc",
                "test.gbnf:1:10: unterminated character class"},
        Refusal{"ReversedRange", "root ::= [z-a]\n",
                "test.gbnf:1:11: reversed range \"z-a\" in a character class"},
        Refusal{"EmptyClass", "root ::= []\n", "test.gbnf:1:10: empty character class"},
        Refusal{"RepetitionMaxBelowMin", "root ::= \"a\"{3,2}\n",
                "test.gbnf:1:13: bad repetition {3,2}: the maximum is below the minimum"},
        Refusal{"RepetitionTooLarge", "root ::= \"a\"{10001}\n",
                "test.gbnf:1:14: repetition bound above the limit 10000"},
        Refusal{"RepetitionWithoutItem", "root ::= *\n",
                "test.gbnf:1:10: repetition '*' with nothing before it"},
        Refusal{"UnclosedGroup", "root ::= (\"a\"\n",
                "test.gbnf:2:1: expected \")\" to close the \"(\" at test.gbnf:1:10, found the "
                "end of the grammar"},
        Refusal{"StrayParenthesis", "root ::= \"a\" )\n", "test.gbnf:1:14: unexpected ')'"},
        Refusal{"ContinuationWithoutNewlineRule", "root ::= \"a\"\n  \"b\"\n",
                "test.gbnf:2:3: expected a rule name, found '\"'"},
        Refusal{"InvalidUtf8", "root ::= \"\xFF\"\n",
                "test.gbnf:1:11: invalid UTF-8 in the grammar text"}),
    [](const ::testing::TestParamInfo<Refusal>& param_info) {
      return std::string(param_info.param.name);
    });

TEST(GbnfParse, DuplicateSpecialNamesRefused) {
  auto g = Grammar::Parse("root ::= \"a\"\n", {"<|a|>", "<|a|>"}, "test.gbnf");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().message(),
            "test.gbnf: special token \"<|a|>\" is listed twice (symbols 0 and 1)");
}

TEST(GbnfParse, LeftRecursionIsRefusedQuicklyNotLooped) {
  // Mutual left recursion through a long chain of nullable prefixes: refused, never expanded.
  std::string text = "root ::= r0\n";
  for (int i = 0; i < 200; ++i) {
    text += 'r';
    text += std::to_string(i);
    text += " ::= \"x\"? r";
    text += std::to_string((i + 1) % 200);
    text += " \"y\"\n";
  }
  auto g = Grammar::Parse(text, {}, "chain.gbnf");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("left recursion: rule \"r0\""), std::string::npos)
      << g.status().message();
}

TEST(GbnfParse, SizeBoundsAreMessagesNotCrashes) {
  // Nesting: 1000 levels of parentheses parse, 1001 are refused.
  auto nested = [](int levels) {
    std::string text = "root ::= ";
    text.append(static_cast<size_t>(levels), '(');
    text += "\"x\"";
    text.append(static_cast<size_t>(levels), ')');
    text += '\n';
    return text;
  };
  EXPECT_TRUE(Grammar::Parse(nested(1000), {}, "deep.gbnf").ok());
  auto deep = Grammar::Parse(nested(1001), {}, "deep.gbnf");
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.status().message(), "deep.gbnf:1:1010: parentheses nested deeper than 1000");
  // A chain of rules each starting with the next: checked and expanded without recursion as
  // deep as the chain. Its closures grow with the square of the depth: 2,000 is fine, 50,000
  // is refused with a message.
  auto chain = [](int n) {
    std::string text;
    for (int i = 0; i < n; ++i) {
      if (i == 0) {
        text += "root";
      } else {
        text += 'r';
        text += std::to_string(i);
      }
      text += " ::= r";
      text += std::to_string(i + 1);
      text += " \"a\"\n";
    }
    text += 'r';
    text += std::to_string(n);
    text += " ::= \"z\"\n";
    return text;
  };
  auto g = Grammar::Parse(chain(2000), {}, "chain.gbnf");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  Matcher m(*g);
  EXPECT_TRUE(m.AcceptBytes("z" + std::string(2000, 'a')) && m.Finished());
  auto huge = Grammar::Parse(chain(50000), {}, "chain.gbnf");
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find(": grammar too large: expanding the references"),
            std::string::npos)
      << huge.status().message();
}

TEST(GbnfParse, DeeplyNestedInputCloses) {
  auto g = MustParse("root ::= \"(\" root \")\" ws | \"x\"\nws ::= \" \"?\n");
  Matcher m(g);
  const int depth = 10000;
  ASSERT_TRUE(m.AcceptBytes(std::string(depth, '(') + "x"));
  ASSERT_TRUE(m.AcceptBytes(std::string(depth, ')')));
  EXPECT_TRUE(m.CanEnd());  // every level's "ws" may be empty: the stack unwinds to the end
}

}  // namespace
}  // namespace k3::run::grammar
