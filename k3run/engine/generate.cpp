#include "k3run/engine/generate.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <vector>

#include "k3run/engine/token_choice.h"
#include "k3run/kernels/argmax.h"

namespace k3::run {

int32_t Greedy(const float* logits, int64_t n) { return kernels::ArgMax(logits, n); }

int64_t PositionsNeeded(int64_t prompt_len, int64_t gen) {
  return prompt_len + std::max<int64_t>(gen - 1, 0);
}

double PassMultiplyAdds(const Engine& engine, int64_t rows, int64_t positions_before,
                        int64_t logits_rows) {
  // The trunk's size comes from the prepared directory's runs; an engine without one (made
  // WithSource, as tests do) has no count.
  if (!engine.has_prepared()) return 0;
  const ModelConfig& c = engine.config();
  const int layers = engine.layers();
  double trunk = 0;
  for (const prepared::TrunkRun& t : engine.prepared().manifest.runs) {
    if (t.layer < layers) trunk += double(t.length) / 2;
  }
  int moe = 0, mla = 0, kda = 0;
  for (int l = 0; l < layers; ++l) {
    if (!c.is_dense(l)) ++moe;
    if (c.is_mla(l)) {
      ++mla;
    } else {
      ++kda;
    }
  }
  const double per_row = trunk + double(moe) * c.topk * 3.0 * c.latent * c.moe_inter +
                         double(kda) * 3.0 * c.kda_heads * double(c.kda_head_dim) * c.kda_head_dim;
  // Row i attends positions_before + i + 1 positions.
  const double attended = double(rows) * double(positions_before) +
                          double(rows) * double(rows + 1) / 2;
  return double(rows) * per_row +
         double(mla) * c.n_heads * (2.0 * c.kv_lora + c.qk_rope) * attended +
         double(logits_rows) * double(c.vocab) * double(c.hidden);
}

namespace {

// One Generate call: the ids so far, the result, and how a chosen token is handed on.
class Loop {
 public:
  Loop(Engine* engine, Sequence* seq, const GenerateOptions& o, const StepCallback& on_step)
      : engine_(engine), seq_(seq), o_(o), on_step_(on_step), V_(engine->config().vocab) {
    all_ = seq->tokens();  // what the sequence holds + prompt + chosen tokens
    all_.insert(all_.end(), o.prompt.begin(), o.prompt.end());
  }

  Status Prefill();
  // One decode step: a plain one-row pass, or a verifying pass of a draft. False: finished.
  Result<bool> Decode(DraftPolicy* policy);
  GenerateResult Take() { return std::move(out_); }
  bool finished() const { return finished_; }

 private:
  Result<int32_t> Choose(const float* logits, std::span<const int32_t> recent) {
    return ChooseToken(seq_, logits, V_, recent);
  }
  // Records a step (and its token, if any), runs the callback and the stop rules. False: stop.
  Result<bool> Emit(const StepRecord& rec, const float* logits);
  Result<bool> Verify(std::vector<int32_t> draft, DraftPolicy* policy);
  static StepRecord FromPass(int64_t index, int64_t rows, const StepResult& pass,
                             std::chrono::steady_clock::time_point t0);

