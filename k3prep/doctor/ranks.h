// `k3prep doctor DIR --ranks N`: what each rank of an N-rank expert-parallel MPI run needs
// (docs/SCALE-OUT.md, docs/DOCTOR.md "Scale-out"), from the model DIR holds (or the released
// config when DIR holds none).
//
// Per rank: the trunk (every rank's share directory holds trunk.bin and resident.bin whole, as
// `k3prep split` writes it, but only rank 0 reads them in a run), the rank's experts under the
// contiguous map (formats/expert_share.h) and the RAM that holds them (one cache slot each, the
// largest record rounded to 64 B, as k3run's expert cache), a suggested budget, and the disk its
// share directory takes (the files `k3prep split` writes, laid out by PlanShareExperts).
// Budgets: rank 0 gets what the doctor suggests for one process plus its share held in RAM;
// ranks ≥ 1 compute only their experts and read no trunk (k3run plans them experts-only: no
// trunk ring, no pinned layer), so they get their share plus kRankMarginBytes.
// Non-goals: network sizing; the MPI engine's own buffers beyond the margin.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "formats/config.h"

namespace k3::prep {

// What a rank ≥ 1 holds besides its experts: the routed rows and outputs of a pass, scratch,
// the process and MPI's own buffers. Generous on purpose: 256 MB is ~70,000 rows of the
// released 3,584-float latent in and out.
inline constexpr uint64_t kRankMarginBytes = 256'000'000;

// The model facts a per-rank plan needs.
struct ModelSizes {
  ModelConfig config;
  uint64_t trunk_file = 0;       // trunk.bin
  uint64_t resident_file = 0;    // resident.bin
  uint64_t vision_file = 0;      // vision.bin (0: no vision part)
  uint64_t tokenizer_bytes = 0;  // tokenizer files (copied into every share)
  uint64_t manifest_bytes = 0;   // a share's k3.json (exact for a prepared DIR, else estimated)
  std::string basis;             // where the sizes come from, for the report
};

struct RankNeeds {
  int rank = 0;
  int expert_begin = 0, expert_end = 0;  // [begin, end) of every MoE layer
  uint64_t experts = 0;                  // over all MoE layers
  uint64_t trunk_bytes = 0;              // trunk.bin + resident.bin in its directory
  bool reads_trunk = false;              // rank 0 only
  uint64_t share_ram_bytes = 0;          // its experts held in RAM
  uint64_t budget_bytes = 0;             // suggested TOTAL budget
  uint64_t disk_bytes = 0;               // its share directory
};

struct RanksReport {
  int ranks = 0;
  std::string map;        // ExpertMap::Describe()
  std::string basis;      // ModelSizes::basis
  uint64_t rank0_base = 0;  // the one-process budget rank 0's suggestion starts from
  std::vector<RankNeeds> per_rank;
};

// kInvalid naming --ranks when N does not fit the model's experts (ValidateRanks).
Result<RanksReport> PlanRanks(const ModelSizes& m, int ranks, uint64_t rank0_base);

}  // namespace k3::prep
