// Token ids → bytes, from the prepared directory's tokenizer/ files (vocab ranks, then the added
// tokens of tokenizer_config.json by id). The encoder (text → ids) belongs to the tokenizer issue.
//
// The tokenizer files are regions of k3.json: their bytes are hashed and compared with the
// manifest before parsing (a mismatch is kIntegrity, exit 3). A prepared directory without
// tokenizer/tiktoken.model has no detokenizer (the report's generated_text is then null).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/env.h"
#include "common/status.h"
#include "formats/prepared_manifest.h"
#include "formats/tiktoken.h"

namespace k3::run {

class Detokenizer {
 public:
  // nullopt when the prepared directory carries no tokenizer.
  static Result<std::optional<Detokenizer>> Load(Env* env, const prepared::PreparedDir& prepared);
  Detokenizer(tiktoken::Vocab vocab, tiktoken::TokenizerConfig config);

  // The bytes of token `id`: a vocab rank, else an added token's content, else "" (an id of the
  // model's vocab that the tokenizer does not cover; counted in unknown_ids()).
  std::string Bytes(int64_t id);
  int64_t unknown_ids() const { return unknown_; }
  int64_t FindAddedToken(const std::string& content) const;

 private:
  tiktoken::Vocab vocab_;
  tiktoken::TokenizerConfig config_;
  int64_t unknown_ = 0;
};

}  // namespace k3::run
