#include "k3run/engine/speculation.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "k3run/engine/session.h"

namespace k3::run {

Status CheckSpec(int64_t spec, bool sampling) {
  if (spec < 0 || spec > kMaxSpec) {
    return Status::Invalid("--spec " + std::to_string(spec) + ": must be in [0, " +
                           std::to_string(kMaxSpec) + "] (0: off)");
  }
  if (spec > 0 && sampling) {
    return Status::Invalid("--spec needs greedy decoding: exact speculative sampling is not "
                           "implemented; drop --temperature/--top-k/--top-p/--min-p/--seed or "
                           "--spec (penalties are fine: greedy stays an argmax)");
  }
  return Status::Ok();
}

std::vector<int32_t> PromptLookupDraft(std::span<const int32_t> tokens, int64_t max_draft) {
  const auto L = static_cast<int64_t>(tokens.size());
  if (max_draft <= 0) return {};
  for (int64_t n = std::min<int64_t>(kMaxNgram, L - 1); n >= kMinNgram; --n) {
    const std::span<const int32_t> suffix = tokens.subspan(static_cast<size_t>(L - n));
    // The most recent earlier occurrence: start positions from L − n − 1 down to 0.
    for (int64_t at = L - n - 1; at >= 0; --at) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + at)) continue;
      const int64_t from = at + n;  // what followed it (may run into the suffix itself)
      const int64_t len = std::min(max_draft, L - from);
      return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + from + len);
    }
  }
  return {};
}

Drafter ContinuationDrafter(std::vector<int32_t> truth) {
  return [truth = std::move(truth)](std::span<const int32_t>, int64_t generated, int64_t n) {
    const auto from = std::min<size_t>(static_cast<size_t>(std::max<int64_t>(generated, 0)),
                                       truth.size());
    const auto to = std::min<size_t>(from + static_cast<size_t>(std::max<int64_t>(n, 0)),
                                     truth.size());
    return std::vector<int32_t>(truth.begin() + from, truth.begin() + to);
  };
}

double PassCost::DistinctExperts(int64_t rows) const {
  const double n = static_cast<double>(std::max<int64_t>(experts, 1));
  const double keep = 1.0 - static_cast<double>(std::min(topk, experts)) / n;
  return n * (1.0 - std::pow(keep, static_cast<double>(std::max<int64_t>(rows, 1))));
}

double PassCost::Bytes(int64_t rows) const {
  return trunk_bytes + expert_bytes * DistinctExperts(rows);
}

PassCost PassCost::FromEngine(const Engine& engine) {
  PassCost c;
  const ModelConfig& m = engine.config();
  c.experts = std::max(m.n_experts, 1);
  c.topk = std::max(m.topk, 1);
  const prepared::PreparedDir& p = engine.prepared();
  // The trunk a pass reads: every run not pinned (streaming) or every run (from RAM).
  std::vector<int> pinned;
  if (engine.streaming_plan()) pinned = engine.streaming_plan()->pinned;
  for (const prepared::TrunkRun& r : p.manifest.runs) {
    if (r.layer >= engine.layers()) continue;
    if (std::find(pinned.begin(), pinned.end(), r.layer) != pinned.end()) continue;
    c.trunk_bytes += static_cast<double>(r.length);
  }
  const auto& x = p.experts;
  double record = 0;
  for (const prepared::ExpertRecord& rec : x.records) {  // the first one this directory holds
    if (!rec.absent()) {
      record = static_cast<double>(rec.length);
      break;
    }
  }
  const int moe_layers = std::max(0, engine.layers() - m.first_dense);
  c.expert_bytes = record * moe_layers;
  return c;
}

DraftPolicy::DraftPolicy(int64_t max_draft, PassCost cost, bool adaptive)
    : max_draft_(std::max<int64_t>(max_draft, 0)),
      cost_(cost),
      adaptive_(adaptive),
      seconds_(static_cast<size_t>(max_draft_ + 2), 0.0) {}

double DraftPolicy::acceptance() const { return accepted_ / (accepted_ + rejected_); }

double DraftPolicy::RelativeCost(int64_t rows) const {
  const double model = cost_.Bytes(rows) / cost_.Bytes(1);
  const double one = seconds_[1];
  if (rows <= 1 || one <= 0) return model;
  if (seconds_[static_cast<size_t>(rows)] > 0) return seconds_[static_cast<size_t>(rows)] / one;
  for (int64_t r = max_draft_ + 1; r >= 2; --r) {  // the largest row count timed
    const double t = seconds_[static_cast<size_t>(r)];
    const double modelled = cost_.Bytes(r) / cost_.Bytes(1) - 1.0;
    if (t <= 0 || modelled <= 0) continue;
    const double q = std::max(t / one - 1.0, 0.0) / modelled;
    return 1.0 + q * (model - 1.0);
  }
  return model;
}

int64_t DraftPolicy::Length() {
  if (max_draft_ == 0 || !adaptive_) return max_draft_;
  const double p = std::min(acceptance(), 0.999);
  int64_t best = 0;
  double best_rate = 1.0;  // a plain pass: one token per one-row pass
  double tokens = 1.0, term = 1.0;  // expected tokens of a draft of d: Σ_{i ≤ d} p^i
  for (int64_t d = 1; d <= max_draft_; ++d) {
    term *= p;
    tokens += term;
    const double rate = tokens / RelativeCost(d + 1);
    if (rate > best_rate) {
      best_rate = rate;
      best = d;
    }
  }
  probing_ = false;
  if (best > 0) {
    since_probe_ = 0;
    return best;
  }
  if (++since_probe_ >= probe_every_) {
    since_probe_ = 0;
    probing_ = true;
    return std::min(probe_length_, max_draft_);
  }
  return 0;
}

void DraftPolicy::Record(int64_t drafted, int64_t accepted) {
  if (drafted <= 0) return;
  // Decayed counts: the rate follows the text as it changes (a half-life of ~7 verifications).
  constexpr double kDecay = 0.9;
  accepted_ = accepted_ * kDecay + static_cast<double>(accepted);
  rejected_ = rejected_ * kDecay + (accepted < drafted ? 1.0 : 0.0);
  if (probing_) {
    const bool kept = accepted == drafted;
    probe_length_ = kept ? std::min(2 * probe_length_, std::max<int64_t>(max_draft_, 1)) : 1;
    probe_every_ = kept ? std::max<int64_t>(probe_every_ / 2, 2) : kProbeEvery;
    probing_ = false;
  }
}

void DraftPolicy::Observe(int64_t rows, double seconds) {
  if (rows < 1 || rows >= static_cast<int64_t>(seconds_.size()) || !(seconds > 0)) return;
  // A decayed mean per row count: a pass's time varies with the cache's hits and the disk.
  constexpr double kKeep = 0.75;
  double& s = seconds_[static_cast<size_t>(rows)];
  s = s > 0 ? kKeep * s + (1.0 - kKeep) * seconds : seconds;
}

}  // namespace k3::run
