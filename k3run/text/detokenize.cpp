#include "k3run/text/detokenize.h"

#include <algorithm>
#include <utility>

#include "common/hash.h"

namespace k3::run {
namespace {

// Reads a tokenizer file that k3.json lists as a region and checks its XXH3-128 first.
Result<std::optional<std::string>> ReadCheckedRegion(Env* env, const prepared::PreparedDir& p,
                                                     const std::string& name) {
  const prepared::Region* r = p.manifest.FindRegion(name);
  if (r == nullptr) return std::optional<std::string>();
  const std::string path = JoinPath(p.dir, r->file);
  K3_ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, path));
  if (text.size() != r->length) {
    return Status::Invalid(path + ": " + std::to_string(text.size()) + " bytes, k3.json says " +
                           std::to_string(r->length));
  }
  const Hash128 got = Xxh3_128(text.data(), text.size());
  if (!(got == r->xxh3_128)) {
    return Status::Integrity(path + ": XXH3-128 " + got.Hex() + " differs from k3.json's " +
                             r->xxh3_128.Hex() + " (the file was altered; re-run k3prep pack)");
  }
  return std::optional<std::string>(std::move(text));
}

}  // namespace

Detokenizer::Detokenizer(tiktoken::Vocab vocab, tiktoken::TokenizerConfig config)
    : vocab_(std::move(vocab)), config_(std::move(config)) {}

Result<std::optional<Detokenizer>> Detokenizer::Load(Env* env, const prepared::PreparedDir& p) {
  const std::string model_name = "tokenizer/tiktoken.model";
  const std::string config_name = "tokenizer/tokenizer_config.json";
  K3_ASSIGN_OR_RETURN(std::optional<std::string> model, ReadCheckedRegion(env, p, model_name));
  if (!model) return std::optional<Detokenizer>();
  K3_ASSIGN_OR_RETURN(tiktoken::Vocab vocab,
                      tiktoken::ParseTiktokenModel(*model, JoinPath(p.dir, model_name)));
  tiktoken::TokenizerConfig config;
  K3_ASSIGN_OR_RETURN(std::optional<std::string> cfg, ReadCheckedRegion(env, p, config_name));
  if (cfg) {
    K3_ASSIGN_OR_RETURN(config,
                        tiktoken::ParseTokenizerConfig(*cfg, JoinPath(p.dir, config_name)));
  }
  return std::optional<Detokenizer>(Detokenizer(std::move(vocab), std::move(config)));
}

std::string Detokenizer::Bytes(int64_t id) {
  if (id >= 0 && static_cast<uint64_t>(id) < vocab_.tokens.size()) {
    return vocab_.tokens[static_cast<size_t>(id)];
  }
  // added_tokens is sorted by id (the parser sorts).
  const auto& added = config_.added_tokens;
  auto it = std::lower_bound(added.begin(), added.end(), id,
                             [](const tiktoken::AddedToken& a, int64_t v) { return a.id < v; });
  if (it != added.end() && it->id == id) return it->content;
  ++unknown_;
  return "";
}

int64_t Detokenizer::FindAddedToken(const std::string& content) const {
  return tiktoken::FindAddedToken(config_, content);
}

}  // namespace k3::run
