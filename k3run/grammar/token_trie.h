// The ordinary tokens of a vocabulary as a byte trie laid out in preorder, so that walking it
// against a grammar is one forward pass over flat arrays that jumps over a whole subtree as
// soon as its prefix is refused. Internal to k3run/grammar.
//
// Layout: node i (0-based; the root is implicit) holds its byte at depth >= 1; its subtree is
// nodes i .. skip-1; when has_tokens, the tokens whose bytes end there are
// token_ids[token_begin[i] .. token_begin[i+1]) (several when a vocabulary repeats a string).
// A node is 8 bytes, so the walk streams the least memory it can: the mask of a state inside a
// JSON string visits most of the ~600k nodes of a 163,840-token vocabulary.
// Tokens longer than kMaxTokenBytes are left out (never allowed).
// Thread safety: immutable after construction.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace k3::run::grammar {

struct TrieNode {
  uint8_t byte;
  uint8_t has_tokens;
  uint16_t depth;
  int32_t skip;
};
static_assert(sizeof(TrieNode) == 8);

struct Vocabulary;

struct TokenTrie {
  static constexpr size_t kMaxTokenBytes = 65535;

  // ids[k] is the token id of bytes[k]; empty strings are left out.
  static TokenTrie Build(const std::vector<std::string>& bytes, const std::vector<int32_t>& ids);
  // The ordinary tokens of `v` (special_symbol kOrdinaryToken). Depends on the vocabulary only:
  // build it once and share it between the maskers of every grammar (TokenMasker's 4-argument
  // constructor); at 163,840 tokens it takes tens of milliseconds.
  static std::shared_ptr<const TokenTrie> ForVocabulary(const Vocabulary& v);

  int32_t size() const { return static_cast<int32_t>(nodes.size()); }

  std::vector<TrieNode> nodes;
  std::vector<int32_t> token_begin;  // [size + 1]
  std::vector<int32_t> token_ids;
  int32_t max_depth = 0;
};

}  // namespace k3::run::grammar
