// The values of a synthetic checkpoint: deterministic from --seed, identical on any machine.
//
// Determinism: only integer arithmetic and exactly rounded IEEE operations (+ − × / and
// conversions; frexp/ldexp, which are exact) are used: no libm transcendentals, whose last bit
// differs between libm versions. The whole tree builds with -ffp-contract=off, so no FMA
// contraction changes a rounding either.
//
// Generator (docs/SYNTH.md "Generator"): a counter-based PRNG. Every tensor has a key
// K = SplitMix64(seed XOR FNV-1a-64(name)); its element i draws r = SplitMix64(K + (i+1)·γ)
// (γ = 0x9E3779B97F4A7C15, i.e. element i of the SplitMix64 stream seeded with K). So any
// element range of any tensor can be generated alone, in any order, on any thread: output never
// depends on the thread count. A normal draw is Irwin–Hall(4): the four 16-bit halves of r
// summed, centred and scaled to unit variance (range ±3.46σ).
//
// MXFP4 experts: normally the quantiser of formats/mxfp4 applied to normal draws (element
// (row, col) of matrix w1|w2|w3 draws from the key of its weight_packed tensor at index
// row·cols + col). When the layout's experts exceed 1 GB (bench), quantising 32 G draws costs
// more than the disk takes to write them, so codes are instead drawn from the exact
// distribution the quantiser produces (DESIGN.md §8 shortcut): per matrix std, 16,384 groups
// are quantised once (fixed key, independent of --seed), the frequencies of scale bytes and of
// codes are turned into 65,536-entry lookup tables by integer largest-remainder rounding, and
// each group then takes its scale from one 16-bit draw and each packed byte (two codes, drawn
// independently) from one 16-bit draw of its counter stream.
//
// Thread safety: a WeightGenerator is immutable after construction; Fill may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "k3prep/synth/layout.h"

namespace k3::synth {

uint64_t SplitMix64(uint64_t x);
// The per-tensor key.
uint64_t TensorKey(uint64_t seed, std::string_view name);
// Element `index` of the stream keyed by `key`.
inline uint64_t Draw(uint64_t key, uint64_t index) {
  return SplitMix64(key + (index + 1) * 0x9E3779B97F4A7C15ull);
}
// Irwin–Hall(4) approximately-N(0,1) value from one 64-bit draw.
float NormalFromBits(uint64_t r);
// fp32 → bf16 bits, round to nearest even (NaN → quiet NaN).
uint16_t Bf16FromF32(float f);

// One unit of generation: either elements [first, first + count) of a non-expert tensor, or
// a whole expert (its six tensors starting at `tensor`, the w1.weight_packed index).
struct Job {
  size_t tensor = 0;
  uint64_t first = 0;
  uint64_t count = 0;
  bool expert = false;
  uint64_t nbytes = 0;
};

// The jobs that produce shard `shard`'s data section in file order; non-expert tensors are split
// into jobs of at most `max_job_bytes`.
std::vector<Job> ShardJobs(const Layout& layout, size_t shard, uint64_t max_job_bytes);

class WeightGenerator {
 public:
  // Experts whose total exceeds this use the code-table shortcut.
  static constexpr uint64_t kShortcutExpertBytes = 1'000'000'000;

  WeightGenerator(const Layout& layout, uint64_t seed);
  ~WeightGenerator();
  bool expert_shortcut() const { return shortcut_; }

  // Writes job.nbytes bytes to dst.
  void Fill(const Job& job, uint8_t* dst) const;

 private:
  struct Tables;
  void FillElements(const TensorPlan& t, uint64_t first, uint64_t count, uint8_t* dst) const;
  void FillExpert(size_t w1_packed, uint8_t* dst) const;
  const Tables& TablesFor(float sd) const;

  const Layout& layout_;
  uint64_t seed_;
  bool shortcut_;
  std::vector<std::pair<float, std::unique_ptr<Tables>>> tables_;  // by matrix std
};

}  // namespace k3::synth
