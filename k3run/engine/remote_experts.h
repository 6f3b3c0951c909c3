// Routed experts that other processes compute (scale-out over MPI ranks, k3run/mpi/,
// docs/SCALE-OUT.md). The model stays the only place that combines: it hands each MoE layer's
// rows for remote experts over before computing its own experts, and collects their outputs
// into the same slots its own experts fill, so ops::MoeCombine sums them in top-k order exactly
// as in one process (DESIGN.md §11.2a: outputs move, no float is ever summed elsewhere).
//
// Thread safety: called by the thread that runs passes, one call at a time.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "k3run/ops/moe.h"
#include "k3run/weights/weights.h"

namespace k3::run {

// What went to and came back from one other rank (the report's "scale_out").
struct RemoteRankStats {
  int rank = 0;
  uint64_t experts = 0;         // (layer, expert) pairs it computed for this process
  uint64_t rows = 0;            // expert rows it computed
  uint64_t bytes_sent = 0;      // message bytes to it (headers included)
  uint64_t bytes_received = 0;  // message bytes from it
  uint64_t messages = 0;        // requests sent (one per MoE layer per pass that used it)
};

struct RemoteStats {
  int ranks = 1;
  std::string map;              // ExpertMap::Describe()
  double send_seconds = 0;      // wall time handing rows over (until every send completed)
  double wait_seconds = 0;      // wall time waiting for outputs after this process's own experts
  std::vector<RemoteRankStats> per_rank;  // ranks 1 … N−1
};

class RemoteExperts {
 public:
  virtual ~RemoteExperts() = default;

  // Whether routed expert `expert` of MoE layer `layer` is computed in this process.
  virtual bool IsLocal(int layer, int expert) const = 0;
  // Hands over the latent input rows (s.z, one row per token) of the pass's remote experts
  // (`remote`: ascending ids, each chosen by at least one row of `routing`). Returns once the
  // rows are on their way, so they compute while this process computes its own experts.
  virtual Status Send(int layer, const ops::Routing& routing, std::span<const int32_t> remote,
                      const ops::MoeScratch& s) = 0;
  // Waits for every output of the last Send and writes them into s->slots (s->have set). An
  // expert its rank could not compute is appended to stats->missing with its rows counted in
  // stats->experts_skipped, and recorded in Failures() (the run is then invalid, exit 4). A
  // rank that does not answer is an error (kIo) naming the rank and the layer.
  virtual Status Receive(int layer, ops::MoeScratch* s, ops::MoeStats* stats) = 0;
  virtual const std::vector<ExpertFailure>& Failures() const = 0;
  virtual RemoteStats Stats() const = 0;
};

}  // namespace k3::run