  Engine* engine_;
  Sequence* seq_;
  const GenerateOptions& o_;
  const StepCallback& on_step_;
  int64_t V_;
  std::vector<int32_t> all_;
  GenerateResult out_;
  bool finished_ = false;
};

StepRecord Loop::FromPass(int64_t index, int64_t rows, const StepResult& pass,
                          std::chrono::steady_clock::time_point t0) {
  StepRecord rec;
  rec.index = index;
  rec.tokens_in = rows;
  rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rec.times = pass.times;
  rec.bytes = pass.bytes;
  rec.source = pass.source;
  return rec;
}

Result<bool> Loop::Emit(const StepRecord& rec, const float* logits) {
  out_.steps.push_back(rec);
  if (rec.token >= 0) {
    all_.push_back(rec.token);
    out_.generated.push_back(rec.token);
  }
  if (on_step_) K3_RETURN_IF_ERROR(on_step_(rec, logits));
  if (rec.token >= 0 &&
      std::find(o_.stop_ids.begin(), o_.stop_ids.end(), rec.token) != o_.stop_ids.end()) {
    out_.stopped_by_id = true;
    return false;
  }
  if (o_.stop_requested && o_.stop_requested()) return false;
  return static_cast<int64_t>(out_.generated.size()) < o_.gen;
}

Status Loop::Prefill() {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t before = seq_->length();
  K3_ASSIGN_OR_RETURN(StepResult pass, engine_->Feed(seq_, o_.prompt, Logits::kLast));
  const float* logits = pass.LogitsOf(0, V_);
  StepRecord rec = FromPass(0, static_cast<int64_t>(o_.prompt.size()), pass, t0);
  rec.multiply_adds = PassMultiplyAdds(*engine_, rec.tokens_in, before, 1);
  if (o_.gen > 0) {
    K3_ASSIGN_OR_RETURN(rec.token, Choose(logits, all_));
  }
  rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  K3_ASSIGN_OR_RETURN(bool more, Emit(rec, logits));
  finished_ = !more;
  return Status::Ok();
}

Result<bool> Loop::Decode(DraftPolicy* policy) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto index = static_cast<int64_t>(out_.steps.size());
  if (o_.recompute) {
    // Everything so far again, from an empty sequence (the O(T²) check path).
    std::shared_ptr<TokenConstraint> constraint = seq_->constraint();  // Reset drops it
    seq_->Reset();
    seq_->constraint() = std::move(constraint);
    K3_ASSIGN_OR_RETURN(StepResult pass, engine_->Feed(seq_, all_, Logits::kLast));
    StepRecord rec = FromPass(index, static_cast<int64_t>(all_.size()), pass, t0);
    K3_ASSIGN_OR_RETURN(rec.token, Choose(pass.LogitsOf(0, V_), all_));
    return Emit(rec, pass.LogitsOf(0, V_));
  }
  if (policy != nullptr) {
    // A draft never runs past the tokens asked for nor the sequence's positions.
    const int64_t left = o_.gen - static_cast<int64_t>(out_.generated.size());
    const int64_t room = seq_->capacity() - seq_->length() - 1;
    const int64_t scratch = engine_->chunk() - 1;  // the plan's scratch holds chunk() rows
    const int64_t want = std::min({policy->Length(), left - 1, room, scratch});
    std::vector<int32_t> draft =
        want <= 0 ? std::vector<int32_t>()
        : o_.drafter ? o_.drafter(all_, static_cast<int64_t>(out_.generated.size()), want)
                     : PromptLookupDraft(all_, want);
    if (static_cast<int64_t>(draft.size()) > want) draft.resize(static_cast<size_t>(std::max<int64_t>(want, 0)));
    if (!draft.empty()) return Verify(std::move(draft), policy);
  }
  StepInput in{seq_, {all_.back()}, Logits::kLast};
  K3_ASSIGN_OR_RETURN(StepResult pass, engine_->Step(std::span<StepInput>(&in, 1)));
  K3_RETURN_IF_ERROR(engine_->Commit(seq_, 1));
  if (policy != nullptr) policy->Observe(1, pass.seconds);
  ++out_.spec.passes;
  StepRecord rec = FromPass(index, 1, pass, t0);
  K3_ASSIGN_OR_RETURN(rec.token, Choose(pass.LogitsOf(0, V_), all_));
  return Emit(rec, pass.LogitsOf(0, V_));
}

// One pass over the last token and the draft; keeps what greedy would have chosen.
Result<bool> Loop::Verify(std::vector<int32_t> draft, DraftPolicy* policy) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto k = static_cast<int64_t>(draft.size());
  StepInput in{seq_, {all_.back()}, Logits::kAll, /*tentative=*/true};
  in.ids.insert(in.ids.end(), draft.begin(), draft.end());
  K3_ASSIGN_OR_RETURN(StepResult pass, engine_->Step(std::span<StepInput>(&in, 1)));
  // Row i's token, chosen as plain decoding would: the recent ids are the kept draft so far.
  std::vector<int32_t> chosen;
  std::vector<int32_t> recent = all_;
  for (int64_t i = 0; i <= k; ++i) {
    K3_ASSIGN_OR_RETURN(const int32_t id, Choose(pass.LogitsOf(0, V_) + i * V_, recent));
    chosen.push_back(id);
    if (i == k || chosen.back() != draft[static_cast<size_t>(i)]) break;
    recent.push_back(chosen.back());
  }
  const int64_t accepted = static_cast<int64_t>(chosen.size()) - 1;
  policy->Record(k, accepted);
  policy->Observe(k + 1, pass.seconds);
  ++out_.spec.passes;
  out_.spec.drafted += k;
  out_.spec.accepted += accepted;
  // Emit token by token; the rows kept are those whose tokens were emitted (the last emitted
  // token is fed by the next step, as in plain decoding).
  int64_t emitted = 0;
  bool more = true;
  Status failed;
  for (int64_t i = 0; i < static_cast<int64_t>(chosen.size()) && more; ++i) {
    StepRecord rec = i == 0 ? FromPass(static_cast<int64_t>(out_.steps.size()), k + 1, pass, t0)
                            : StepRecord{};
    rec.index = static_cast<int64_t>(out_.steps.size());
    if (i == 0) {
      rec.drafted = k;
      rec.accepted = accepted;
    }
    rec.token = chosen[static_cast<size_t>(i)];
    ++emitted;
    Result<bool> r = Emit(rec, pass.LogitsOf(0, V_) + i * V_);
    if (!r.ok()) {
      failed = r.status();
      break;
    }
    more = *r;
  }
  K3_RETURN_IF_ERROR(engine_->Commit(seq_, emitted));
  K3_RETURN_IF_ERROR(failed);
  return more;
}

}  // namespace

Result<GenerateResult> Generate(Engine* engine, Sequence* seq, const GenerateOptions& o,
                                const StepCallback& on_step) {
  if (o.prompt.empty()) return Status::Invalid("empty prompt: give at least one token id");
  K3_RETURN_IF_ERROR(CheckSpec(o.spec, seq->sampler().sampling()));
  if (o.spec > 0 && seq->constraint() != nullptr) {
    // Verifying a draft would need the constraint's state after each drafted id: not built.
    return Status::Invalid("--spec cannot be combined with a grammar or JSON schema "
                           "(--grammar, --json-schema, --tools): drop --spec");
  }
  Loop loop(engine, seq, o, on_step);
  K3_RETURN_IF_ERROR(loop.Prefill());
  std::optional<DraftPolicy> policy;
  if (o.spec > 0) policy.emplace(o.spec, PassCost::FromEngine(*engine), !o.spec_fixed);
  bool more = !loop.finished();
  while (more) {
    K3_ASSIGN_OR_RETURN(more, loop.Decode(policy ? &*policy : nullptr));
  }
  return loop.Take();
}

}  // namespace k3::run
