#include "k3run/engine/token_choice.h"

#include "k3run/engine/generate.h"

namespace k3::run {

Result<int32_t> ChooseToken(Sequence* seq, const float* logits, int64_t vocab,
                            std::span<const int32_t> recent) {
  TokenConstraint* constraint = seq->constraint().get();
  if (constraint != nullptr) {
    Result<const float*> masked = constraint->Mask(logits, vocab);
    K3_RETURN_IF_ERROR(masked.status());
    logits = masked.value();
  }
  Sampler& sampler = seq->sampler();
  const int32_t id = sampler.greedy() ? Greedy(logits, vocab) : sampler.Next(logits, vocab, recent);
  if (constraint != nullptr) K3_RETURN_IF_ERROR(constraint->Accept(id));
  return id;
}

}  // namespace k3::run
