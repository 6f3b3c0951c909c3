// Engine::SaveSequence / LoadSequence: a Sequence to and from formats/sequence_state.h's file.
// Sections: per KDA layer S ‖ hist_q ‖ hist_k ‖ hist_v; per MLA layer the latent cache rows
// [0, length). Positions past the length are never read, so they are not stored. Loading
// decodes into the sequence's own buffers (SequenceSink): its peak is the state's size plus
// one 1 MiB read buffer and the token ids.
#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "formats/sequence_state.h"
#include "k3run/engine/session.h"

namespace k3::run {

namespace {

// A KDA layer's section: its buffers concatenated in KdaState::Buffers() order.
std::vector<float> KdaSection(const ops::KdaState& k) {
  std::vector<float> out;
  out.reserve(k.Floats());
  for (const std::vector<float>* v : k.Buffers()) out.insert(out.end(), v->begin(), v->end());
  return out;
}

}  // namespace

Status Engine::SaveSequence(const Sequence& seq, const std::string& path) const {
  if (seq.pending() > 0) {
    return Status::Invalid("--save-state: the sequence has rows not committed");
  }
  if (!seq.media().empty()) {
    return Status::Invalid("--save-state: the sequence holds images, whose rows the state file "
                           "does not carry; save a text-only sequence");
  }
  seqstate::SequenceState st;
  st.model = prepared_->manifest_hash;
  st.layers = static_cast<uint32_t>(layers_);
  st.tokens = seq.tokens();
  for (int L = 0; L < layers_; ++L) {
    const auto l = static_cast<size_t>(L);
    if (config_.is_mla(L)) {
      const ops::MlaCache& m = seq.state_.mla[l];
      st.sections.push_back({static_cast<uint32_t>(L), seqstate::kMla,
                             std::vector<float>(m.data.begin(), m.data.begin() + m.len * m.width)});
    } else {
      st.sections.push_back({static_cast<uint32_t>(L), seqstate::kKda,
                             KdaSection(seq.state_.kda[l])});
    }
  }
  return seqstate::WriteSequenceState(env_, path, st);
}

namespace {

// Decodes a state file straight into a Sequence's buffers (the latent caches and KDA states
// the memory plan already holds), so that loading needs no second copy of the state: beside
// them only the reader's kStateReadChunk buffer and the token ids.
class SequenceSink : public seqstate::StateSink {
 public:
  SequenceSink(const std::string& path, const ModelConfig& config, int layers, int64_t capacity,
               State* state)
      : path_(path), config_(config), layers_(layers), capacity_(capacity), state_(state) {}

  // The header's counts, before the body is read: a state for other --layers is refused first.
  Status Header(const seqstate::StateHeader& h) override {
    if (h.layers != static_cast<uint32_t>(layers_)) {
      return Status::Invalid(path_ + ": saved with --layers " + std::to_string(h.layers) +
                             ", this run has " + std::to_string(layers_) +
                             "; run with the same --layers");
    }
    if (h.n_sections != static_cast<uint32_t>(layers_)) {
      return Status::Invalid(path_ + ": " + std::to_string(h.n_sections) +
                             " layer sections for " + std::to_string(layers_) + " layers");
    }
    return Status::Ok();
  }

  Status Tokens(std::vector<int32_t> tokens) override {
    if (static_cast<int64_t>(tokens.size()) > capacity_) {
      return Status::Invalid(path_ + ": holds " + std::to_string(tokens.size()) +
                             " positions, more than the " + std::to_string(capacity_) +
                             " this run reserves; raise --ctx");
    }
    for (const int32_t id : tokens) {
      if (id >= config_.vocab) {
        return Status::Invalid(path_ + ": token id " + std::to_string(id) +
                               " is not below the vocab " + std::to_string(config_.vocab));
      }
    }
    tokens_ = std::move(tokens);
    return Status::Ok();
  }

  Status Section(uint32_t layer, uint32_t kind, uint64_t n_floats) override {
    const auto L = static_cast<int>(layer);
    const bool mla = config_.is_mla(L);
    if (kind != (mla ? seqstate::kMla : seqstate::kKda)) {
      return Status::Invalid(path_ + ": layer " + std::to_string(L) + " is stored as " +
                             (mla ? "KDA" : "MLA") + " but this model's layer is " +
                             (mla ? "MLA" : "KDA"));
    }
    targets_.clear();
    next_ = 0;
    size_t want = 0;
    if (mla) {
      ops::MlaCache& m = state_->mla[layer];
      want = static_cast<size_t>(static_cast<int64_t>(tokens_.size()) * m.width);
      targets_.push_back({m.data.data(), want});
      m.len = static_cast<int64_t>(tokens_.size());
    } else {
      for (std::vector<float>* v : state_->kda[layer].Buffers()) {
        targets_.push_back({v->data(), v->size()});
        want += v->size();
      }
    }
    if (n_floats != want) {
      return Status::Invalid(path_ + ": layer " + std::to_string(L) + " holds " +
                             std::to_string(n_floats) + " floats, this model's layer needs " +
                             std::to_string(want) + " (a state from another model shape)");
    }
    return Status::Ok();
  }

  void Floats(const float* data, size_t n) override {
    while (n > 0) {  // Section checked that the pieces add up to the targets
      Target& t = targets_[next_];
      const size_t k = std::min(n, t.size - t.filled);
      std::copy(data, data + k, t.dst + t.filled);
      t.filled += k;
      data += k;
      n -= k;
      if (t.filled == t.size) ++next_;
    }
  }

  std::vector<int32_t> TakeTokens() { return std::move(tokens_); }

 private:
  struct Target {
    float* dst;
    size_t size;
    size_t filled = 0;
  };
  const std::string& path_;
  const ModelConfig& config_;
  const int layers_;
  const int64_t capacity_;
  State* state_;
  std::vector<int32_t> tokens_;
  std::vector<Target> targets_;
  size_t next_ = 0;
};

}  // namespace

Status Engine::LoadSequence(const std::string& path, Sequence* seq) const {
  if (seq->length() > 0 || seq->pending() > 0) {
    return Status::Invalid("--load-state: the sequence is not empty");
  }
  State& state = seq->state_;
  SequenceSink sink(path, config_, layers_, seq->capacity(), &state);
  if (Status st = seqstate::ReadSequenceStateInto(env_, path, prepared_->manifest_hash, &sink);
      !st.ok()) {
    state.Reset();  // part of the state may be in the buffers: back to an empty sequence
    return st;
  }
  seq->tokens_ = sink.TakeTokens();
  state.pos = static_cast<int64_t>(seq->tokens_.size());
  return Status::Ok();
}

}  // namespace k3::run
