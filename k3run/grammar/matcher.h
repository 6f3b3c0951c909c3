// The state of one sequence in a grammar: a set of pushdown stacks (llama.cpp's approach),
// advanced byte by byte, and by special-token symbols.
//
// Each stack lists grammar positions bottom to top (grammar_tables.h); its top is the terminal
// that must match next; an empty stack means root is complete. The set is kept sorted and
// deduplicated, so equal states have equal stacks and equal StateKeys.
// A failed Accept* leaves the state unchanged, so a Matcher is never in a dead state.
// Cost: each byte copies the surviving stacks, O(stacks × nesting depth).
// Thread safety: a value type; copy it to explore (copying costs the stacks' size). The Grammar
// it points to is shared and immutable.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "k3run/grammar/grammar.h"

namespace k3::run::grammar {

struct Vocabulary;

class Matcher {
 public:
  using Stack = std::vector<int32_t>;

  explicit Matcher(std::shared_ptr<const Grammar> g);

  // False (state unchanged) when no stack accepts the byte.
  bool AcceptByte(uint8_t b);
  // Special-token symbol (an index into Grammar::special_names).
  bool AcceptSpecial(int symbol);
  // All or nothing: false (state unchanged) unless every byte is accepted in turn.
  bool AcceptBytes(std::string_view s);
  // Token `id` of `vocab`: its bytes, its special symbol, or (an end id) true iff CanEnd(),
  // without changing the state. False for ids the grammar cannot name or an empty token.
  bool AcceptToken(const Vocabulary& vocab, int32_t id);

  // The input so far is a complete sentence of root.
  bool CanEnd() const;
  // Complete, and nothing more may follow.
  bool Finished() const;
  // Equal states give equal keys and different states different keys (the stacks, serialized).
  std::string StateKey() const;

  const std::vector<Stack>& stacks() const { return stacks_; }
  const Grammar& grammar() const { return *grammar_; }
  const std::shared_ptr<const Grammar>& grammar_ptr() const { return grammar_; }

 private:
  // Expands position p on top of `below` into stacks whose tops are terminals (or the empty
  // stack), appending them to `out`.
  void Close(int32_t p, Stack below, std::vector<Stack>* out) const;
  bool Advance(const std::vector<Stack>& next_unsorted);

  std::shared_ptr<const Grammar> grammar_;
  std::vector<Stack> stacks_;
};

}  // namespace k3::run::grammar
