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
  std::vector<int32_t> all = o.prompt;  // prompt + chosen tokens
  GenerateResult out;
  const int64_t steps = std::max<int64_t>(o.gen, 1);
  for (int64_t s = 0; s < steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    StepInput in{seq, {}, Logits::kLast};
    if (s > 0 && !o.recompute) {
      in.ids.assign(1, all.back());
    } else {
      if (s > 0) seq->Reset();
      in.ids = all;
    }
    K3_ASSIGN_OR_RETURN(StepResult pass, engine->Step(std::span<StepInput>(&in, 1)));
    K3_RETURN_IF_ERROR(engine->Commit(seq, static_cast<int64_t>(in.ids.size())));
    const float* logits = pass.LogitsOf(0, V);
    StepRecord rec;
    rec.index = s;
    rec.tokens_in = static_cast<int64_t>(in.ids.size());
    if (o.gen > 0) {
      rec.token = seq->sampler().greedy() ? Greedy(logits, V) : seq->sampler().Next(logits, V, all);
    }
    rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
