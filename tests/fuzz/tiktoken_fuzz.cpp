// Fuzz target: both tokenizer-file parsers on the same input. They must return a Status for any
// bytes (never crash), and whatever they accept must survive a serialise → parse round trip.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "formats/tiktoken.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  k3::Result<k3::tiktoken::Vocab> vocab = k3::tiktoken::ParseTiktokenModel(text, "fuzz.model");
  if (vocab.ok()) {
    const std::string again = k3::tiktoken::SerializeTiktokenModel(*vocab);
    k3::Result<k3::tiktoken::Vocab> back = k3::tiktoken::ParseTiktokenModel(again, "again");
    if (!back.ok() || back->tokens != vocab->tokens) std::abort();
  } else if (vocab.status().message().empty()) {
    std::abort();
  }

  k3::Result<k3::tiktoken::TokenizerConfig> config =
      k3::tiktoken::ParseTokenizerConfig(text, "fuzz.json");
  if (config.ok()) {
    const std::string again = k3::tiktoken::SerializeTokenizerConfig(*config);
    k3::Result<k3::tiktoken::TokenizerConfig> back =
        k3::tiktoken::ParseTokenizerConfig(again, "again");
    if (!back.ok() || back->added_tokens.size() != config->added_tokens.size()) std::abort();
  } else if (config.status().message().empty()) {
    std::abort();
  }
  return 0;
}
