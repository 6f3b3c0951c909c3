// Engine::SaveSequence / LoadSequence: a Sequence to and from formats/sequence_state.h's file.
// Sections: per KDA layer S ‖ hist_q ‖ hist_k ‖ hist_v; per MLA layer the latent cache rows
// [0, length). Positions past the length are never read, so they are not stored.
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

// kInvalid naming the file, the layer and both sizes when a section does not fit this engine.
Status CheckSectionSize(const std::string& path, const seqstate::StateSection& s, size_t want) {
  if (s.data.size() == want) return Status::Ok();
  return Status::Invalid(path + ": layer " + std::to_string(s.layer) + " holds " +
                         std::to_string(s.data.size()) + " floats, this model's layer needs " +
                         std::to_string(want) + " (a state from another model shape)");
}

}  // namespace

Status Engine::SaveSequence(const Sequence& seq, const std::string& path) const {
  if (seq.pending() > 0) {
    return Status::Invalid("--save-state: the sequence has rows not committed");
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

Status Engine::LoadSequence(const std::string& path, Sequence* seq) const {
  if (seq->length() > 0 || seq->pending() > 0) {
    return Status::Invalid("--load-state: the sequence is not empty");
  }
  K3_ASSIGN_OR_RETURN(seqstate::SequenceState st,
                      seqstate::ReadSequenceState(env_, path, prepared_->manifest_hash));
  if (st.layers != static_cast<uint32_t>(layers_)) {
    return Status::Invalid(path + ": saved with --layers " + std::to_string(st.layers) +
                           ", this run has " + std::to_string(layers_) +
                           "; run with the same --layers");
  }
  const auto n = static_cast<int64_t>(st.tokens.size());
  if (n > seq->capacity()) {
    return Status::Invalid(path + ": holds " + std::to_string(n) + " positions, more than the " +
                           std::to_string(seq->capacity()) + " this run reserves; raise --ctx");
  }
  if (st.sections.size() != static_cast<size_t>(layers_)) {
    return Status::Invalid(path + ": " + std::to_string(st.sections.size()) +
                           " layer sections for " + std::to_string(layers_) + " layers");
  }
  for (const int32_t id : st.tokens) {
    if (id >= config_.vocab) {
      return Status::Invalid(path + ": token id " + std::to_string(id) + " is not below the vocab " +
                             std::to_string(config_.vocab));
    }
  }
  State& state = seq->state_;
  for (const seqstate::StateSection& s : st.sections) {
    const auto L = static_cast<int>(s.layer);
    const bool mla = config_.is_mla(L);
    if (s.kind != (mla ? seqstate::kMla : seqstate::kKda)) {
      return Status::Invalid(path + ": layer " + std::to_string(L) + " is stored as " +
                             (mla ? "KDA" : "MLA") + " but this model's layer is " +
                             (mla ? "MLA" : "KDA"));
    }
    const auto l = static_cast<size_t>(L);
    if (mla) {
      ops::MlaCache& m = state.mla[l];
      K3_RETURN_IF_ERROR(CheckSectionSize(path, s, static_cast<size_t>(n * m.width)));
      std::copy(s.data.begin(), s.data.end(), m.data.begin());
      m.len = n;
    } else {
      ops::KdaState& k = state.kda[l];
      K3_RETURN_IF_ERROR(CheckSectionSize(path, s, k.Floats()));
      auto it = s.data.begin();
      for (std::vector<float>* v : k.Buffers()) {
        std::copy(it, it + static_cast<ptrdiff_t>(v->size()), v->begin());
        it += static_cast<ptrdiff_t>(v->size());
      }
    }
  }
  state.pos = n;
  seq->tokens_ = st.tokens;
  return Status::Ok();
}

}  // namespace k3::run
