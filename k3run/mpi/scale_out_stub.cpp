// ScaleOut when k3run is built without Open MPI: --mpi is refused, naming what to install.
#include "k3run/mpi/scale_out.h"

namespace k3::run {

struct ScaleOut::Impl {};

bool ScaleOut::Available() { return false; }

Result<std::unique_ptr<ScaleOut>> ScaleOut::Start(const ScaleOutOptions&) {
  return Status::Invalid("--mpi: this k3run was built without Open MPI; install openmpi-bin and "
                         "libopenmpi-dev (scripts/setup.sh does) and rebuild");
}

ScaleOut::ScaleOut(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ScaleOut::~ScaleOut() = default;
int ScaleOut::rank() const { return 0; }
int ScaleOut::size() const { return 1; }
Status ScaleOut::AttachRoot(Engine*, const std::string&) { return Status::Invalid("--mpi: not built"); }
Status ScaleOut::RunRank(const std::string&, const std::string&, const PlanOptions&) {
  return Status::Invalid("--mpi: not built");
}
std::optional<RemoteStats> ScaleOut::Stats() const { return std::nullopt; }

}  // namespace k3::run
