// Test support for k3run/grammar: synthetic vocabularies and seeded random walks through a
// grammar (a stand-in for a model choosing among the allowed tokens), shared by the tests and
// the mask benchmark.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "k3run/grammar/grammar.h"
#include "k3run/grammar/matcher.h"
#include "k3run/grammar/token_masker.h"

namespace k3::run::grammar::test {

struct SyntheticVocabularyOptions {
  int64_t random_tokens = 2000;  // after the 256 single bytes and the structural tokens
  int min_length = 2;
  int max_length = 12;
  uint64_t seed = 1;
  // Special ids appended after the ordinary ones: one per grammar special (symbol i), then
  // `unnamed_specials` ids the grammar cannot name, then one end id (kEndToken).
  int grammar_specials = 3;
  int unnamed_specials = 4;
  bool structural_tokens = true;  // {" ": ", "} [ ] true null ... (JSON-shaped tokens)
};

// 256 single bytes (ids 0..255), structural tokens, random strings mixing ASCII words,
// punctuation, digits, spaces, UTF-8 characters, truncated (partial) UTF-8 and bytes that never
// occur in UTF-8 (0xFF, 0xC0), then the special ids.
std::shared_ptr<Vocabulary> SyntheticVocabulary(const SyntheticVocabularyOptions& options);

// One piece of a walk's output: bytes (symbol -1) or one special symbol.
struct Piece {
  int symbol = -1;
  std::string bytes;
};

struct WalkOptions {
  uint64_t seed = 1;
  // After this many output bytes the walk prefers, in turn: an end id, the closing specials
  // `closing_symbols`, a single " ] or }, other single-byte punctuation, any single byte.
  int soft_length = 80;
  int max_tokens = 4000;
  std::vector<int> closing_symbols;
};

struct WalkResult {
  bool finished = false;        // chose an end id
  std::string failure;          // set when the mask and the matcher disagreed or a dead end
  std::vector<int32_t> ids;     // chosen ids, the end id included
  std::vector<Piece> pieces;    // bytes merged, specials separate
  std::string bytes;            // all ordinary bytes, specials left out
  std::vector<Matcher> states;  // the state before each choice (only if keep_states)
};

WalkResult RandomWalk(const TokenMasker& masker, const Vocabulary& vocab,
                      std::shared_ptr<const Grammar> grammar, const WalkOptions& options,
                      bool keep_states = false);

}  // namespace k3::run::grammar::test
