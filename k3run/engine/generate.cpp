#include "k3run/engine/generate.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace k3::run {

int32_t Greedy(const float* logits, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

int64_t PositionsNeeded(int64_t prompt_len, int64_t gen) {
  return prompt_len + std::max<int64_t>(gen - 1, 0);
}

Result<GenerateResult> Generate(Engine* engine, Sequence* seq, const GenerateOptions& o,
                                const StepCallback& on_step) {
  if (o.prompt.empty()) return Status::Invalid("empty prompt: give at least one token id");
  const int64_t V = engine->config().vocab;
  std::vector<int32_t> all = seq->tokens();  // what the sequence holds + prompt + chosen tokens
  all.insert(all.end(), o.prompt.begin(), o.prompt.end());
  GenerateResult out;
  const int64_t steps = std::max<int64_t>(o.gen, 1);
  for (int64_t s = 0; s < steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    StepRecord rec;
    rec.index = s;
    StepResult pass;
    if (s > 0 && !o.recompute) {
      StepInput in{seq, {all.back()}, Logits::kLast};
      K3_ASSIGN_OR_RETURN(pass, engine->Step(std::span<StepInput>(&in, 1)));
      K3_RETURN_IF_ERROR(engine->Commit(seq, 1));
      rec.tokens_in = 1;
    } else {
      // The prompt (or, recomputing, everything so far) in passes of the plan's chunk.
      std::span<const int32_t> feed(o.prompt);
      if (s > 0) {
        seq->Reset();
        feed = std::span<const int32_t>(all);
      }
      K3_ASSIGN_OR_RETURN(pass, engine->Feed(seq, feed, Logits::kLast));
      rec.tokens_in = static_cast<int64_t>(feed.size());
    }
    const float* logits = pass.LogitsOf(0, V);
    if (o.gen > 0) {
      rec.token = seq->sampler().greedy() ? Greedy(logits, V) : seq->sampler().Next(logits, V, all);
    }
    rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rec.mla_seconds = pass.mla_seconds;
    rec.bytes = pass.bytes;
    rec.source = pass.source;
    out.steps.push_back(rec);
    if (rec.token >= 0) {
      all.push_back(rec.token);
      out.generated.push_back(rec.token);
    }
    if (on_step) K3_RETURN_IF_ERROR(on_step(rec, logits));
    if (rec.token >= 0 &&
        std::find(o.stop_ids.begin(), o.stop_ids.end(), rec.token) != o.stop_ids.end()) {
      out.stopped_by_id = true;
      break;
    }
    if (o.stop_requested && o.stop_requested()) break;
  }
  return out;
}

}  // namespace k3::run
