// Byte-level BPE training for the synthetic tokenizer (DESIGN.md §8).
//
// Goals: learn a realistic-looking merge list (multilingual words, code, emoji) from a small
// corpus, deterministically (same input bytes → same merges on any machine, no hash-order
// leaks) and fast enough that tens of thousands of merges over a few hundred KB take seconds.
// Non-goals: reproducing the released Kimi pre-tokenizer regex (k3run owns that) or tiktoken's
// training; tokenizer quality beyond "plausible".
//
// Pre-split rule (PreSplit): text is decoded as UTF-8 and cut into maximal runs of one class:
//   - letters of one script (Latin, Greek, Cyrillic, Armenian, Hebrew, Arabic, each Indic block,
//     Thai, Georgian, Ethiopic, Hangul, Hiragana, Katakana, Han, …),
//   - decimal digits, whitespace, emoji (pictographs with ZWJ, variation selectors and skin-tone
//     modifiers kept inside the run), punctuation/other;
//   - combining marks, ZWJ/ZWNJ and variation selectors continue the current run;
//   - a single ASCII space that precedes a non-space run joins that run (" word", GPT-style);
//   - each byte that is not part of a valid UTF-8 sequence is a piece of its own.
// Training: unique pieces are counted; every piece starts as its bytes; the most frequent
// adjacent pair (counted over all pieces, weighted by piece count) is merged, ties broken by
// the lexicographically smallest concatenated bytes, then by the smaller token ids. A merge whose
// concatenation is already a token reuses that token (applied, but no new token). Training stops
// at max_merges new tokens or when no pair occurs at least twice.
//
// Thread safety: the functions are pure; callers may train in parallel on separate inputs.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace k3::bpe {

// The pieces of `text` in order; their concatenation is `text`.
std::vector<std::string_view> PreSplit(std::string_view text);

// Piece bytes → occurrences. Ordered, so training input order never depends on hashing.
using PieceCounts = std::map<std::string, int64_t>;

// Adds the pieces of `text` to `counts`.
void CountPieces(std::string_view text, PieceCounts* counts);

struct TrainStats {
  int64_t unique_pieces = 0;
  int64_t new_tokens = 0;       // merges that created a token (the returned list)
  int64_t reused_merges = 0;    // merges whose concatenation was already a token
  int64_t last_pair_count = 0;  // occurrences of the last merged pair
  bool exhausted = false;       // stopped because no pair occurs at least twice
};

// Learns up to max_merges new tokens on top of the 256 single bytes. Returns the new tokens'
// bytes in merge order (rank 256 + i in the synthetic vocabulary). The result for a smaller
// max_merges is always a prefix of the result for a larger one.
std::vector<std::string> Train(const PieceCounts& counts, int64_t max_merges,
                               TrainStats* stats = nullptr);

}  // namespace k3::bpe
