// CheckNotShare: needed whether or not Open MPI is built in.
#include "k3run/mpi/scale_out.h"

#include "common/env.h"

namespace k3::run {

Status CheckNotShare(const prepared::PreparedDir& p) {
  if (!p.manifest.share) return Status::Ok();
  const std::string r = std::to_string(p.manifest.share->rank);
  const std::string n = std::to_string(p.manifest.share->ranks);
  return Status::Invalid(p.dir + " holds only rank " + r + " of " + n +
                         "'s share of the experts (k3prep split --ranks " + n + " --rank " + r +
                         "): run it as rank " + r + " of `mpirun -np " + n + " k3run … --mpi` "
                         "(docs/SCALE-OUT.md), or give k3run a full prepared directory");
}

}  // namespace k3::run
