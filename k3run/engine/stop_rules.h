// When generation stops, and what of the generated text is shown (DESIGN.md §6 k3run): the
// stop rules every front end shares (the CLI's prompt modes, chat, later the server).
//
// - End tokens: the model's [EOS] and <|end_of_msg|>, looked up by content in the prepared
//   tokenizer (never by id); generation stops after one unless --ignore-eos. Chat stops at the
//   same two.
// - Stop ids (--stop-id): stop after that id.
// - Stop strings (--stop, repeatable): matched on the decoded bytes across token boundaries.
//   StopText holds back every byte that may still be the start of a stop string, so the stop
//   text itself is never printed; on a match generation stops and the text before it is shown.
// - Special tokens (added tokens such as [EOS] or <|reserved_token_N|>) are not shown as text
//   unless --show-special; generated_ids keeps them all.
// Thread safety: none needed (one object per sequence, used by one thread).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "k3run/text/tokenizer.h"

namespace k3::run {

// The contents of the model's end tokens, in the order they are looked up.
inline constexpr std::string_view kEndTokenContents[] = {"[EOS]", "<|end_of_msg|>"};

// The ids of kEndTokenContents that `tokenizer` has (none without a tokenizer).
std::vector<int64_t> EndTokenIds(const tok::Tokenizer* tokenizer);


// Stop strings over a stream of bytes.
class StopText {
 public:
  explicit StopText(std::vector<std::string> stops);
  // Appends `bytes` and returns those now safe to show: never a byte that may begin a stop
  // string. On a match, returns the text before it and stopped() becomes true; later pushes
  // return nothing.
  std::string Push(std::string_view bytes);
  // The bytes held back at the end of generation (none after a match).
  std::string Flush();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }  // the stop string that matched

 private:
  size_t HeldBackLength() const;  // longest suffix of pending_ that begins a stop string

  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace k3::run
