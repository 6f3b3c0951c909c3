// Matcher: byte-by-byte and split inputs reach the same state; failed steps change nothing;
// CanEnd and Finished; state keys are canonical.
#include "k3run/grammar/matcher.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "k3run/grammar/grammar.h"
#include "k3run/grammar/token_masker.h"

namespace k3::run::grammar {
namespace {

std::shared_ptr<const Grammar> MustParse(const std::string& text,
                                         const std::vector<std::string>& specials = {}) {
  auto g = Grammar::Parse(text, specials, "test.gbnf");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? *g : nullptr;
}

const char* kJson =
    "root ::= value\n"
    "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object ::= \"{\" (member (\",\" \" \"? member)*)? \"}\"\n"
    "member ::= string \":\" \" \"? value\n"
    "array ::= \"[\" (value (\",\" \" \"? value)*)? \"]\"\n"
    "string ::= \"\\\"\" ([^\"\\\\\\x00-\\x1F] | \"\\\\\" [\"\\\\/bfnrtu])* \"\\\"\"\n"
    "number ::= \"-\"? ([0-9] | [1-9] [0-9]+) (\".\" [0-9]+)?\n";

TEST(Matcher, SplitsReachTheSameState) {
  auto g = MustParse(kJson);
  const std::string text = "{\"k\xC3\xA9y\": [1, -2.5, {\"a\":\"\xE2\x82\xAC\\n\"}], \"b\":true}";
  Matcher whole(g);
  ASSERT_TRUE(whole.AcceptBytes(text));
  ASSERT_TRUE(whole.CanEnd());
  Matcher bytewise(g);
  for (const char c : text) ASSERT_TRUE(bytewise.AcceptByte(static_cast<uint8_t>(c)));
  EXPECT_EQ(bytewise.StateKey(), whole.StateKey());
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    Matcher m(g);
    size_t at = 0;
    while (at < text.size()) {
      const size_t n = std::min(text.size() - at, size_t{1} + rng() % 6);
      ASSERT_TRUE(m.AcceptBytes(std::string_view(text).substr(at, n))) << trial << " at " << at;
      at += n;
    }
    EXPECT_EQ(m.StateKey(), whole.StateKey());
    EXPECT_TRUE(m.CanEnd());
  }
}

TEST(Matcher, FailedStepsLeaveTheStateUnchanged) {
  auto g = MustParse(kJson);
  Matcher m(g);
  ASSERT_TRUE(m.AcceptBytes("{\"a\":"));
  const std::string before = m.StateKey();
  EXPECT_FALSE(m.AcceptByte('}'));
  EXPECT_EQ(m.StateKey(), before);
  EXPECT_FALSE(m.AcceptBytes("12x"));  // "12" would be fine: all or nothing
  EXPECT_EQ(m.StateKey(), before);
  EXPECT_FALSE(m.AcceptSpecial(0));
  EXPECT_EQ(m.StateKey(), before);
  EXPECT_TRUE(m.AcceptBytes("12}"));
  EXPECT_TRUE(m.CanEnd());
}

TEST(Matcher, CanEndAndFinished) {
  auto g = MustParse("root ::= \"a\" \"b\"?\n");
  Matcher m(g);
  EXPECT_FALSE(m.CanEnd());
  EXPECT_FALSE(m.Finished());
  ASSERT_TRUE(m.AcceptByte('a'));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_FALSE(m.Finished());  // "b" may still follow
  ASSERT_TRUE(m.AcceptByte('b'));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_TRUE(m.Finished());
  EXPECT_FALSE(m.AcceptByte('b'));

  auto star = MustParse("root ::= \"a\"*\n");
  Matcher s(star);
  EXPECT_TRUE(s.CanEnd());
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(s.AcceptByte('a'));
  EXPECT_TRUE(s.CanEnd());
  EXPECT_FALSE(s.Finished());
}

TEST(Matcher, StateKeysAreCanonical) {
  auto g = MustParse("root ::= (\"a\" | \"b\") \"c\" | \"a\" \"d\"\n");
  Matcher a(g), b(g), start(g);
  ASSERT_TRUE(a.AcceptByte('a'));
  ASSERT_TRUE(b.AcceptByte('b'));
  EXPECT_NE(a.StateKey(), b.StateKey());  // after a, "d" may follow; after b, only "c"
  EXPECT_NE(a.StateKey(), start.StateKey());
  ASSERT_TRUE(a.AcceptByte('c'));
  ASSERT_TRUE(b.AcceptByte('c'));
  EXPECT_EQ(a.StateKey(), b.StateKey());

  // Inside a JSON string every ordinary character returns to the same state.
  auto json = MustParse(kJson);
  Matcher s(json);
  ASSERT_TRUE(s.AcceptBytes("[\"x"));
  const std::string key = s.StateKey();
  ASSERT_TRUE(s.AcceptBytes("yz \xE4\xB8\x80"));
  EXPECT_EQ(s.StateKey(), key);
}

TEST(Matcher, AcceptToken) {
  auto g = MustParse("root ::= \"ab\" <|x|>\n", {"<|x|>"});
  Vocabulary v;
  v.bytes = {"a", "ab", "", "", "", ""};
  v.special_symbol = {kOrdinaryToken, kOrdinaryToken, 0, kNeverToken, kEndToken, kOrdinaryToken};
  Matcher m(g);
  EXPECT_FALSE(m.AcceptToken(v, 5));   // an empty ordinary token
  EXPECT_FALSE(m.AcceptToken(v, 3));   // a special the grammar cannot name
  EXPECT_FALSE(m.AcceptToken(v, 4));   // end: not complete yet
  EXPECT_FALSE(m.AcceptToken(v, 99));  // out of range
  ASSERT_TRUE(m.AcceptToken(v, 1));
  ASSERT_TRUE(m.AcceptToken(v, 2));
  EXPECT_TRUE(m.AcceptToken(v, 4));
  EXPECT_TRUE(m.Finished());
}

TEST(Matcher, AmbiguousGrammarKeepsStacksDeduplicated) {
  // Every split of "aaaa" into a and aa is a parse; the stacks stay few.
  auto g = MustParse("root ::= (\"a\" | \"aa\")* \"b\"\n");
  Matcher m(g);
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(m.AcceptByte('a'));
  EXPECT_LE(m.stacks().size(), 4u);
  EXPECT_TRUE(m.AcceptByte('b'));
  EXPECT_TRUE(m.Finished());
}

}  // namespace
}  // namespace k3::run::grammar
