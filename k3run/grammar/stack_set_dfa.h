// The Matcher's set of stacks, re-expressed for walking many token prefixes at once: stacks
// become nodes of a shared, hash-consed tree (a stack is its top position plus the node below
// it), sets of stacks get ids, and "set S after byte b" is computed once and then looked up in
// a [set][256] table. Walking a vocabulary trie is then one table lookup per trie node; inside
// a JSON string, where each character returns to the same set, almost every lookup hits.
//
// Exactness: Step follows the same closure tables and rules as Matcher::AcceptByte, so the set
// reached after bytes s is non-empty exactly when a Matcher copy would AcceptBytes(s).
// Lifetime: one per mask computation (built from one Matcher state and dropped after), so it
// is never shared between threads and its size is bounded by the walk.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "k3run/grammar/grammar_tables.h"
#include "k3run/grammar/matcher.h"

namespace k3::run::grammar {

class StackSetDfa {
 public:
  static constexpr int32_t kDead = 0;  // the empty set: no stack survived

  StackSetDfa(const GrammarTables* tables, const std::vector<Matcher::Stack>& stacks);

  int32_t start() const { return start_; }
  // The set after byte b from set s (kDead when no stack accepts b).
  int32_t Step(int32_t s, uint8_t b) {
    const int32_t known = next_[static_cast<size_t>(s) * 256 + b];
    return known >= 0 ? known : ComputeStep(s, b);
  }
  // The [set][256] table behind Step (-1: not computed yet, call ComputeStep); ComputeStep may
  // move it, so re-read it after each call.
  const int32_t* table() const { return next_.data(); }
  int32_t ComputeStep(int32_t s, uint8_t b);

 private:
  struct Node {
    int32_t position;  // the stack's top (-1 for the empty stack, node 0)
    int32_t below;     // the node of the stack without its top
  };
  struct VectorHash {
    size_t operator()(const std::vector<int32_t>& v) const;
  };

  int32_t Push(int32_t position, int32_t below);
  void Close(int32_t p, int32_t below, std::vector<int32_t>* out);
  int32_t InternSet(std::vector<int32_t> nodes);

  const GrammarTables* tables_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> node_ids_;
  std::vector<std::vector<int32_t>> sets_;
  std::unordered_map<std::vector<int32_t>, int32_t, VectorHash> set_ids_;
  std::vector<int32_t> next_;  // [sets][256], -1 = not computed yet
  int32_t start_ = kDead;
};

}  // namespace k3::run::grammar
