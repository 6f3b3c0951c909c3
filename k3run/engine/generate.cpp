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

Result<GenerateResult> Generate(Model* model, WeightSource* weights, const GenerateOptions& o,
                                const StepCallback& on_step) {
  if (o.prompt.empty()) return Status::Invalid("empty prompt: give at least one token id");
  const int64_t V = model->vocab();
  State state = State::Make(model->config(), model->layers(),
                            PositionsNeeded(static_cast<int64_t>(o.prompt.size()), o.gen));
  std::vector<int32_t> seq = o.prompt;
  std::vector<float> logits(static_cast<size_t>(V));
  GenerateResult out;
  const int64_t steps = std::max<int64_t>(o.gen, 1);
  for (int64_t s = 0; s < steps; ++s) {
    weights->SetStep(s);
    const ReadCounters before = weights->Counters();
    const SourceCounters source_before = weights->Source();
    const auto t0 = std::chrono::steady_clock::now();
    const int32_t* feed = seq.data();
    int64_t T = static_cast<int64_t>(seq.size());
    if (s > 0 && !o.recompute) {
      feed = &seq.back();
      T = 1;
    } else if (s > 0) {
      state.Reset();
    }
    K3_RETURN_IF_ERROR(model->Forward(feed, T, &state, /*all_rows=*/false, logits.data()));
    StepRecord rec;
    rec.index = s;
    rec.tokens_in = T;
    if (o.gen > 0) rec.token = o.choose ? o.choose(logits.data(), V) : Greedy(logits.data(), V);
    rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rec.bytes = weights->Counters() - before;
    rec.source = weights->Source() - source_before;
    out.steps.push_back(rec);
    if (rec.token >= 0) {
      seq.push_back(rec.token);
      out.generated.push_back(rec.token);
    }
    if (on_step) K3_RETURN_IF_ERROR(on_step(rec, logits.data()));
    if (rec.token >= 0 &&
        std::find(o.stop_ids.begin(), o.stop_ids.end(), rec.token) != o.stop_ids.end()) {
      out.stopped_by_id = true;
      break;
    }
  }
  return out;
}

}  // namespace k3::run
