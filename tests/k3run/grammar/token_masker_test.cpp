// TokenMasker against the definition: for each id, a copy of the Matcher AcceptBytes its bytes
// (specials: AcceptSpecial; end ids: CanEnd). Random vocabularies with 0xFF bytes, partial
// UTF-8 and multi-byte tokens, many states per grammar; masks must be bit-identical, cold or
// from the cache, from any thread.
#include "k3run/grammar/token_masker.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "grammar_walk.h"
#include "k3run/grammar/grammar.h"
#include "k3run/grammar/json_schema.h"
#include "k3run/grammar/matcher.h"

namespace k3::run::grammar {
namespace {

const std::vector<std::string> kXtml = {"<|open|>", "<|close|>", "<|sep|>"};

std::shared_ptr<const Grammar> MustParse(const std::string& text) {
  auto g = Grammar::Parse(text, kXtml, "test.gbnf");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? *g : nullptr;
}

std::vector<uint64_t> BruteForce(const Matcher& m, const Vocabulary& v) {
  std::vector<uint64_t> bits((v.bytes.size() + 63) / 64, 0);
  for (size_t id = 0; id < v.bytes.size(); ++id) {
    Matcher copy = m;
    if (copy.AcceptToken(v, static_cast<int32_t>(id))) bits[id / 64] |= uint64_t{1} << (id % 64);
  }
  return bits;
}

int64_t Count(const std::vector<uint64_t>& bits) {
  int64_t n = 0;
  for (const uint64_t w : bits) n += __builtin_popcountll(w);
  return n;
}

// States along seeded random walks whose choices come from the brute-force mask (so a masker
// bug cannot steer the states it is checked on).
std::vector<Matcher> States(const std::shared_ptr<const Grammar>& g, const Vocabulary& v, int walks,
                            int steps, uint64_t seed) {
  std::vector<Matcher> states;
  std::mt19937_64 rng(seed);
  for (int w = 0; w < walks; ++w) {
    Matcher m(g);
    for (int s = 0; s < steps; ++s) {
      states.push_back(m);
      const std::vector<uint64_t> bits = BruteForce(m, v);
      std::vector<int32_t> ids;
      for (size_t id = 0; id < v.bytes.size(); ++id) {
        if (((bits[id / 64] >> (id % 64)) & 1) && v.special_symbol[id] != kEndToken) {
          ids.push_back(static_cast<int32_t>(id));
        }
      }
      if (ids.empty()) break;
      // Prefer short tokens now and then, so walks reach deep states, not only long strings.
      const int32_t id = ids[rng() % ids.size()];
      EXPECT_TRUE(m.AcceptToken(v, id));
    }
  }
  return states;
}

void ExpectMasksMatchBruteForce(const std::shared_ptr<const Grammar>& g, uint64_t seed) {
  test::SyntheticVocabularyOptions o;
  o.seed = seed;
  o.random_tokens = 1500;
  o.max_length = 16;
  auto vocab = test::SyntheticVocabulary(o);
  TokenMasker masker(g, vocab);
  TokenMasker shared_trie(g, vocab, TokenTrie::ForVocabulary(*vocab), 0);
  const std::vector<Matcher> states = States(g, *vocab, 6, 30, seed);
  ASSERT_GE(states.size(), 60u);
  std::vector<uint64_t> cold, cached;
  int64_t some_allowed = 0;
  for (size_t i = 0; i < states.size(); ++i) {
    const std::vector<uint64_t> want = BruteForce(states[i], *vocab);
    masker.ComputeAllowed(states[i], &cold);
    ASSERT_EQ(cold, want) << "state " << i;
    masker.Allowed(states[i], &cached);
    ASSERT_EQ(cached, want) << "state " << i << " (cached)";
    shared_trie.Allowed(states[i], &cached);
    ASSERT_EQ(cached, want) << "state " << i << " (shared trie, no cache)";
    some_allowed += Count(want) > 1;
  }
  EXPECT_GT(some_allowed, static_cast<int64_t>(states.size() / 4));  // not only forced steps
  // Second pass: every state is now a cache hit and still bit-identical.
  const MaskCache::Stats before = masker.cache_stats();
  for (const Matcher& m : states) {
    masker.Allowed(m, &cached);
    masker.ComputeAllowed(m, &cold);
    ASSERT_EQ(cached, cold);
  }
  EXPECT_EQ(masker.cache_stats().hits - before.hits, static_cast<int64_t>(states.size()));
}

TEST(TokenMasker, MatchesBruteForceOnJsonGrammar) {
  auto g = MustParse(
      "root ::= value\n"
      "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
      "object ::= \"{\" (string \":\" \" \"? value (\",\" \" \"? string \":\" \" \"? value)*)? "
      "\"}\"\n"
      "array ::= \"[\" (value (\",\" \" \"? value)*)? \"]\"\n"
      "string ::= \"\\\"\" ([^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" "
      "[0-9a-fA-F]{4}))* \"\\\"\"\n"
      "number ::= \"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)?\n");
  ExpectMasksMatchBruteForce(g, 11);
}

TEST(TokenMasker, MatchesBruteForceOnUtf8Classes) {
  auto g = MustParse(
      "root ::= (word \" \")* [\\U0001F600-\\U0001F64F]? end\n"
      "word ::= [a-zA-Z\\u00E0-\\u00FF\\u0370-\\u03FF]+ | [\\u4E00-\\u4FFF]{1,3} | [^\\x00-\\x7F]\n"
      "end ::= \".\" | \"!\" | \"\\u3002\"\n");
  ExpectMasksMatchBruteForce(g, 12);
}

TEST(TokenMasker, MatchesBruteForceOnXtmlArguments) {
  const auto schema = nlohmann::json::parse(R"({
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                   "units": {"enum": ["metric", "imperial", 3]},
                   "extra": {"anyOf": [{"type": "null"}, {"type": "array", "items": {"type": "boolean"}}]}},
    "required": ["city"],
    "additionalProperties": true})");
  auto text = JsonSchemaToGbnf(schema, SchemaForm::kXtmlArguments);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  ExpectMasksMatchBruteForce(MustParse(*text), 13);
}

