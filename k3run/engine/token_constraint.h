// A constraint on which token a sequence may choose next (constrained decoding: JSON schemas,
// grammars, forced tool calls). The engine knows only this interface; the grammar behind it
// lives in k3run/grammar/ (GrammarConstraint in grammar_constraint.h adapts it).
//
// Contract, so that constrained output is exact and batch-independent:
//   - Mask depends only on the ids accepted so far (never on other sequences, timing or threads);
//   - ChooseToken (token_choice.h) masks a copy of the logits, then chooses exactly as it would
//     unconstrained (greedy: the best allowed id, lowest on ties; sampling: the sampler over the
//     masked logits), then Accepts the id.
// A sequence without a constraint chooses from its logits untouched: the bits of today.
// Thread safety: one sequence's constraint is used by the thread that drives that sequence; an
// implementation may compute ahead on its own threads (the next mask while the pass runs).
#pragma once

#include <cstdint>

#include "common/status.h"

namespace k3::run {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Copies `logits` [vocab] with every id that may not come next set to −infinity and returns
  // the copy (owned by the constraint, valid until the next call). kInvalid when no id may come
  // next (the grammar is at a dead end: a bug in the grammar, never the model's fault).
  virtual Result<const float*> Mask(const float* logits, int64_t vocab) = 0;
  // Advances past `id`, which the last Mask allowed.
  virtual Status Accept(int32_t id) = 0;
};

}  // namespace k3::run
