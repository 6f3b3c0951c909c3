// The TokenConstraint of a grammar (k3run/grammar/): a Matcher advanced by each chosen id and a
// TokenMasker that masks the logits before the choice (token_choice.h). Used for --grammar,
// --json-schema, response_format and forced tool calls.
//
// Masks are pure functions of the grammar state (token_masker.h), so constrained output is a
// deterministic function of the request, whatever else shares its passes. After each Accept the
// next mask is computed on a thread of its own while the next pass runs, so a constrained
// sequence adds no time between passes for the others (and little for itself).
// GrammarLibrary keeps compiled grammars and their maskers (with their mask caches) by grammar
// text, so requests with the same schema share the work.
// Thread safety: a GrammarConstraint belongs to one sequence; GrammarLibrary is thread-safe.
#pragma once

#include <cstdint>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "k3run/engine/token_constraint.h"
#include "k3run/grammar/matcher.h"
#include "k3run/grammar/token_masker.h"
#include "k3run/text/tokenizer.h"

namespace k3::run {

// A tokenizer's vocabulary as the grammar sees it: every added token is a special symbol named
// by its content ("<|open|>", "[EOS]"), except `end_ids`, which become end tokens (allowed once
// the grammar is complete: a grammar over plain text, --json-schema after a raw prompt).
struct GrammarVocabulary {
  std::vector<std::string> special_names;
  std::shared_ptr<const grammar::Vocabulary> vocab;
  std::shared_ptr<const grammar::TokenTrie> trie;  // of vocab's ordinary tokens, shared
};
GrammarVocabulary MakeGrammarVocabulary(const tok::Tokenizer& tok,
                                        const std::vector<int64_t>& end_ids);

// A grammar compiled for a vocabulary: what every sequence constrained by it shares.
struct CompiledGrammar {
  std::shared_ptr<const grammar::Grammar> grammar;
  std::shared_ptr<const grammar::Vocabulary> vocab;
  std::shared_ptr<const grammar::TokenMasker> masker;
};

class GrammarLibrary {
 public:
  explicit GrammarLibrary(GrammarVocabulary v, size_t max_grammars = 32)
      : vocab_(std::move(v)), max_(max_grammars) {}
  // `gbnf` compiled (once, then shared); kInvalid naming `source` for a grammar that does not
  // parse.
  Result<std::shared_ptr<const CompiledGrammar>> Compile(const std::string& gbnf,
                                                          const std::string& source);

 private:
  GrammarVocabulary vocab_;
  size_t max_;
  std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<const CompiledGrammar>>> lru_;  // under mu_
};

class GrammarConstraint : public TokenConstraint {
 public:
  explicit GrammarConstraint(std::shared_ptr<const CompiledGrammar> compiled);
  ~GrammarConstraint() override;

  Result<const float*> Mask(const float* logits, int64_t vocab) override;
  Status Accept(int32_t id) override;

  const grammar::Matcher& matcher() const { return matcher_; }

  // Per chosen token: the mask's computation (on its own thread, during the pass) and what the
  // choice waited for it plus applying it (on the engine's thread: the critical path).
  struct Timing {
    std::vector<double> compute_seconds;
    std::vector<double> wait_seconds;
  };
  const Timing& timing() const { return timing_; }

 private:
  void StartNextMask();

  std::shared_ptr<const CompiledGrammar> compiled_;
  grammar::Matcher matcher_;
  struct Computed {
    std::vector<uint64_t> bits;
    double seconds = 0;
  };
  std::future<Computed> next_;  // the mask of matcher_, being computed
  std::vector<float> masked_;
  Timing timing_;
};

// A constraint for one sequence from `library`'s masker of `gbnf`.
Result<std::shared_ptr<TokenConstraint>> MakeGrammarConstraint(GrammarLibrary* library,
                                                               const std::string& gbnf,
                                                               const std::string& source);

}  // namespace k3::run
