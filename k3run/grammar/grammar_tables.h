// The compiled form of a grammar: a byte-level pushdown automaton, shared (read-only) by the
// Matcher and the TokenMasker. Internal to k3run/grammar.
//
// Elements: every alternative of every rule is a run of elements ended by kEnd, all in one
// array; a position is an index into it. Terminals are kBytes (one byte from a 256-bit set) and
// kSpecial (one special-token symbol); kRule refers to a rule. Code-point classes were compiled
// into rules over bytes (utf8_ranges.h), so no terminal ever matches more than one byte.
//
// A stack (llama.cpp's representation) lists positions bottom to top: the top is the terminal
// to match next, every entry below it is where to continue when the part above is done. The
// closure of a position p is the set of "chains" that expanding p's rule references can push:
// each chain is a run of positions, bottom to top, whose last one is a terminal; the empty chain
// means the rest of p's alternative can match nothing, so the entry below must be expanded next.
// Closures are computed once at parse time (the grammar has no left recursion, so they are
// finite), which makes advancing a stack a table lookup plus copies.
//
// Invariants: elements[start] is a kRule for root and elements[start + 1] is kEnd; a stack never
// holds a kEnd position, and every non-top entry is a position following a kRule.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace k3::run::grammar {

enum class ElementKind : uint8_t { kEnd, kBytes, kRule, kSpecial };

struct Element {
  ElementKind kind = ElementKind::kEnd;
  int32_t arg = 0;  // kBytes: index into byte_sets; kRule: rule id; kSpecial: symbol
};

struct ByteSet {
  std::array<uint64_t, 4> bits{};
  bool Has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  void Add(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
  bool operator==(const ByteSet&) const = default;
  auto operator<=>(const ByteSet&) const = default;
};

struct GrammarTables {
  std::vector<Element> elements;
  std::vector<ByteSet> byte_sets;
  int32_t start = 0;
  // closure of position p: chains [chain_begin[closure_begin[p]], ...[closure_begin[p + 1]]);
  // chain c is chain_positions[chain_begin[c] .. chain_begin[c + 1]).
  std::vector<int32_t> closure_begin;  // [elements + 1]
  std::vector<int32_t> chain_begin;    // [chains + 1]
  std::vector<int32_t> chain_positions;
  std::vector<std::string> special_names;

  int32_t ClosureSize(int32_t p) const { return closure_begin[p + 1] - closure_begin[p]; }
  std::span<const int32_t> Chain(int32_t p, int32_t i) const {
    const int32_t c = closure_begin[p] + i;
    return {chain_positions.data() + chain_begin[c],
            static_cast<size_t>(chain_begin[c + 1] - chain_begin[c])};
  }
  // Whether terminal position p accepts byte b.
  bool AcceptsByte(int32_t p, uint8_t b) const {
    const Element& e = elements[p];
    return e.kind == ElementKind::kBytes && byte_sets[e.arg].Has(b);
  }
};

}  // namespace k3::run::grammar
