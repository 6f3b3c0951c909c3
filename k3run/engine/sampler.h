// Choosing the next token from logits (DESIGN.md §6 k3run; ORIGINAL-ENGINE.md §6 "Sampler").
//
// Greedy is the default and is exactly Greedy() of k3run/engine/generate.h (argmax, the lowest id wins ties),
// so a run without sampling flags is bit-identical to the --ids path. Sampling is enabled by any
// of --temperature, --top-p, --top-k, --seed (temperature 1 when not given):
//   1. p_i = exp((l_i − max) / T) in double; a non-finite or zero sum falls back to argmax;
//   2. ids sorted by p descending, then id ascending (a total order: no dependence on sort
//      stability or the standard library);
//   3. top-k keeps the first k (0: all); top-p keeps the shortest prefix whose mass reaches
//      top_p × Σp (at least one id);
//   4. r = u × (kept mass), walk the prefix until the running sum exceeds r.
// The generator is documented so a seed reproduces a run anywhere: PCG32 (XSH-RR, O'Neill 2014),
// its state and stream derived by SplitMix64 from (seed XOR turn × 0x9e3779b97f4a7c15); a uniform
// u ∈ [0, 1) takes 53 bits from two PCG32 outputs. Same seed and turn → same tokens.
// Non-goals: repetition penalties, min-p, speculative decoding.
// Thread safety: a Sampler is used by one thread.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "common/status.h"

namespace k3::run {

struct SamplerOptions {
  std::optional<double> temperature;  // finite, > 0
  std::optional<double> top_p;        // (0, 1]
  std::optional<int64_t> top_k;       // ≥ 0; 0 keeps every id
  std::optional<uint64_t> seed;
  // True when any flag asks for sampling; false: greedy.
  bool sampling() const { return temperature || top_p || top_k || seed; }
};

// kInvalid naming the flag, the value and the allowed range.
Status ValidateSamplerOptions(const SamplerOptions& o);

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
  int32_t Next(const float* logits, int64_t n);
  bool greedy() const { return greedy_; }

 private:
  bool greedy_;
  double temperature_;
  double top_p_;
  int64_t top_k_;
  Pcg32 rng_;
  std::vector<double> p_;
  std::vector<int32_t> order_;
};

}  // namespace k3::run
