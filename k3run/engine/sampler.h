// Choosing the next token from logits (DESIGN.md §6 k3run; ORIGINAL-ENGINE.md §6 "Sampler").
//
// Greedy is the default and is exactly Greedy() of k3run/engine/generate.h (argmax, the lowest id
// wins ties), so a run without sampling flags is bit-identical to the --ids path. `--temperature
// 0` is greedy too. Sampling is enabled by --temperature T > 0, or by --top-k, --top-p, --min-p
// or --seed without --temperature (then at temperature 1; SamplerWarnings says so).
//
// The steps, in this order (llama.cpp's order; the truncations see the untempered distribution,
// so the temperature only reweighs the tokens they kept and a high temperature never brings back
// a token top-p or min-p removed):
//   1. penalties, on a copy of the logits, over the last repeat_last_n ids of the sequence
//      (prompt included; each distinct id once, c = its count in that window):
//      repeat (CTRL): l > 0 ? l / r : l × r; then frequency: l −= c × f; presence: l −= p.
//      Greedy (temperature 0 or no sampling flag) is the argmax of the penalised logits;
//   2. p_i = exp(l_i − max) in double; a non-finite or zero sum falls back to argmax;
//      ids sorted by p descending, then id ascending (a total order: no dependence on sort
//      stability or the standard library);
//   3. top-k keeps the first k (0: all);
//   4. top-p keeps the shortest prefix of those whose mass reaches top_p × (their mass);
//   5. min-p keeps those with p ≥ min_p × p_max (at least one id always survives 3–5);
//   6. temperature: q_i = exp((l_i − max) / T) over the kept ids;
//   7. r = u × Σq, walk the kept ids until the running sum exceeds r.
// The generator is documented so a seed reproduces a run anywhere: PCG32 (XSH-RR, O'Neill 2014),
// its state and stream derived by SplitMix64 from (seed XOR turn × 0x9e3779b97f4a7c15); a uniform
// u ∈ [0, 1) takes 53 bits from two PCG32 outputs, one per sampled token. Same seed and turn →
// same tokens.
// Non-goals: DRY, typical-p, mirostat; speculative decoding.
// Thread safety: a Sampler is used by one thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace k3::run {

struct SamplerOptions {
  std::optional<double> temperature;  // finite, >= 0; 0: greedy
  std::optional<double> top_p;        // (0, 1]
  std::optional<int64_t> top_k;       // >= 0; 0 keeps every id
  std::optional<double> min_p;        // [0, 1]; 0 keeps every id
  std::optional<uint64_t> seed;
  // Penalties (llama.cpp's flags and defaults): 1 / 0 are off.
  double repeat_penalty = 1.0;        // finite, > 0
  int64_t repeat_last_n = 64;         // >= 0; 0: no penalty
  double presence_penalty = 0.0;      // finite
  double frequency_penalty = 0.0;     // finite
  bool repeat_last_n_set = false;     // given on the command line (for SamplerWarnings)

  // True when tokens are drawn at random; false: (penalised) argmax.
  bool sampling() const {
    if (temperature) return *temperature > 0;
    return top_p || top_k || min_p || seed;
  }
  // True when a penalty changes the logits.
  bool penalised() const {
    return repeat_last_n > 0 &&
           (repeat_penalty != 1.0 || presence_penalty != 0.0 || frequency_penalty != 0.0);
  }
  // The temperature that sampling uses (1 when only truncation flags or a seed were given).
  double effective_temperature() const { return temperature.value_or(1.0); }
};

// kInvalid naming the flag, the value and the allowed range.
Status ValidateSamplerOptions(const SamplerOptions& o);
// One line per option that has no effect as combined ("--seed has no effect: decoding is
// greedy…"), and a note when sampling runs at the default temperature 1. For stderr.
std::vector<std::string> SamplerWarnings(const SamplerOptions& o);

// PCG32 seeded through SplitMix64 (see above).
class Pcg32 {
 public:
  Pcg32(uint64_t seed, uint64_t turn);
  uint32_t Next();
  double Uniform();  // [0, 1), 53 random bits

 private:
  uint64_t state_ = 0;
  uint64_t inc_ = 1;
};

uint64_t SplitMix64(uint64_t* x);

class Sampler {
 public:
  // `o` must have passed ValidateSamplerOptions. `turn` separates the streams of chat turns.
  Sampler(const SamplerOptions& o, uint64_t seed, uint64_t turn);
  // `recent`: the sequence's ids so far (prompt and generated), oldest first; only the last
  // repeat_last_n are used, and only when a penalty is set.
  int32_t Next(const float* logits, int64_t n, std::span<const int32_t> recent = {});
  // True when Next is exactly Greedy(logits): no sampling and no penalty.
  bool greedy() const { return greedy_; }
  // True when Next draws at random (not a (penalised) argmax): speculation refuses it.
  bool sampling() const { return o_.sampling(); }

 private:
  void Penalise(const float* logits, size_t n, std::span<const int32_t> recent);
  size_t Truncate(size_t n);  // steps 2–5 on l_; returns how many of order_ are kept
  int32_t Draw(size_t kept);  // steps 6–7

  SamplerOptions o_;
  bool greedy_;
  Pcg32 rng_;
  std::vector<double> l_;  // the (penalised) logits
  std::vector<double> p_;
  std::vector<int32_t> order_;
};

}  // namespace k3::run
