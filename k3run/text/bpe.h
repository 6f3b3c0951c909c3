// Byte-level BPE without a merges table (tiktoken's rank BPE).
//
// Goals: exactly tiktoken's _byte_pair_merge: start from single bytes, repeatedly merge the
// adjacent pair whose concatenation has the lowest rank (ties: the leftmost pair), stop when no
// adjacent concatenation is a token. Two implementations with identical results: the simple
// vector scan (fast for the short pieces that dominate text) and a heap over a linked list,
// O(n log n), for long pieces (a 25,000-character run of one letter).
// Non-goals: pre-tokenization, special tokens, the "whole piece is a token" shortcut (callers).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace k3::tok {

// Token bytes → rank: an open-addressing table (linear probing) over views of strings owned
// elsewhere (the Tokenizer's vocab). Built once, then read-only. Why not unordered_map: BPE
// spends most of its time in these lookups, and a flat table with stored hashes avoids a
// pointer chase and most byte compares per probe.
class RankMap {
 public:
  static constexpr int32_t kNone = -1;
  void Build(const std::vector<std::string_view>& keys);  // rank = index in keys; keys unique
  int32_t Find(std::string_view bytes) const;             // kNone when absent
  size_t size() const { return count_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    const char* data = nullptr;  // nullptr: empty slot
    uint32_t len = 0;
    int32_t rank = kNone;
  };
  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  size_t count_ = 0;
};

// Pieces at most this long use the vector scan (measured crossover is far above typical words).
inline constexpr size_t kHeapBpeThreshold = 256;

// Appends the ranks of `piece` (non-empty). Every single byte of `piece` must be in `ranks`
// (the Tokenizer checks that at load time).
void BytePairEncode(std::string_view piece, const RankMap& ranks, std::vector<int32_t>* out);
// The two strategies, exposed so tests can check they agree.
void BytePairEncodeScan(std::string_view piece, const RankMap& ranks, std::vector<int32_t>* out);
void BytePairEncodeHeap(std::string_view piece, const RankMap& ranks, std::vector<int32_t>* out);

}  // namespace k3::tok
