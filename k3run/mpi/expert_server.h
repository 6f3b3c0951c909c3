// Ranks ≥ 1 of a scale-out run (docs/SCALE-OUT.md): compute the routed experts rank 0 sends,
// through this rank's own weight source (its RAM, expert cache or disk), until rank 0 says the
// run is over. Each Work message is one MoE layer's rows for this rank's experts; they run
// through the same ExpertWaves and ops::ExpertForward as on one process (one row per slot,
// topk 1), so every output row has the bits rank 0 would have computed. An expert this rank
// cannot read is named in the Reply; rank 0 then marks the run invalid.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "formats/config.h"
#include "formats/expert_share.h"
#include "k3run/mpi/world.h"
#include "k3run/ops/weights.h"
#include "k3run/weights/weights.h"

namespace k3::run::mpi {

struct ServerStats {
  uint64_t requests = 0;
  uint64_t rows = 0;
  double compute_seconds = 0;  // from a request's arrival to its reply sent
  double idle_seconds = 0;     // waiting for the next request
  ReadCounters bytes;          // read by this rank's source
};

Status ServeExperts(World* world, WeightSource* source, const ModelConfig& config,
                    ServerStats* stats);

}  // namespace k3::run::mpi
