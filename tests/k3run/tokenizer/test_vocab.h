// A small hand-made vocabulary for unit tests: the 256 single bytes, a few merges with chosen
// ranks, and added tokens right after the ranks. Expected ids in tests are derived by hand
// from this table, never from the encoder.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "formats/tiktoken.h"

namespace k3::tok::test {

// Merges in rank order starting at 256.
inline const std::vector<std::string>& TestMerges() {
  static const std::vector<std::string> m = {
      "aa",      // 256
      "bc",      // 257
      "ab",      // 258
      "aaaa",    // 259
      "abc",     // 260 (unreachable from a-b-c: bc merges first, then a+bc = "abc" → 260)
      " w",      // 261
      " wo",     // 262
      "rl",      // 263
      "Hello",   // 264 (a whole-piece token)
  };
  return m;
}

inline tiktoken::Vocab TestVocab() {
  tiktoken::Vocab v;
  for (int b = 0; b < 256; ++b) v.tokens.emplace_back(1, static_cast<char>(b));
  for (const std::string& m : TestMerges()) v.tokens.push_back(m);
  return v;
}

inline tiktoken::TokenizerConfig TestConfig(int64_t first_id,
                                            const std::vector<std::string>& contents) {
  tiktoken::TokenizerConfig c;
  int64_t id = first_id;
  for (const std::string& s : contents) {
    tiktoken::AddedToken t;
    t.id = id++;
    t.content = s;
    c.added_tokens.push_back(t);
  }
  return c;
}

inline const std::vector<std::string>& TestSpecials() {
  static const std::vector<std::string> s = {"[BOS]", "<|end_of_msg|>", "<|x|>", "<|x|>>"};
  return s;
}

}  // namespace k3::tok::test
