#include "k3run/grammar/matcher.h"

#include <algorithm>
#include <cassert>

#include "k3run/grammar/token_masker.h"

namespace k3::run::grammar {

Matcher::Matcher(std::shared_ptr<const Grammar> g) : grammar_(std::move(g)) {
  std::vector<Stack> start;
  Close(grammar_->tables().start, {}, &start);
  std::sort(start.begin(), start.end());
  start.erase(std::unique(start.begin(), start.end()), start.end());
  stacks_ = std::move(start);
}

void Matcher::Close(int32_t p, Stack below, std::vector<Stack>* out) const {
  const GrammarTables& t = grammar_->tables();
  while (true) {
    const int32_t n = t.ClosureSize(p);
    bool pop = false;  // the empty chain (sorted first, at most once): p's rest matched nothing
    for (int32_t i = 0; i < n; ++i) {
      const auto chain = t.Chain(p, i);
      if (chain.empty()) {
        pop = true;
        continue;
      }
      Stack s = below;
      s.insert(s.end(), chain.begin(), chain.end());
      out->push_back(std::move(s));
    }
    if (!pop) return;
    // Continue with the entry below (a loop, not recursion: nesting may be deep).
    if (below.empty()) {
      out->push_back({});
      return;
    }
    p = below.back();
    below.pop_back();
  }
}

bool Matcher::Advance(const std::vector<Stack>& next_unsorted) {
  if (next_unsorted.empty()) return false;
  std::vector<Stack> next = next_unsorted;
  std::sort(next.begin(), next.end());
  next.erase(std::unique(next.begin(), next.end()), next.end());
  stacks_ = std::move(next);
  return true;
}

bool Matcher::AcceptByte(uint8_t b) {
  const GrammarTables& t = grammar_->tables();
  std::vector<Stack> next;
  for (const Stack& s : stacks_) {
    if (s.empty() || !t.AcceptsByte(s.back(), b)) continue;
    Stack below(s.begin(), s.end() - 1);
    Close(s.back() + 1, std::move(below), &next);
  }
  return Advance(next);
}

bool Matcher::AcceptSpecial(int symbol) {
  const GrammarTables& t = grammar_->tables();
  std::vector<Stack> next;
  for (const Stack& s : stacks_) {
    if (s.empty()) continue;
    const Element& e = t.elements[static_cast<size_t>(s.back())];
    if (e.kind != ElementKind::kSpecial || e.arg != symbol) continue;
    Stack below(s.begin(), s.end() - 1);
    Close(s.back() + 1, std::move(below), &next);
  }
  return Advance(next);
}

bool Matcher::AcceptBytes(std::string_view s) {
  std::vector<Stack> saved = stacks_;
  for (const char c : s) {
    if (!AcceptByte(static_cast<uint8_t>(c))) {
      stacks_ = std::move(saved);
      return false;
    }
  }
  return true;
}

bool Matcher::AcceptToken(const Vocabulary& vocab, int32_t id) {
  if (id < 0 || static_cast<size_t>(id) >= vocab.bytes.size()) return false;
  const int32_t symbol = vocab.special_symbol[static_cast<size_t>(id)];
  if (symbol == kOrdinaryToken) {
    const std::string& bytes = vocab.bytes[static_cast<size_t>(id)];
    return !bytes.empty() && AcceptBytes(bytes);
  }
  if (symbol == kEndToken) return CanEnd();
  if (symbol < 0) return false;
  return AcceptSpecial(symbol);
}

bool Matcher::CanEnd() const {
  // Sorted: the empty stack, if present, comes first.
  return !stacks_.empty() && stacks_.front().empty();
}

bool Matcher::Finished() const { return stacks_.size() == 1 && stacks_.front().empty(); }

std::string Matcher::StateKey() const {
  std::string key;
  auto put = [&key](uint32_t v) {
    for (int i = 0; i < 4; ++i) key.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  };
  for (const Stack& s : stacks_) {
    put(static_cast<uint32_t>(s.size()));
    for (const int32_t p : s) put(static_cast<uint32_t>(p));
  }
  return key;
}

}  // namespace k3::run::grammar
