#include "k3run/grammar/token_masker.h"

#include <cassert>
#include <cmath>

#include "k3run/grammar/stack_set_dfa.h"

namespace k3::run::grammar {
namespace {

void SetBit(std::vector<uint64_t>* bits, int32_t id) {
  (*bits)[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
}

}  // namespace

Status CheckVocabulary(const Vocabulary& v, const Grammar& g) {
  if (v.bytes.size() != v.special_symbol.size()) {
    return Status::Invalid("grammar vocabulary: " + std::to_string(v.bytes.size()) +
                           " byte strings but " + std::to_string(v.special_symbol.size()) +
                           " special_symbol entries");
  }
  const auto specials = static_cast<int32_t>(g.special_names().size());
  for (size_t id = 0; id < v.special_symbol.size(); ++id) {
    const int32_t s = v.special_symbol[id];
    if (s >= specials || s < kEndToken) {
      return Status::Invalid("grammar vocabulary: token " + std::to_string(id) + " has symbol " +
                             std::to_string(s) + "; the grammar has " + std::to_string(specials) +
                             " special tokens");
    }
  }
  return Status::Ok();
}

TokenMasker::TokenMasker(std::shared_ptr<const Grammar> g, std::shared_ptr<const Vocabulary> v,
                         size_t cache_bytes)
    : TokenMasker(g, v, TokenTrie::ForVocabulary(*v), cache_bytes) {}

TokenMasker::TokenMasker(std::shared_ptr<const Grammar> g, std::shared_ptr<const Vocabulary> v,
                         std::shared_ptr<const TokenTrie> trie, size_t cache_bytes)
    : grammar_(std::move(g)), vocab_(std::move(v)), trie_(std::move(trie)), cache_(cache_bytes) {
  const size_t n = vocab_->bytes.size();
  words_ = (n + 63) / 64;
  const auto specials = static_cast<int32_t>(grammar_->special_names().size());
  for (size_t id = 0; id < n; ++id) {
    const int32_t s =
        id < vocab_->special_symbol.size() ? vocab_->special_symbol[id] : kOrdinaryToken;
    const auto tid = static_cast<int32_t>(id);
    if (s == kEndToken) {
      end_ids_.push_back(tid);
    } else if (s >= 0 && s < specials) {
      special_ids_.push_back(tid);
      special_symbols_.push_back(s);
    }
  }
}

void TokenMasker::ComputeAllowed(const Matcher& m, std::vector<uint64_t>* allowed) const {
  assert(&m.grammar() == grammar_.get());
  allowed->assign(words_, 0);
  const GrammarTables& t = grammar_->tables();

  // Ordinary ids: one preorder pass over the trie; set_at[d] is the stack set after the first
  // d bytes of the current node's path.
  StackSetDfa dfa(&t, m.stacks());
  const TokenTrie& trie = *trie_;
  std::vector<int32_t> set_at(static_cast<size_t>(trie.max_depth) + 1, StackSetDfa::kDead);
  set_at[0] = dfa.start();
  const int32_t n = trie.size();
  const TrieNode* nodes = trie.nodes.data();
  const int32_t* table = dfa.table();
  // The last node accepted (its depth and set): a node one deeper is its child, so its parent's
  // set comes from a register instead of set_at (the common case, descending a token's bytes).
  uint32_t last_depth = 0;
  int32_t last_set = set_at[0];
  for (int32_t i = 0; i < n;) {
    const TrieNode node = nodes[i];
    const int32_t from = node.depth == last_depth + 1 ? last_set : set_at[node.depth - 1u];
    int32_t s = table[static_cast<size_t>(from) * 256 + node.byte];
    if (s < 0) {
      s = dfa.ComputeStep(from, node.byte);
      table = dfa.table();
    }
    if (s == StackSetDfa::kDead) {
      i = node.skip;
      continue;
    }
    set_at[node.depth] = s;
    last_depth = node.depth;
    last_set = s;
    if (node.has_tokens) {
      for (int32_t k = trie.token_begin[static_cast<size_t>(i)];
           k < trie.token_begin[static_cast<size_t>(i) + 1]; ++k) {
        SetBit(allowed, trie.token_ids[static_cast<size_t>(k)]);
      }
    }
    ++i;
  }

  // Special ids: allowed when some stack's top is their symbol.
  std::vector<bool> symbol_next(grammar_->special_names().size(), false);
  for (const Matcher::Stack& s : m.stacks()) {
    if (s.empty()) continue;
    const Element& e = t.elements[static_cast<size_t>(s.back())];
    if (e.kind == ElementKind::kSpecial) symbol_next[static_cast<size_t>(e.arg)] = true;
  }
  for (size_t k = 0; k < special_ids_.size(); ++k) {
    if (symbol_next[static_cast<size_t>(special_symbols_[k])]) SetBit(allowed, special_ids_[k]);
  }
  if (m.CanEnd()) {
    for (const int32_t id : end_ids_) SetBit(allowed, id);
  }
}

std::shared_ptr<const MaskBits> TokenMasker::CachedMask(const Matcher& m) const {
  const std::string key = m.StateKey();
  if (std::shared_ptr<const MaskBits> hit = cache_.Find(key)) return hit;
  auto mask = std::make_shared<MaskBits>();
  ComputeAllowed(m, mask.get());
  std::shared_ptr<const MaskBits> shared = std::move(mask);
  cache_.Insert(key, shared);
  return shared;
}

void TokenMasker::Allowed(const Matcher& m, std::vector<uint64_t>* allowed) const {
  *allowed = *CachedMask(m);
}

int64_t ApplyAllowed(const std::vector<uint64_t>& allowed, float* logits, int64_t vocab) {
  int64_t count = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const auto w = static_cast<size_t>(i >> 6);
    const bool ok = w < allowed.size() && ((allowed[w] >> (i & 63)) & 1);
    if (ok) {
      ++count;
    } else {
      logits[i] = -INFINITY;
    }
  }
  return count;
}

int64_t TokenMasker::Apply(const Matcher& m, float* logits, int64_t vocab) const {
  return ApplyAllowed(*CachedMask(m), logits, vocab);
}

}  // namespace k3::run::grammar
