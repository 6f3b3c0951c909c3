// Exact speculative decoding by prompt lookup (DESIGN.md §11.4, `--spec N`).
//
// Drafts come from the sequence's own tokens: the longest suffix of what it holds that occurred
// before (kMaxNgram down to kMinNgram tokens), at its most recent earlier occurrence; the tokens
// that followed it there are the draft. One pass verifies the last token and the draft (N + 1
// rows, stepped as tentative); the draft's longest prefix that greedy decoding would have chosen
// is kept, plus greedy's own token after it, and Commit drops the rest without another pass
// over the weights. Row i's logits are bit-identical to a one-row pass at that position
// (DESIGN.md §11.2a), so the ids and logits equal plain greedy decoding's.
//
// How long a draft: a pass of r rows costs about the trunk's bytes plus one expert read per
// distinct expert its rows pick (r rows pick n·(1 − (1 − k/n)^r) distinct experts of n per layer
// on average when k are picked per row; at the bench preset's 16 of 256 a 5-row pass touches ~77
// against 16). With acceptance rate p per drafted token, a draft of d yields (1 − p^(d+1))/(1 − p)
// tokens; DraftPolicy picks the d ≤ N with the most tokens per unit of pass cost, from the
// running acceptance rate. When that is 0 it still drafts one token every kProbeEvery passes, so
// the rate can recover when the text turns repetitive; a probe kept whole makes the next one
// twice as long and twice as soon (a refused one starts over), so a repetitive passage is
// learned in a few probes rather than a few dozen.
// Bytes are only the prior: what an extra row really costs depends on the expert cache's hits
// and on compute (at 1.5 GB on 2 cores the byte model priced a 5-row pass at 4.8 one-row
// passes where forced drafts measured 3.3, and the policy drafted once in 32 passes where forced
// drafts were 1.39x faster). So the policy times its passes (Observe) and scales the byte
// model's extra cost per row count by what the measured passes showed.
// Thread safety: none (one per sequence).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "common/status.h"

namespace k3::run {

class Engine;

inline constexpr int kMinNgram = 2;    // a shorter match is too weak a hint
inline constexpr int kMaxNgram = 8;
inline constexpr int kProbeEvery = 16;
inline constexpr int64_t kMaxSpec = 16;  // --spec's upper bound

// The rules every speculative run obeys (kInvalid naming --spec otherwise): spec in [0,
// kMaxSpec], and greedy decoding when spec > 0 (`sampling`: the sampler draws at random).
Status CheckSpec(int64_t spec, bool sampling);

// Up to max_draft tokens that followed the most recent earlier occurrence of the longest suffix
// of `tokens` (kMinNgram..kMaxNgram long); empty when no suffix recurs.
std::vector<int32_t> PromptLookupDraft(std::span<const int32_t> tokens, int64_t max_draft);

// Where drafts come from instead of the lookup: given the ids so far, the count generated and
// the most to draft, up to that many ids. Any draft gives the same output; only passes differ.
using Drafter = std::function<std::vector<int32_t>(std::span<const int32_t> ids,
                                                   int64_t generated, int64_t n)>;
// Drafts from a known continuation (`--spec-oracle`, a batch line's "spec_oracle": a plain run's
// generated ids): after g generated tokens, truth[g, g + n). Synthetic weights never repeat
// text, so tests and benchmarks need it to keep drafts.
Drafter ContinuationDrafter(std::vector<int32_t> truth);

// The byte cost of a pass by its rows, from the plan: what the trunk costs each pass (streamed
// from disk, or read from RAM when resident) and what one expert costs per MoE layer.
struct PassCost {
  double trunk_bytes = 0;       // per pass, whatever its rows
  double expert_bytes = 0;      // one expert record, times the MoE layers
  int64_t experts = 1;          // routed experts per layer (n)
  int64_t topk = 1;             // picked per row (k)
  double DistinctExperts(int64_t rows) const;  // expected, per layer
  double Bytes(int64_t rows) const;
  static PassCost FromEngine(const Engine& engine);
};

class DraftPolicy {
 public:
  // `adaptive` false: always max_draft (`--spec-fixed`, to measure what drafts cost when forced).
  DraftPolicy(int64_t max_draft, PassCost cost, bool adaptive = true);
  // The draft length to try next (0..max_draft).
  int64_t Length();
  // After a verifying pass: `drafted` tokens proposed, the first `accepted` kept.
  void Record(int64_t drafted, int64_t accepted);
  // After every decode pass, plain (1 row) or verifying (drafted + 1 rows): its wall seconds.
  void Observe(int64_t rows, double seconds);
  double acceptance() const;  // the running estimate
  // A pass of `rows` rows in units of a one-row pass: the byte model's ratio until passes were
  // timed, then 1 + q·(model − 1), q = measured ÷ modelled extra cost at the largest row count
  // timed (or the measured ratio itself for a row count that was timed).
  double RelativeCost(int64_t rows) const;

 private:
  int64_t max_draft_;
  PassCost cost_;
  bool adaptive_;
  double accepted_ = 1, rejected_ = 1;  // decayed counts, a weak prior of p = 0.5
  int64_t since_probe_ = 0;
  int64_t probe_length_ = 1, probe_every_ = kProbeEvery;
  bool probing_ = false;  // the last Length() was a probe
  std::vector<double> seconds_;  // [rows]: decayed mean seconds of a pass of that many rows; 0: none
};

// Per-run totals for the report.
struct SpecStats {
  int64_t passes = 0;    // decode passes (one per verification, or plain)
  int64_t drafted = 0;   // draft tokens verified
  int64_t accepted = 0;  // of which kept
};

}  // namespace k3::run
