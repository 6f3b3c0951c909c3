#include "k3run/text/tokenizer.h"

#include <algorithm>
#include <array>
#include <optional>
#include <set>
#include <utility>

#include "common/hex.h"
#include "k3run/text/bpe.h"
#include "k3run/text/pattern.h"
#include "k3run/text/pretokenizer.h"
#include "k3run/text/text_split.h"

namespace k3::tok {

struct Tokenizer::Impl {
  std::vector<std::string> tokens;  // id → bytes: ranks, then added tokens (dense)
  size_t num_ranks = 0;
  RankMap ranks;                    // rank bytes → rank (views into tokens)
  RankMap added;                    // added-token content → index in tokens − num_ranks
  std::vector<size_t> added_lengths;  // distinct content lengths, longest first
  std::array<bool, 256> added_first_byte{};
  PreTokenizer pretokenizer;

  explicit Impl(PreTokenizer p) : pretokenizer(std::move(p)) {}

  void EncodeOrdinary(std::string_view text, std::vector<int32_t>* out) const {
    pretokenizer.Split(text, [&](std::string_view piece) {
      const int32_t r = ranks.Find(piece);
      if (r != RankMap::kNone) {
        out->push_back(r);
      } else {
        BytePairEncode(piece, ranks, out);
      }
    });
  }

