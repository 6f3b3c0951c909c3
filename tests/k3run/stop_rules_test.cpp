// The stop rules (k3run/engine/stop_rules.h): stop strings across token boundaries, held-back
// text, and the end tokens found by content in the tiny model's tokenizer.
#include "k3run/engine/stop_rules.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "k3run/engine/session.h"
#include "tests/k3run/engine_fixture.h"

namespace k3::run {
namespace {

// Pushes each piece and concatenates what is shown, then the flush.
std::string Shown(StopText* st, const std::vector<std::string>& pieces) {
  std::string out;
  for (const std::string& p : pieces) out += st->Push(p);
  return out + st->Flush();
}

TEST(StopText, NoStopStringsShowsEverythingAtOnce) {
  StopText st({});
  EXPECT_EQ(st.Push("abc"), "abc");
  EXPECT_FALSE(st.stopped());
}

TEST(StopText, MatchAcrossTokenBoundariesIsNotShown) {
  StopText st({"END"});
  EXPECT_EQ(st.Push("hello E"), "hello ");  // "E" may begin END: held back
  EXPECT_EQ(st.Push("N"), "");
  EXPECT_EQ(st.Push("D and more"), "");
  EXPECT_TRUE(st.stopped());
  EXPECT_EQ(st.matched(), "END");
  EXPECT_EQ(st.Flush(), "");
  EXPECT_EQ(st.Push("x"), "");  // nothing after a match
}

TEST(StopText, TextAfterTheMatchInTheSameTokenIsDropped) {
  StopText st({"\n\n"});
  EXPECT_EQ(Shown(&st, {"one\n", "\ntwo"}), "one");
  EXPECT_TRUE(st.stopped());
}

TEST(StopText, HeldBackTextThatTurnsOutNotToMatchIsShown) {
  StopText st({"END"});
  EXPECT_EQ(st.Push("xEN"), "x");
  EXPECT_EQ(st.Push("Z"), "ENZ");
  EXPECT_FALSE(st.stopped());
  StopText tail({"END"});
  EXPECT_EQ(Shown(&tail, {"abc", "EN"}), "abcEN");  // the flush at the end shows it
  EXPECT_FALSE(tail.stopped());
}

TEST(StopText, EarliestOfSeveralStopStringsWins) {
  StopText st({"cd", "bcx", "b"});
  EXPECT_EQ(Shown(&st, {"a", "bcd"}), "a");
  EXPECT_EQ(st.matched(), "b");
}

TEST(StopText, EmptyStopStringIsIgnored) {
  StopText st({""});
  EXPECT_EQ(Shown(&st, {"abc"}), "abc");
  EXPECT_FALSE(st.stopped());
}

TEST(StopText, OverlappingPrefixIsFound) {
  // "aab" inside "aaab": the held-back suffix must be the longest one.
  StopText st({"aab"});
  EXPECT_EQ(Shown(&st, {"a", "a", "a", "b"}), "a");
  EXPECT_TRUE(st.stopped());
}

TEST(StopRules, EndTokensAreFoundByContent) {
  Result<std::unique_ptr<Engine>> e = Engine::Open(Env::Default(), testing::TinyPreparedDir());
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const tok::Tokenizer* t = (*e)->tokenizer();
  ASSERT_NE(t, nullptr);
  const std::vector<int64_t> ids = EndTokenIds(t);
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(t->TokenBytes(static_cast<int32_t>(ids[0])), "[EOS]");
  EXPECT_EQ(t->TokenBytes(static_cast<int32_t>(ids[1])), "<|end_of_msg|>");
  EXPECT_TRUE(tok::IsAddedToken(*t, static_cast<int32_t>(ids[0])));
  EXPECT_FALSE(tok::IsAddedToken(*t, 65));  // a byte-level rank
  EXPECT_TRUE(EndTokenIds(nullptr).empty());
}

}  // namespace
}  // namespace k3::run
