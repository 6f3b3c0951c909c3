// Scale-out (docs/SCALE-OUT.md): which MPI rank computes each routed expert, and the share of a
// prepared directory made for one rank by `k3prep split`.
//
// Goals: one deterministic map that k3prep split, k3verify and k3run (every rank) compute the
// same way from (ranks, n_experts) alone, so nothing but N travels between them.
// The map is "contiguous": rank r owns experts [Begin(r), End(r)) of EVERY MoE layer, with
// Begin(r) = floor(r · n_experts / ranks). Ranks ≤ n_experts, so no rank owns nothing.
// A share directory holds the whole trunk and resident file and only its rank's experts: the
// other experts' records in experts.idx carry kExpertFlagAbsent (all other fields zero), and
// k3.json says which share it is (Manifest::share).
// Identity: ModelIdentity hashes what every directory of one model has in common whatever its
// share or expert mode (the resolved config and the trunk and resident regions with their
// hashes), so ranks compare it at start and refuse another model's directory.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/hash.h"
#include "common/status.h"
#include "formats/config.h"

namespace k3::prepared {

struct Manifest;

inline constexpr int kMaxRanks = 4096;
// The only map of version 1 (k3.json "share.map").
inline constexpr std::string_view kContiguousMap = "contiguous";

struct ExpertMap {
  int ranks = 1;
  int n_experts = 0;

  int Begin(int rank) const {
    return static_cast<int>(int64_t{rank} * n_experts / ranks);
  }
  int End(int rank) const { return Begin(rank + 1); }
  // The rank that owns `expert` (0 ≤ expert < n_experts).
  int Owner(int expert) const;
  // "contiguous over 4 ranks: rank 0 experts 0-95, rank 1 96-191, …" (ranges inclusive).
  std::string Describe() const;
};

// kInvalid naming `what` (e.g. "--ranks") unless 1 ≤ ranks ≤ min(n_experts, kMaxRanks)
// (n_experts 0, a model without MoE layers, allows ranks = 1 only).
Status ValidateRanks(int ranks, int n_experts, const std::string& what);
// The n_experts a config's map is over: num_experts, or 0 when it has no MoE layer.
int RoutedExperts(const ModelConfig& c);

// The share a prepared directory holds (k3.json "share"; absent for a full directory).
struct ExpertShare {
  uint32_t ranks = 0;  // N of the run it was made for
  uint32_t rank = 0;   // this directory holds rank `rank`'s experts only
  std::string map = "contiguous";  // the only map of version 1

  ExpertMap Map(int n_experts) const { return ExpertMap{static_cast<int>(ranks), n_experts}; }
  // Whether this share holds routed expert `expert` (of every MoE layer).
  bool Holds(int expert, int n_experts) const {
    return Map(n_experts).Owner(expert) == static_cast<int>(rank);
  }
};

// "rank 1 of 4 (contiguous)".
std::string DescribeShare(const ExpertShare& s);
// Why an absent expert cannot be used here: "not in this prepared directory (it holds rank 1 of
// 4's share; run it as rank 1 of mpirun -np 4 … --mpi)". k3run's ExpertFailure reason and
// k3verify's tensor lookups say the same.
std::string AbsentExpertReason(const ExpertShare& s);

// XXH3-128 over the canonical config JSON and every trunk and resident region's name, file,
// offset, length and xxh3_128, in layout order: equal for every directory packed or split from
// one model, different when any trunk byte differs. Every field is length-prefixed or
// fixed-width (the byte string is in docs/FORMATS.md "Shares"), so no two field lists collide.
Hash128 ModelIdentity(const Manifest& m);

}  // namespace k3::prepared