  // The leftmost added token in text[from..], longest at that position: (position, id).
  std::optional<std::pair<size_t, int32_t>> FindAdded(std::string_view text, size_t from) const {
    for (size_t i = from; i < text.size(); ++i) {
      if (!added_first_byte[static_cast<uint8_t>(text[i])]) continue;
      for (const size_t len : added_lengths) {
        if (len > text.size() - i) continue;
        const int32_t k = added.Find(text.substr(i, len));
        if (k != RankMap::kNone) return std::make_pair(i, static_cast<int32_t>(num_ranks) + k);
      }
    }
    return std::nullopt;
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Result<Tokenizer> Tokenizer::Load(Env* env, const std::string& tiktoken_model_path,
                                  const std::string& tokenizer_config_path,
                                  int64_t expected_vocab) {
  K3_ASSIGN_OR_RETURN(tiktoken::Vocab vocab, tiktoken::LoadTiktokenModel(env, tiktoken_model_path));
  K3_ASSIGN_OR_RETURN(tiktoken::TokenizerConfig config,
                      tiktoken::LoadTokenizerConfig(env, tokenizer_config_path));
  return FromParts(std::move(vocab), std::move(config), expected_vocab,
                   tiktoken_model_path + " + " + tokenizer_config_path);
}

Result<Tokenizer> Tokenizer::FromParts(tiktoken::Vocab vocab, tiktoken::TokenizerConfig config,
                                       int64_t expected_vocab, const std::string& source) {
  K3_RETURN_IF_ERROR(tiktoken::ValidateVocab(vocab, source));
  K3_RETURN_IF_ERROR(tiktoken::ValidateTokenizerConfig(config, source));
  K3_RETURN_IF_ERROR(tiktoken::CheckAddedTokensOutsideVocab(vocab, config, source));
  const auto num_ranks = static_cast<int64_t>(vocab.tokens.size());
  const auto num_added = static_cast<int64_t>(config.added_tokens.size());
  if (num_ranks + num_added > int64_t{INT32_MAX}) {
    return Status::Invalid(source + ": " + std::to_string(num_ranks + num_added) +
                           " token ids do not fit the encoder's 32-bit ids");
  }
  if (expected_vocab > 0 && num_ranks + num_added != expected_vocab) {
    return Status::Invalid(
        source + ": vocabulary is " + std::to_string(num_ranks) + " ranks + " +
        std::to_string(num_added) + " added tokens = " + std::to_string(num_ranks + num_added) +
        ", but the model's config.json says vocab_size " + std::to_string(expected_vocab) +
        "; the tokenizer files do not belong to this model");
  }
  // Ids must be dense: the added tokens sit right above the ranks (as released: 163584..).
  for (int64_t k = 0; k < num_added; ++k) {
    const tiktoken::AddedToken& t = config.added_tokens[static_cast<size_t>(k)];
    if (t.id != num_ranks + k) {
      return Status::Invalid(source + ": added token '" + t.content + "' has id " +
                             std::to_string(t.id) + ", expected " + std::to_string(num_ranks + k) +
                             ": added tokens must fill the ids right after the " +
                             std::to_string(num_ranks) + " ranks without gaps");
    }
  }
  K3_ASSIGN_OR_RETURN(std::string pattern, KimiPatternForPcre2(KimiPattern()));
  K3_ASSIGN_OR_RETURN(PreTokenizer pre, PreTokenizer::Create(pattern));
  auto impl = std::make_unique<Impl>(std::move(pre));
  impl->num_ranks = static_cast<size_t>(num_ranks);
  impl->tokens = std::move(vocab.tokens);
  impl->tokens.reserve(impl->tokens.size() + static_cast<size_t>(num_added));
  for (const tiktoken::AddedToken& t : config.added_tokens) impl->tokens.push_back(t.content);
  // Views are taken only now: the vector no longer reallocates.
  std::vector<std::string_view> keys(impl->tokens.begin(),
                                     impl->tokens.begin() + static_cast<std::ptrdiff_t>(impl->num_ranks));
  impl->ranks.Build(keys);
  keys.assign(impl->tokens.begin() + static_cast<std::ptrdiff_t>(impl->num_ranks), impl->tokens.end());
  impl->added.Build(keys);
  std::set<size_t, std::greater<>> lengths;
  for (const std::string_view c : keys) {
    lengths.insert(c.size());
    impl->added_first_byte[static_cast<uint8_t>(c[0])] = true;
  }
  impl->added_lengths.assign(lengths.begin(), lengths.end());
  // BPE ends in single bytes: every byte that valid UTF-8 can contain must be a rank, or some
  // text would have no encoding (tiktoken would panic).
  for (int b = 0; b < 256; ++b) {
    if (b == 0xC0 || b == 0xC1 || b >= 0xF5) continue;
    const char c = static_cast<char>(b);
    if (impl->ranks.Find(std::string_view(&c, 1)) == RankMap::kNone) {
      std::string hex;
      AppendHexByte(hex, static_cast<uint8_t>(b), HexCase::kUpper);
      return Status::Invalid(source + ": the single byte 0x" + hex +
                             " (base64 " + tiktoken::Base64Encode(std::string(1, c)) +
                             ") is not a rank; byte-level BPE needs every byte that can occur "
                             "in UTF-8 text as its own token");
    }
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool allow_special) const {
  std::string repaired;
  if (!IsValidUtf8(text)) {
    repaired = ReplaceInvalidUtf8(text);
    text = repaired;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  for (const ByteRange& r : SplitForEncoding(text)) {
    const std::string_view sub = text.substr(r.begin, r.end - r.begin);
    if (!allow_special || impl_->added.size() == 0) {
      impl_->EncodeOrdinary(sub, &out);
      continue;
    }
    size_t start = 0;
    while (true) {
      const auto found = impl_->FindAdded(sub, start);
      const size_t stop = found ? found->first : sub.size();
      impl_->EncodeOrdinary(sub.substr(start, stop - start), &out);
      if (!found) break;
      out.push_back(found->second);
      start = found->first + impl_->tokens[static_cast<size_t>(found->second)].size();
    }
  }
  return out;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids) const {
  std::string out;
  for (const int32_t id : ids) out.append(TokenBytes(id));
  return out;
}

std::string_view Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->tokens.size()) return {};
  return impl_->tokens[static_cast<size_t>(id)];
}

std::optional<int32_t> Tokenizer::SpecialId(std::string_view content) const {
  const int32_t k = impl_->added.Find(content);
  if (k == RankMap::kNone) return std::nullopt;
  return static_cast<int32_t>(impl_->num_ranks) + k;
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->tokens.size()); }

bool IsAddedToken(const Tokenizer& tok, int32_t id) {
  const std::string_view bytes = tok.TokenBytes(id);
  if (bytes.empty()) return false;
  const std::optional<int32_t> added = tok.SpecialId(bytes);
  return added && *added == id;
}

}  // namespace k3::tok
