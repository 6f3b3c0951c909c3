// The one place a sequence's next token is chosen from the logits of its last row: Generate,
// speculation's verification and the scheduler all call it, so every front end chooses alike.
#pragma once

#include <cstdint>
#include <span>

#include "common/status.h"
#include "k3run/engine/session.h"

namespace k3::run {

// With the sequence's constraint (if any) applied first: greedy (argmax, lowest id on ties) when
// the sampler is greedy, else the sampler over `recent` (the ids so far, for penalties). Then the
// constraint accepts the id. Fails only when a constraint fails (its grammar has no way on).
Result<int32_t> ChooseToken(Sequence* seq, const float* logits, int64_t vocab,
                            std::span<const int32_t> recent);

}  // namespace k3::run
