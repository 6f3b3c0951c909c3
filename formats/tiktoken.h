// The tokenizer files of a K3 checkpoint: tiktoken.model and tokenizer_config.json.
//
// Goals: strict reading and writing of both files as released (DESIGN.md §4, §8), so the
// encoder in k3run can trust what it gets:
//   tiktoken.model        one line per rank, "base64(token bytes) SP rank LF": standard base64
//                         with padding, canonical (unused bits zero); ranks 0..N−1 in order;
//                         token bytes non-empty and unique. The final LF may be missing.
//   tokenizer_config.json the Hugging Face shape: "added_tokens_decoder": {"<id>": {"content",
//                         "special", "lstrip", "normalized", "rstrip", "single_word"}}, plus
//                         bos/eos/unk/pad_token, model_max_length, tokenizer_class.
// Every violation is a Code::kInvalid Status naming the source, the line (tiktoken.model) or
// JSON path (tokenizer_config.json), the byte offset where known, the rule and what to do.
// Serialisers emit exactly what the parsers accept (round trip is identity on valid input).
//
// Non-goals: encoding or decoding text (k3run's encoder), the pre-tokenizer regex, the chat
// template, tokenizer_config.json keys the engine never reads (chat_template, auto_map, …:
// accepted and ignored when reading, not written).
//
// Evolution: both formats are fixed by the release; a new key in tokenizer_config.json is
// ignored until the engine needs it, then added here with its own validation rule.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/env.h"
#include "common/status.h"

namespace k3::tiktoken {

// Upper bound on a tiktoken.model file read through LoadTiktokenModel (the released file is
// ~2.4 MB); a larger file is refused before it is read.
inline constexpr uint64_t kMaxModelFileBytes = uint64_t{256} << 20;
inline constexpr uint64_t kMaxConfigFileBytes = uint64_t{64} << 20;

struct Vocab {
  std::vector<std::string> tokens;  // rank → token bytes
};

// Parses tiktoken.model text. `source` names the file in messages.
Result<Vocab> ParseTiktokenModel(std::string_view text, const std::string& source);
// The file text for a vocab; every line ends with LF. The vocab must satisfy the parser's rules
// (WriteTiktokenModel checks them).
std::string SerializeTiktokenModel(const Vocab& vocab);
// The same rules as ParseTiktokenModel, for a vocab built in memory (no line numbers: ranks).
Status ValidateVocab(const Vocab& vocab, const std::string& source);

// Standard base64 with padding (RFC 4648 §4). Exposed for tests and the encoder's diagnostics.
std::string Base64Encode(std::string_view bytes);

struct AddedToken {
  int64_t id = 0;
  std::string content;
  bool special = true;
  bool lstrip = false;
  bool normalized = false;
  bool rstrip = false;
  bool single_word = false;
};

struct TokenizerConfig {
  std::vector<AddedToken> added_tokens;  // sorted by id (the parser sorts; writers must)
  // Token contents; empty when the key is absent. A non-empty one must be an added token.
  std::string bos_token, eos_token, unk_token, pad_token;
  // model_max_length; 0 when absent. Values beyond uint64 (the Hugging Face "1e30" default)
  // saturate to UINT64_MAX.
  uint64_t model_max_length = 0;
  std::string tokenizer_class = "TikTokenTokenizer";
};

// Parses tokenizer_config.json. Rules: valid JSON without duplicate keys (at any depth); a top-
// level object; added_tokens_decoder an object whose keys are canonical non-negative decimal
// ids and whose values are objects with a non-empty string "content", a boolean "special" and
// optional boolean lstrip/normalized/rstrip/single_word; contents unique; bos/eos/unk/pad_token,
// when present, a string (or an object with a string "content") naming an added token;
// tokenizer_class, when present, "TikTokenTokenizer"; model_max_length a non-negative number.
Result<TokenizerConfig> ParseTokenizerConfig(std::string_view text, const std::string& source);
// Pretty-printed JSON (2-space indent, keys in the released order), ending with LF.
std::string SerializeTokenizerConfig(const TokenizerConfig& config);
// The parser's semantic rules for a config built in memory (unique ids ≥ 0, unique non-empty
// contents, special-token names resolve).
Status ValidateTokenizerConfig(const TokenizerConfig& config, const std::string& source);

// Cross-file rule: added-token ids must not be ranks of the vocab (they live above it).
Status CheckAddedTokensOutsideVocab(const Vocab& vocab, const TokenizerConfig& config,
                                    const std::string& source);

// Looks up an added token by content; -1 when there is none (k3run finds [EOS] this way).
int64_t FindAddedToken(const TokenizerConfig& config, std::string_view content);

// File helpers over Env. Loads read at most the kMax*FileBytes above; writes validate first and
// go through WriteFileAtomic (a failure leaves no file under the final name).
Result<Vocab> LoadTiktokenModel(Env* env, const std::string& path);
Result<TokenizerConfig> LoadTokenizerConfig(Env* env, const std::string& path);
Status WriteTiktokenModel(Env* env, const std::string& path, const Vocab& vocab);
Status WriteTokenizerConfig(Env* env, const std::string& path, const TokenizerConfig& config);

}  // namespace k3::tiktoken
