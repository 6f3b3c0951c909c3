// The regex pre-tokenizer: the Kimi pattern compiled with PCRE2 (UTF, UCP, JIT,
// MATCH_INVALID_UTF) after KimiPatternForPcre2's translation.
//
// Goals: tiktoken's `regex.find_iter(text)`: successive leftmost-first matches; text between
// matches (the pattern matches every character, so none in practice) is dropped, as upstream.
// Thread safety: immutable after Create; each Split call allocates its own match data and JIT
// stack, so calls may run concurrently.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace k3::tok {

class PreTokenizer {
 public:
  // Compiles `pattern` (already translated for PCRE2); kInvalid naming the offset on failure.
  static Result<PreTokenizer> Create(const std::string& pattern);
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  // Calls `piece` for each match in `text` (valid UTF-8), in order.
  void Split(std::string_view text, const std::function<void(std::string_view)>& piece) const;

 private:
  struct Impl;
  explicit PreTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3::tok
