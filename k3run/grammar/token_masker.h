// Which token ids may come next in a grammar: the mask applied to the logits before sampling
// (greedy then takes the best allowed id).
//
// An ordinary id is allowed when its whole byte string is accepted from the Matcher's state
// (Matcher::AcceptBytes would succeed); a special id when a stack's top is its symbol; an end id
// (kEndToken, e.g. [EOS]) when the input so far is complete (Matcher::CanEnd). Empty ordinary
// tokens and ids the grammar cannot name (kNeverToken) are never allowed.
// How: the ordinary tokens form a byte trie (token_trie.h) walked against the state's stacks
// (stack_set_dfa.h), pruning a subtree at the first byte no stack accepts; special and end ids
// are checked one by one. A bounded LRU cache keyed by Matcher::StateKey makes a repeated state
// (inside a JSON string, between arguments) cost one lookup.
// Exactness: the mask is a pure function of (grammar, vocabulary, state): never of the batch,
// of the thread computing it or of what the cache holds (a hit returns the identical mask).
// Thread safety: all methods are const and may be called from any thread at once; the cache
// takes a mutex, the computation runs outside it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "k3run/grammar/grammar.h"
#include "k3run/grammar/mask_cache.h"
#include "k3run/grammar/matcher.h"
#include "k3run/grammar/token_trie.h"

namespace k3::run::grammar {

inline constexpr int32_t kOrdinaryToken = -1;  // special_symbol of an ordinary id
inline constexpr int32_t kNeverToken = -2;     // a special id the grammar cannot name
inline constexpr int32_t kEndToken = -3;       // an end-of-sequence id: allowed iff CanEnd()

// Token byte strings of a vocabulary, indexed by token id.
struct Vocabulary {
  std::vector<std::string> bytes;       // [vocab] ordinary token bytes ("" for special ids)
  std::vector<int32_t> special_symbol;  // [vocab] kOrdinaryToken, a symbol index into
                                        // Grammar::special_names, kNeverToken or kEndToken
};

// kInvalid unless both vectors have one entry per id and every symbol names one of `g`'s
// special tokens (or is one of the three constants).
Status CheckVocabulary(const Vocabulary& v, const Grammar& g);

// Sets logits[i] = -INFINITY for every id < vocab whose bit in `allowed` (a mask as Allowed
// gives it) is clear; ids past the mask are never allowed. Returns the count allowed.
int64_t ApplyAllowed(const std::vector<uint64_t>& allowed, float* logits, int64_t vocab);

class TokenMasker {
 public:
  static constexpr size_t kDefaultCacheBytes = size_t{4} << 20;

  // `v` should pass CheckVocabulary; a symbol outside the grammar's specials is never allowed.
  // cache_bytes = 0 turns the cache off.
  TokenMasker(std::shared_ptr<const Grammar> g, std::shared_ptr<const Vocabulary> v,
              size_t cache_bytes = kDefaultCacheBytes);
  // With the vocabulary's trie built once (TokenTrie::ForVocabulary(*v)) and shared by the
  // maskers of many grammars.
  TokenMasker(std::shared_ptr<const Grammar> g, std::shared_ptr<const Vocabulary> v,
              std::shared_ptr<const TokenTrie> trie, size_t cache_bytes = kDefaultCacheBytes);

  int64_t vocab_size() const { return static_cast<int64_t>(vocab_->bytes.size()); }
  // Words of a mask: ceil(vocab / 64).
  size_t mask_words() const { return words_; }

  // allowed: a bitset of [vocab] ids in 64-bit words, bit (id % 64) of word (id / 64) set when
  // id may come next; resized to mask_words(), bits past vocab are 0. Uses the cache.
  void Allowed(const Matcher& m, std::vector<uint64_t>* allowed) const;
  // The same mask, computed now without looking at or filling the cache (tests, benchmarks).
  void ComputeAllowed(const Matcher& m, std::vector<uint64_t>* allowed) const;
  // Sets logits[i] = -INFINITY for every id < vocab not allowed (ids at or past the
  // vocabulary's size are never allowed). Returns the count allowed (0: a dead end, which a
  // grammar that CanEnd without an end id in the vocabulary can reach).
  int64_t Apply(const Matcher& m, float* logits, int64_t vocab) const;

  MaskCache::Stats cache_stats() const { return cache_.stats(); }

 private:
  std::shared_ptr<const MaskBits> CachedMask(const Matcher& m) const;

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const Vocabulary> vocab_;
  size_t words_ = 0;
  std::shared_ptr<const TokenTrie> trie_;
  std::vector<int32_t> special_ids_;      // ids whose symbol is a grammar special
  std::vector<int32_t> special_symbols_;  // their symbols
  std::vector<int32_t> end_ids_;
  mutable MaskCache cache_;
};

}  // namespace k3::run::grammar
