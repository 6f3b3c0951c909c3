#include "k3run/grammar/stack_set_dfa.h"

#include <algorithm>

namespace k3::run::grammar {

size_t StackSetDfa::VectorHash::operator()(const std::vector<int32_t>& v) const {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ v.size();
  for (const int32_t x : v) {
    h ^= static_cast<uint32_t>(x);
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  return static_cast<size_t>(h);
}

StackSetDfa::StackSetDfa(const GrammarTables* tables, const std::vector<Matcher::Stack>& stacks)
    : tables_(tables) {
  nodes_.push_back({-1, -1});  // node 0: the empty stack
  InternSet({});               // set 0: kDead
  std::vector<int32_t> start;
  for (const Matcher::Stack& s : stacks) {
    int32_t node = 0;
    for (const int32_t p : s) node = Push(p, node);
    start.push_back(node);
  }
  start_ = InternSet(std::move(start));
}

int32_t StackSetDfa::Push(int32_t position, int32_t below) {
  const uint64_t key =
      (uint64_t{static_cast<uint32_t>(position)} << 32) | static_cast<uint32_t>(below);
  auto [it, inserted] = node_ids_.emplace(key, static_cast<int32_t>(nodes_.size()));
  if (inserted) nodes_.push_back({position, below});
  return it->second;
}

// As Matcher::Close, on nodes.
void StackSetDfa::Close(int32_t p, int32_t below, std::vector<int32_t>* out) {
  while (true) {
    const int32_t n = tables_->ClosureSize(p);
    bool pop = false;
    for (int32_t i = 0; i < n; ++i) {
      const auto chain = tables_->Chain(p, i);
      if (chain.empty()) {
        pop = true;
        continue;
      }
      int32_t top = below;
      for (const int32_t q : chain) top = Push(q, top);
      out->push_back(top);
    }
    if (!pop) return;
    if (below == 0) {
      out->push_back(0);
      return;
    }
    const Node node = nodes_[static_cast<size_t>(below)];
    p = node.position;
    below = node.below;
  }
}

int32_t StackSetDfa::InternSet(std::vector<int32_t> nodes) {
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  auto found = set_ids_.find(nodes);
  if (found != set_ids_.end()) return found->second;
  const auto id = static_cast<int32_t>(sets_.size());
  set_ids_.emplace(nodes, id);
  sets_.push_back(std::move(nodes));
  next_.resize(next_.size() + 256, -1);
  if (id == kDead) std::fill(next_.begin(), next_.end(), kDead);
  return id;
}

int32_t StackSetDfa::ComputeStep(int32_t s, uint8_t b) {
  std::vector<int32_t> out;
  // Close adds nodes, never sets, so the reference stays valid until InternSet.
  const std::vector<int32_t>& members = sets_[static_cast<size_t>(s)];
  for (const int32_t n : members) {
    if (n == 0) continue;
    const Node node = nodes_[static_cast<size_t>(n)];
    if (tables_->AcceptsByte(node.position, b)) Close(node.position + 1, node.below, &out);
  }
  const int32_t t = out.empty() ? kDead : InternSet(std::move(out));
  next_[static_cast<size_t>(s) * 256 + b] = t;
  return t;
}

}  // namespace k3::run::grammar
