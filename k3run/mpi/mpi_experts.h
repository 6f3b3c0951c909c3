// Rank 0's side of expert parallelism (docs/SCALE-OUT.md): the RemoteExperts the model calls for
// each MoE layer. Routed experts are owned by ranks under prepared::ExpertMap (contiguous id
// ranges, the same for every layer); rank 0 computes its own range, and for each other rank
// that owns an expert the pass chose, Send packs the chosen rows' latent inputs (ops::MoeScratch
// z, `latent` floats a row) into one Work message and Receive puts the outputs of the Reply into
// the rows' top-k slots. Nothing is summed here: ops::MoeCombine sums the slots on rank 0 in
// top-k order, so the bits equal one process's at every rank count (DESIGN.md §11.2a).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/expert_share.h"
#include "k3run/engine/remote_experts.h"
#include "k3run/mpi/world.h"

namespace k3::run::mpi {

class MpiExperts final : public RemoteExperts {
 public:
  // `world` must outlive this. `timeout_s`: how long a rank may take to answer one layer.
  MpiExperts(World* world, const ops::Dims& dims, int n_experts, double timeout_s);

  bool IsLocal(int layer, int expert) const override;
  Status Send(int layer, const ops::Routing& routing, std::span<const int32_t> remote,
              const ops::MoeScratch& s) override;
  Status Receive(int layer, ops::MoeScratch* s, ops::MoeStats* stats) override;
  const std::vector<ExpertFailure>& Failures() const override { return failures_; }
  RemoteStats Stats() const override;
  // Tells every other rank the run is over (their expert servers return).
  Status Shutdown();

  const prepared::ExpertMap& map() const { return map_; }
  // A send or receive failed (a rank did not answer, a malformed reply): the other ranks are
  // in an unknown state, so the run ends with MPI_Abort rather than a shutdown message.
  bool failed() const { return failed_; }
  const std::string& error() const { return error_; }

 private:
  // One rank's part of the layer in flight: its jobs and, per job, the slots its rows fill.
  struct Outstanding {
    int rank = 0;
    std::vector<int32_t> experts;
    std::vector<std::vector<int64_t>> slots;
    uint64_t rows = 0;
  };

  Status Fail(Status s);  // records a send/receive failure (failed(), error())

  World* world_;
  ops::Dims dims_;
  prepared::ExpertMap map_;
  double timeout_s_;
  bool failed_ = false;
  std::string error_;  // the failure that set failed_
  uint64_t pass_ = 0;  // layers sent so far (a sequence number checked in every reply)
  std::vector<Outstanding> outstanding_;
  std::vector<std::vector<uint64_t>> messages_;  // per outstanding rank, reused
  std::vector<float> rows_;                      // packing buffer
  std::vector<ExpertFailure> failures_;
  RemoteStats stats_;
};

}  // namespace k3::run::mpi
