// `k3run … --mpi` under mpirun (docs/SCALE-OUT.md): the front ends' one entry to scale-out.
//
// Rank 0 runs k3run as always (prompt, chat, --batch, --spec, --serve), with its engine's
// routed experts outside its own range computed by the other ranks (MpiExperts); every other
// rank serves experts (ServeExperts) until rank 0 is done. Dense trunk work, attention, KDA
// state, lm_head and sampling stay on rank 0: one sequence's trunk is a chain of layer after
// layer that nothing can share out without cutting its matmuls across machines, and keeping it
// in one place means nothing but expert rows ever crosses the network.
// Start-up: every rank opens its prepared directory, then the handshake (handshake.h) refuses
// mismatched binaries, models or shares on every rank at once (exit 2).
// Built without Open MPI, Start() says so (exit 2) and nothing else changes.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "formats/prepared_manifest.h"
#include "k3run/engine/remote_experts.h"
#include "k3run/engine/session.h"

namespace k3::run {

struct ScaleOutOptions {
  double timeout_s = 300;  // --mpi-timeout: how long rank 0 waits for one layer's experts
  bool lines = true;       // ranks ≥ 1 print their plan and totals on stderr
};

class ScaleOut {
 public:
  static bool Available();  // built with Open MPI
  static Result<std::unique_ptr<ScaleOut>> Start(const ScaleOutOptions& o);
  // Rank 0: tells the other ranks the run is over (or, before AttachRoot, that it never
  // started), then MPI_Finalize.
  ~ScaleOut();

  int rank() const;
  int size() const;
  // Rank 0, right after Engine::Open: the handshake, then the engine's remote experts.
  Status AttachRoot(Engine* engine, const std::string& prepared_path);
  // Ranks ≥ 1: the whole run of this rank (open, handshake, plan, load, serve experts).
  Status RunRank(const std::string& prepared_path, const std::string& model_dir,
                 const PlanOptions& plan);
  // Rank 0 after AttachRoot: what went to and came from the other ranks.
  std::optional<RemoteStats> Stats() const;

  struct Impl;

 private:
  explicit ScaleOut(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Without --mpi: a share directory (k3prep split) holds one rank's experts only, so it is
// refused before any pass, naming the share and how to run it.
Status CheckNotShare(const prepared::PreparedDir& p);

}  // namespace k3::run
