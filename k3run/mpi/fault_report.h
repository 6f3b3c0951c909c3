// What rank 0 says when mpirun ends the run under it (docs/SCALE-OUT.md "Faults").
//
// When a rank exits, is killed or aborts, Open MPI's mpirun ends every other rank with SIGTERM
// (then SIGKILL) and prints which rank failed; a rank that is merely slow hits rank 0's
// --mpi-timeout instead. So rank 0 keeps, in lock-free globals, the MoE layer it is at and the
// ranks whose outputs it is waiting for, and its SIGTERM handler prints them, async-signal-safe,
// before exiting with 4 (RUN INVALID): with mpirun's own line the user learns which rank died
// and in which layer, and nothing hangs.
#pragma once

#include <span>

namespace k3::run::mpi {

class FaultReport {
 public:
  // Rank 0 of a run of `size` ranks: installs the SIGTERM handler.
  static void Install(int size);
  // The layer rank 0 is at, and the ranks it waits for (empty: none).
  static void Waiting(int layer, std::span<const int> ranks);
};

}  // namespace k3::run::mpi
