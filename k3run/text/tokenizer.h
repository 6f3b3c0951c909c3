// Text → token ids and back: the tiktoken byte-level BPE with the Kimi K3 pre-tokenizer.
//
// Goals: exactly upstream's encoding (tiktoken core + tokenization_kimi.py): invalid UTF-8 is
// first replaced (Python errors="replace"); the text is cut into ≤ 400,000-character pieces,
// each cut again inside any run of str.isspace() / non-space characters longer than 25,000
// (k3run/text/text_split.h); in each piece, added tokens are found when allowed (leftmost, longest first)
// and the text between them is split by the Kimi pattern (k3run/text/pretokenizer.h, k3run/text/pattern.h); each
// regex match is one token if its bytes are a rank, else byte-level BPE (k3run/text/bpe.h). Ids are dense:
// ranks 0..R−1, then the added tokens R..V−1 (as released: 163584..163839).
// Fast: flat hash tables over byte strings, a heap-driven BPE for long pieces (a 1 MiB run of
// one character encodes in ~0.1 s).
// Non-goals: the chat template, sampling, streaming UTF-8 output (k3run/text/utf8.h), loading the
// files' bytes from a prepared directory with hash checks (callers pass paths they trust).
//
// Thread safety: a loaded Tokenizer is immutable; Encode/Decode may run concurrently (each call
// uses its own PCRE2 match data).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/env.h"
#include "common/status.h"
#include "formats/tiktoken.h"

namespace k3::tok {

class Tokenizer {
 public:
  // From tiktoken.model + tokenizer_config.json (formats/tiktoken.h strict readers). vocab =
  // ranks + added tokens must equal expected_vocab (the model config's vocab_size) when > 0.
  static Result<Tokenizer> Load(Env* env, const std::string& tiktoken_model_path,
                                const std::string& tokenizer_config_path, int64_t expected_vocab);
  // The same from parsed files (tests, and callers that read the files themselves, e.g. after
  // checking their hashes). `source` names them in messages.
  static Result<Tokenizer> FromParts(tiktoken::Vocab vocab, tiktoken::TokenizerConfig config,
                                     int64_t expected_vocab, const std::string& source);
  // Invalid UTF-8 is first replaced by U+FFFD per maximal invalid subsequence (Python
  // errors="replace"). allow_special: recognise added tokens' text (user prompt files: true,
  // the upstream default; chat message content: false).
  std::vector<int32_t> Encode(std::string_view text, bool allow_special) const;
  std::string Decode(std::span<const int32_t> ids) const;      // raw bytes, specials as content
  std::string_view TokenBytes(int32_t id) const;               // bytes of one id ("" if unknown)
  std::optional<int32_t> SpecialId(std::string_view content) const;  // by content, never by id
  int64_t vocab_size() const;

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// True for an added token of `tok` (<|open|>, [EOS], [BOS], reserved ones, …): its bytes are the
// content of the added token `id`. False for byte-level ranks and ids outside the vocabulary.
bool IsAddedToken(const Tokenizer& tok, int32_t id);

// The Kimi pre-tokenizer pattern exactly as released (alternatives joined with '|'; it uses
// `&&` class intersection, which PCRE2 lacks).
std::string_view KimiPattern();
// Rewrites every `[X&&[^\p{Han}]]` class intersection into `(?:(?!\p{Han})[X])`, the PCRE2
// equivalent. Other `&&` forms are refused (kInvalid naming the byte offset) rather than guessed.
Result<std::string> RewriteClassIntersections(std::string_view pattern);

}  // namespace k3::tok
