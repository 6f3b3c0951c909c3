// The input of `k3run PREPARED --batch FILE` (FILE may be - for standard input): JSON Lines, one
// request per line, checked strictly before any weight is read (a bad line is exit 2 naming
// FILE:LINE and the rule it breaks):
//   {"prompt": "text"}          text encoded with PREPARED's tokenizer exactly like --prompt
//                               (special tokens such as [BOS] are recognised)
//   {"ids": [1, 2, 3]}          token ids, each an integer in [0, vocab)
//   optional "gen": N           tokens to generate for this line, an integer >= 0 (default --gen)
//   optional "images": ["path", ...]  with "prompt": the line becomes one user message of the
//                               images then the text, rendered by the chat template as --image
//                               --prompt renders it (docs/VISION.md "Server and --batch"); its
//                               ids are filled by the front end (ResolveBatchImages in batch.h)
//   optional "spec_oracle": [ids]  diagnostic, with --spec: this line drafts from these ids (its
//                               plain run's generated ids) instead of the prompt lookup, as a
//                               prompt run's --spec-oracle (synthetic weights never repeat text)
// Rules: every non-blank line is one JSON object; exactly one of "prompt" and "ids"; a prompt
// of at least one id; no other keys (a misspelt "gen" or an OpenAI-style "max_tokens" must not
// be silently ignored). Blank lines (only spaces, tabs or a CR) are skipped and are no input;
// a trailing CR is ignored (CRLF files). Inputs are numbered from 0 in file order: the index of
// the output line, the per-sequence report and FILE.<index> of --dump-logits.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "k3run/engine/image_input.h"
#include "k3run/text/tokenizer.h"

namespace k3::run {

struct BatchInput {
  int64_t line = 0;              // 1-based line of FILE
  std::vector<int32_t> ids;      // the prompt, >= 1 id, each < vocab
  int64_t gen = 0;
  std::vector<int32_t> spec_oracle;  // "spec_oracle": drafts (--spec); empty: the lookup
  // "images": the files, in order; `text` is then the prompt text and `ids` stays empty until
  // the images are read and the message rendered (ResolveBatchImages).
  std::vector<std::string> images;
  std::string text;
  std::vector<ImageInput> image_inputs;  // the images read and preprocessed
};

// `name`: FILE as the user gave it ("<stdin>" for -), used in every message. `tokenizer` may be
// null (then a "prompt" line is refused: give "ids"). kInvalid on the first bad line, or when
// FILE holds no request.
Result<std::vector<BatchInput>> ParseBatchInputs(std::string_view text, const std::string& name,
                                                 const tok::Tokenizer* tokenizer, int64_t vocab,
                                                 int64_t default_gen);

}  // namespace k3::run
