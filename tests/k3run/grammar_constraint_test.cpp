// The engine's grammar constraint (k3run/engine/grammar_constraint.h, token_choice.h) on the
// tiny synth tokenizer: the vocabulary the grammar sees, the choice under a mask (greedy takes
// the best allowed id, exactly the argmax of the masked logits), end tokens once complete, a
// dead end as an error, and a grammar compiled once per text.
#include "k3run/engine/grammar_constraint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "k3run/engine/generate.h"
#include "k3run/engine/stop_rules.h"
#include "k3run/engine/token_choice.h"
#include "tests/k3run/engine_fixture.h"

namespace k3::run::testing {
namespace {

const tok::Tokenizer& Tok() { return TinyTokenizer(); }

std::vector<float> RandomLogits(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 3.f);
  std::vector<float> v(1280);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(GrammarConstraint, VocabularyNamesAddedTokensByContentAndEndIdsAsEnds) {
  const std::vector<int64_t> ends = EndTokenIds(&Tok());
  const GrammarVocabulary v = MakeGrammarVocabulary(Tok(), ends);
  ASSERT_EQ(v.vocab->bytes.size(), 1280u);
  const int32_t open = Tok().SpecialId("<|open|>").value();
  const int32_t sym = v.vocab->special_symbol[static_cast<size_t>(open)];
  ASSERT_GE(sym, 0);
  EXPECT_EQ(v.special_names[static_cast<size_t>(sym)], "<|open|>");
  for (int64_t e : ends) EXPECT_EQ(v.vocab->special_symbol[static_cast<size_t>(e)], grammar::kEndToken);
  EXPECT_EQ(v.vocab->special_symbol[97], grammar::kOrdinaryToken);  // the byte 'a'
  EXPECT_EQ(v.vocab->bytes[97], "a");
}

// A sequence under `gbnf`: choose `steps` tokens greedily from random logits, checking each
// choice against the argmax of the logits masked by a brute-force allowed set.
TEST(GrammarConstraint, GreedyTakesTheBestAllowedIdAndEndsWhenComplete) {
  GrammarLibrary lib(MakeGrammarVocabulary(Tok(), EndTokenIds(&Tok())));
  const std::string gbnf = "root ::= (\"yes\" | \"no\") \" \" [0-9]{1,3}\n";
  std::unique_ptr<run::Engine> engine = OpenPlanned(TinyPreparedDir(), ContextPlan(64));
  ASSERT_NE(engine, nullptr);
  for (uint32_t run = 0; run < 20; ++run) {
    std::unique_ptr<Sequence> seq = engine->NewSequence();
    Result<std::shared_ptr<TokenConstraint>> c = MakeGrammarConstraint(&lib, gbnf, "test");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    seq->constraint() = c.value();
    Result<std::shared_ptr<const CompiledGrammar>> compiled = lib.Compile(gbnf, "test");
    ASSERT_TRUE(compiled.ok());
    grammar::Matcher shadow(compiled.value()->grammar);
    std::string text;
    bool ended = false;
    for (int step = 0; step < 12 && !ended; ++step) {
      const std::vector<float> logits = RandomLogits(run * 100 + static_cast<uint32_t>(step));
      std::vector<float> masked = logits;
      const int64_t allowed = compiled.value()->masker->Apply(shadow, masked.data(), 1280);
      ASSERT_GT(allowed, 0);
      Result<int32_t> id = ChooseToken(seq.get(), logits.data(), 1280, {});
      ASSERT_TRUE(id.ok()) << id.status().ToString();
      EXPECT_EQ(*id, Greedy(masked.data(), 1280));
      ASSERT_TRUE(std::isfinite(masked[static_cast<size_t>(*id)]));
      ASSERT_TRUE(shadow.AcceptToken(*compiled.value()->vocab, *id));
      const int32_t sym = compiled.value()->vocab->special_symbol[static_cast<size_t>(*id)];
      ended = sym == grammar::kEndToken;
      if (!ended) text += Tok().TokenBytes(*id);
    }
    ASSERT_TRUE(ended) << text;
    EXPECT_TRUE(text.rfind("yes ", 0) == 0 || text.rfind("no ", 0) == 0) << text;
  }
}

TEST(GrammarConstraint, ACompleteGrammarWithoutEndTokensIsADeadEnd) {
  GrammarLibrary lib(MakeGrammarVocabulary(Tok(), {}));  // no end ids
  Result<std::shared_ptr<TokenConstraint>> c = MakeGrammarConstraint(&lib, "root ::= \"a\"\n", "g");
  ASSERT_TRUE(c.ok());
  std::vector<float> logits = RandomLogits(1);
  Result<const float*> m = c.value()->Mask(logits.data(), 1280);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(Greedy(m.value(), 1280), 97);  // 'a' is the only id
  ASSERT_TRUE(c.value()->Accept(97).ok());
  const Result<const float*> dead = c.value()->Mask(logits.data(), 1280);
  EXPECT_EQ(dead.status().code(), Code::kInvalid);
  EXPECT_NE(dead.status().message().find("allows no token"), std::string::npos);
  EXPECT_EQ(c.value()->Accept(98).code(), Code::kInvalid);  // not allowed
}

TEST(GrammarConstraint, LibraryCompilesEachTextOnceAndNamesBadGrammars) {
  GrammarLibrary lib(MakeGrammarVocabulary(Tok(), {}));
  Result<std::shared_ptr<const CompiledGrammar>> a = lib.Compile("root ::= \"x\"\n", "g");
  Result<std::shared_ptr<const CompiledGrammar>> b = lib.Compile("root ::= \"x\"\n", "g");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a.value().get(), b.value().get());
  const Status bad = lib.Compile("root ::= nowhere\n", "--grammar g.gbnf").status();
  EXPECT_EQ(bad.code(), Code::kInvalid);
  EXPECT_NE(bad.message().find("--grammar g.gbnf"), std::string::npos) << bad.message();
}

}  // namespace
}  // namespace k3::run::testing