TEST(TokenMasker, SpecialAndEndIds) {
  auto g = MustParse("root ::= \"a\" <|sep|>?\n");
  auto v = std::make_shared<Vocabulary>();
  v->bytes = {"a", "", "", "", "", "aa"};
  v->special_symbol = {kOrdinaryToken, 2, 0, kNeverToken, kEndToken, kOrdinaryToken};
  TokenMasker masker(g, v);
  std::vector<uint64_t> bits;
  Matcher m(g);
  masker.Allowed(m, &bits);
  EXPECT_EQ(bits, std::vector<uint64_t>{0b000001});
  ASSERT_TRUE(m.AcceptByte('a'));
  masker.Allowed(m, &bits);
  EXPECT_EQ(bits, std::vector<uint64_t>{0b010010});  // <|sep|> or the end
  ASSERT_TRUE(m.AcceptSpecial(2));
  masker.Allowed(m, &bits);
  EXPECT_EQ(bits, std::vector<uint64_t>{0b010000});
}

TEST(TokenMasker, ApplyMasksLogits) {
  auto g = MustParse("root ::= [ab]+\n");
  auto v = std::make_shared<Vocabulary>();
  v->bytes = {"a", "b", "c", "ab", "ac", ""};
  v->special_symbol = {kOrdinaryToken, kOrdinaryToken, kOrdinaryToken,
                       kOrdinaryToken, kOrdinaryToken, kEndToken};
  TokenMasker masker(g, v);
  std::vector<float> logits = {1, 2, 3, 4, 5, 6, 7, 8};  // two ids past the vocabulary
  Matcher m(g);
  EXPECT_EQ(masker.Apply(m, logits.data(), 8), 3);
  const float inf = -INFINITY;
  EXPECT_EQ(logits, (std::vector<float>{1, 2, inf, 4, inf, inf, inf, inf}));
  ASSERT_TRUE(m.AcceptByte('a'));
  std::vector<float> more(6, 0.5f);
  EXPECT_EQ(masker.Apply(m, more.data(), 6), 4);  // the end id too
  EXPECT_EQ(more, (std::vector<float>{0.5f, 0.5f, inf, 0.5f, inf, 0.5f}));
}

TEST(TokenMasker, SameMaskFromEveryThread) {
  auto g = MustParse(
      "root ::= \"{\" (\"\\\"\" [a-z\\u00E9]* \"\\\":\" [0-9]+ (\",\" \"\\\"\" [a-z]* \"\\\":\" "
      "[0-9]+)*)? \"}\"\n");
  test::SyntheticVocabularyOptions o;
  o.seed = 5;
  auto vocab = test::SyntheticVocabulary(o);
  auto masker =
      std::make_shared<TokenMasker>(g, vocab, size_t{64} << 10);  // a small cache: evictions
  const std::vector<Matcher> states = States(g, *vocab, 3, 25, 5);
  std::vector<std::vector<uint64_t>> want(states.size());
  for (size_t i = 0; i < states.size(); ++i) masker->ComputeAllowed(states[i], &want[i]);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint64_t> got;
      for (int round = 0; round < 3; ++round) {
        for (size_t k = 0; k < states.size(); ++k) {
          const size_t i = (k * 7 + static_cast<size_t>(t) * 13) % states.size();
          masker->Allowed(states[i], &got);
          mismatches[static_cast<size_t>(t)] += got != want[i];
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
  EXPECT_LE(masker->cache_stats().bytes, size_t{64} << 10);
}

TEST(TokenMasker, CheckVocabulary) {
  auto g = MustParse("root ::= \"a\"\n");
  Vocabulary ok{{"a", ""}, {kOrdinaryToken, 1}};
  EXPECT_TRUE(CheckVocabulary(ok, *g).ok());
  Vocabulary sizes{{"a", ""}, {kOrdinaryToken}};
  EXPECT_EQ(CheckVocabulary(sizes, *g).message(),
            "grammar vocabulary: 2 byte strings but 1 special_symbol entries");
  Vocabulary symbol{{"a", ""}, {kOrdinaryToken, 3}};
  EXPECT_EQ(CheckVocabulary(symbol, *g).message(),
            "grammar vocabulary: token 1 has symbol 3; the grammar has 3 special tokens");
}

}  // namespace
}  // namespace k3::run::grammar
