#include "k3prep/synth/tokenizer.h"

#include <algorithm>
#include <cstddef>
#include <map>
#include <mutex>
#include <unordered_set>
#include <utility>

#include "k3prep/synth/bpe_trainer.h"

namespace k3::synth {
namespace {

// Released contents of the listed added tokens (reference-data special_tokens.json); every
// other id in 163584..163839 is <|reserved_token_{scaled id}|>.
const std::map<int64_t, const char*>& ReleasedNames() {
  static const std::map<int64_t, const char*> kNames = {
      {163584, "[BOS]"},
      {163585, "[EOS]"},
      {163586, "<|end_of_msg|>"},
      {163587, "<|open|>"},
      {163588, "<|close|>"},
      {163589, "<|sep|>"},
      {163590, "[start_header_id]"},
      {163591, "[end_header_id]"},
      {163593, "[EOT]"},
      {163602, "<|media_begin|>"},
      {163603, "<|media_content|>"},
      {163604, "<|media_end|>"},
      {163605, "<|media_pad|>"},
      {163649, "<osagent_mode>"},
      {163838, "[UNK]"},
      {163839, "[PAD]"},
  };
  return kNames;
}

// Released special=false ids: the tool-call markers are plain text to the tokenizer.
bool ReleasedSpecial(int64_t released_id) {
  return released_id != 163587 && released_id != 163588 && released_id != 163589;
}

// Filler i is 0xFF followed by i as three big-endian bytes: 0xFF never occurs in UTF-8, so the
// learned merges (from a valid UTF-8 corpus) cannot produce it; collisions are still checked.
constexpr int64_t kMaxFiller = int64_t{1} << 24;
std::string MakeFiller(int64_t i) {
  std::string s(4, '\xFF');
  s[1] = static_cast<char>((i >> 16) & 0xFF);
  s[2] = static_cast<char>((i >> 8) & 0xFF);
  s[3] = static_cast<char>(i & 0xFF);
  return s;
}

// Training is the expensive step and its result for fewer merges is a prefix of the result for
// more, so one process (e.g. a test writing several presets) trains once per larger request.
struct TrainCache {
  std::mutex mu;
  std::vector<std::string> merges;
  int64_t requested = -1;  // max_merges of the cached run
  bool exhausted = false;
};

std::vector<std::string> LearnedMerges(int64_t max_merges) {
  static TrainCache cache;
  std::lock_guard<std::mutex> lock(cache.mu);
  if (cache.requested < max_merges && !cache.exhausted) {
    bpe::PieceCounts counts;
    for (const CorpusDocument& doc : EmbeddedCorpus()) bpe::CountPieces(doc.text, &counts);
    bpe::TrainStats stats;
    cache.merges = bpe::Train(counts, max_merges, &stats);
    cache.requested = max_merges;
    cache.exhausted = stats.exhausted;
  }
  const size_t n = std::min(cache.merges.size(), static_cast<size_t>(max_merges));
  return {cache.merges.begin(), cache.merges.begin() + static_cast<ptrdiff_t>(n)};
}

}  // namespace

int64_t ScaledAddedId(int64_t vocab_size, int64_t released_id) {
  return vocab_size - kAddedTokenCount + (released_id - kReleasedAddedBase);
}

SpecialIds SynthSpecialIds(int64_t vocab_size) {
  SpecialIds ids;
  ids.bos = ScaledAddedId(vocab_size, 163584);
  ids.eos = ScaledAddedId(vocab_size, 163586);
  ids.pad = ScaledAddedId(vocab_size, 163839);
  ids.media_placeholder = ScaledAddedId(vocab_size, 163605);
  return ids;
}

Result<SynthTokenizer> BuildSynthTokenizer(int64_t vocab_size) {
  const int64_t max_vocab = kMinVocab + kMaxFiller;
  if (vocab_size < kMinVocab || vocab_size > max_vocab) {
    return Status::Invalid("--set vocab_size=" + std::to_string(vocab_size) +
                           ": the synthetic tokenizer needs " + std::to_string(kMinVocab) + ".." +
                           std::to_string(max_vocab) +
                           " (256 single bytes + 256 added tokens at least); choose a vocab_size "
                           "in that range");
  }
  SynthTokenizer out;
  const int64_t ranks = vocab_size - kAddedTokenCount;
  std::vector<std::string>& tokens = out.vocab.tokens;
  tokens.reserve(static_cast<size_t>(ranks));
  for (int i = 0; i < 256; ++i) tokens.emplace_back(1, static_cast<char>(i));

  std::vector<std::string> merges = LearnedMerges(vocab_size - kMinVocab);
  out.learned_merges = static_cast<int64_t>(merges.size());
  for (std::string& m : merges) tokens.push_back(std::move(m));

  std::unordered_set<std::string> present(tokens.begin(), tokens.end());
  for (int64_t i = 0; static_cast<int64_t>(tokens.size()) < ranks; ++i) {
    if (i >= kMaxFiller) {
      return Status::Invalid("--set vocab_size=" + std::to_string(vocab_size) +
                             ": ran out of distinct filler tokens; choose a smaller vocab_size");
    }
    std::string filler = MakeFiller(i);
    if (present.count(filler) != 0) continue;
    tokens.push_back(std::move(filler));
    ++out.filler_tokens;
  }

  tiktoken::TokenizerConfig& config = out.config;
  const auto& names = ReleasedNames();
  for (int64_t r = kReleasedAddedBase; r < kReleasedAddedBase + kAddedTokenCount; ++r) {
    tiktoken::AddedToken t;
    t.id = ScaledAddedId(vocab_size, r);
    const auto it = names.find(r);
    t.content = it != names.end() ? std::string(it->second)
                                  : "<|reserved_token_" + std::to_string(t.id) + "|>";
    t.special = ReleasedSpecial(r);
    config.added_tokens.push_back(std::move(t));
  }
  config.bos_token = "[BOS]";
  config.eos_token = "[EOS]";
  config.unk_token = "[UNK]";
  config.pad_token = "[PAD]";
  // Not fixed by the release facts we have; the engine never reads it.
  config.model_max_length = 262144;
  return out;
}

Status WriteSynthTokenizer(Env* env, const std::string& out_dir, int64_t vocab_size,
                           int64_t* learned_merges) {
  K3_ASSIGN_OR_RETURN(SynthTokenizer tok, BuildSynthTokenizer(vocab_size));
  K3_RETURN_IF_ERROR(tiktoken::CheckAddedTokensOutsideVocab(tok.vocab, tok.config,
                                                            "synthetic tokenizer"));
  K3_RETURN_IF_ERROR(
      tiktoken::WriteTiktokenModel(env, JoinPath(out_dir, "tiktoken.model"), tok.vocab));
  K3_RETURN_IF_ERROR(tiktoken::WriteTokenizerConfig(
      env, JoinPath(out_dir, "tokenizer_config.json"), tok.config));
  if (learned_merges != nullptr) *learned_merges = tok.learned_merges;
  return Status::Ok();
}

}  // namespace k3::synth
