#include "k3run/mpi/scale_out.h"

#include <unistd.h>

#include "common/log.h"
#include "common/progress.h"
#include "formats/expert_share.h"
#include "k3run/mpi/expert_server.h"
#include "k3run/mpi/fault_report.h"
#include "k3run/mpi/handshake.h"
#include "k3run/mpi/mpi_experts.h"
#include "k3run/mpi/world.h"

namespace k3::run {

struct ScaleOut::Impl {
  std::unique_ptr<mpi::World> world;
  ScaleOutOptions options;
  bool handshaken = false;
  std::unique_ptr<mpi::MpiExperts> experts;  // rank 0 after AttachRoot
};

namespace {

std::string RankName(const mpi::World& w) {
  return "k3run rank " + std::to_string(w.rank()) + " of " + std::to_string(w.size());
}

// Bytes of the experts `rank` owns under the map, over every MoE layer.
uint64_t ShareBytes(const prepared::PreparedDir& p, const prepared::ExpertMap& map, int rank) {
  const prepared::ExpertsIndex& idx = p.experts;
  uint64_t total = 0;
  for (uint32_t L = idx.first_moe_layer; L < idx.n_layers; ++L) {
    for (int e = map.Begin(rank); e < map.End(rank); ++e) {
      total += idx.At(L, static_cast<uint32_t>(e)).length;
    }
  }
  return total;
}

}  // namespace

bool ScaleOut::Available() { return true; }

ScaleOut::ScaleOut(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<ScaleOut>> ScaleOut::Start(const ScaleOutOptions& o) {
  auto impl = std::make_unique<Impl>();
  K3_ASSIGN_OR_RETURN(impl->world, mpi::World::Init());
  impl->options = o;
  if (impl->world->rank() == 0) mpi::FaultReport::Install(impl->world->size());
  return std::unique_ptr<ScaleOut>(new ScaleOut(std::move(impl)));
}

ScaleOut::~ScaleOut() {
  mpi::World& w = *impl_->world;
  if (w.rank() == 0) {
    if (!impl_->handshaken) {
      // The other ranks wait in the handshake: tell them rank 0 never got to start.
      mpi::RankIdentity id = mpi::IdentityOf(w, "", nullptr,
                                             "rank 0 stopped before the run started (its error "
                                             "says why)");
      (void)mpi::Handshake(&w, id);
    } else if (impl_->experts && impl_->experts->failed()) {
      LogError(impl_->experts->error());
      LogError("--mpi: the other ranks are in an unknown state after that failure; ending "
               "every rank (MPI_Abort, exit 4)");
      w.Abort(4);
    } else if (impl_->experts) {
      if (Status s = impl_->experts->Shutdown(); !s.ok()) {
        LogError("--mpi: telling the other ranks the run is over: " + s.message());
        w.Abort(4);
      }
    }
  }
  impl_->experts.reset();
  impl_->world.reset();  // MPI_Finalize
}

int ScaleOut::rank() const { return impl_->world->rank(); }
int ScaleOut::size() const { return impl_->world->size(); }

Status ScaleOut::AttachRoot(Engine* engine, const std::string& prepared_path) {
  mpi::World& w = *impl_->world;
  impl_->handshaken = true;
  K3_RETURN_IF_ERROR(
      mpi::Handshake(&w, mpi::IdentityOf(w, prepared_path, &engine->prepared(), "")));
  const ModelConfig& c = engine->config();
  impl_->experts = std::make_unique<mpi::MpiExperts>(&w, DimsFromConfig(c), c.n_experts,
                                                     impl_->options.timeout_s);
  if (w.size() > 1) {
    const prepared::ExpertMap& map = impl_->experts->map();
    engine->RestrictExperts([&map](int, int e) { return map.Owner(e) == 0; });
    engine->SetRemoteExperts(impl_->experts.get());
  }
  LogInfo(RankName(w) + " (" + w.host() + ", pid " + std::to_string(::getpid()) +
          "): trunk, attention, lm_head and sampling here; routed experts " +
          impl_->experts->map().Describe());
  return Status::Ok();
}

Status ScaleOut::RunRank(const std::string& prepared_path, const std::string& model_dir,
                         const PlanOptions& plan) {
  mpi::World& w = *impl_->world;
  impl_->handshaken = true;
  Result<std::unique_ptr<Engine>> opened = Engine::Open(Env::Default(), prepared_path, model_dir);
  const mpi::RankIdentity id =
      mpi::IdentityOf(w, prepared_path, opened.ok() ? &(*opened)->prepared() : nullptr,
                      opened.ok() ? "" : opened.status().message());
  if (Status s = mpi::Handshake(&w, id); !s.ok()) {
    // Rank 0 prints the verdict; this rank says only where it stands.
    return s.WithContext(RankName(w));
  }
  std::unique_ptr<Engine> engine = std::move(opened).value();
  // From here rank 0 counts on this rank: a failure ends every rank at once (MPI_Abort) with
  // this rank's message, never a rank 0 that waits for an answer that cannot come.
  auto fail = [&](const Status& s) {
    LogError(RankName(w) + ": " + s.message());
    w.Abort(static_cast<int>(s.code()));
  };
  const prepared::ExpertMap owned{w.size(), engine->config().n_experts};
  engine->RestrictExperts([&](int, int e) { return owned.Owner(e) == w.rank(); });
  if (Status s = engine->Plan(plan); !s.ok()) fail(s);
  if (Status s = engine->LoadWeights(); !s.ok()) fail(s);
  const ModelConfig& c = engine->config();
  const prepared::ExpertMap map{w.size(), c.n_experts};
  if (impl_->options.lines) {
    const std::string weights = engine->streaming_plan()
                                    ? engine->streaming_plan()->Describe()
                                    : std::string("experts read on first use and kept in RAM");
    LogInfo(RankName(w) + " (" + w.host() + ", pid " + std::to_string(::getpid()) +
            "): routed experts " + std::to_string(map.Begin(w.rank())) + "-" +
            std::to_string(map.End(w.rank()) - 1) + " of " + std::to_string(c.n_experts) +
            " in each of " + std::to_string(c.n_moe_layers()) + " MoE layers (" +
            FormatIecBytes(double(ShareBytes(engine->prepared(), map, w.rank()))) + " in " +
            prepared_path + "); " + weights + "; memory plan " +
            FormatIecBytes(double(engine->memory_plan().total())));
  }
  mpi::ServerStats stats;
  if (Status s = mpi::ServeExperts(&w, engine->weight_source(), c, &stats); !s.ok()) fail(s);
  if (impl_->options.lines) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  ": %llu requests, %llu expert rows; computing %.3f s, waiting for rank 0 "
                  "%.3f s; read ",
                  static_cast<unsigned long long>(stats.requests),
                  static_cast<unsigned long long>(stats.rows), stats.compute_seconds,
                  stats.idle_seconds);
    LogInfo(RankName(w) + buf + FormatIecBytes(double(stats.bytes.total())));
  }
  return Status::Ok();
}

std::optional<RemoteStats> ScaleOut::Stats() const {
  if (!impl_->experts) return std::nullopt;
  return impl_->experts->Stats();
}

}  // namespace k3::run
