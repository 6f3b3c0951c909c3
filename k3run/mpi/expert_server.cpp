#include "k3run/mpi/expert_server.h"

#include <algorithm>
#include <chrono>

#include "k3run/engine/expert_waves.h"
#include "k3run/mpi/wire.h"

namespace k3::run::mpi {
namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string ReasonFor(const WeightSource& source, uint32_t layer, uint32_t expert) {
  const std::vector<ExpertFailure>& all = source.Failures();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->layer == static_cast<int>(layer) && it->expert == static_cast<int>(expert)) {
      return "layer " + std::to_string(layer) + " expert " + std::to_string(expert) + ": " +
             it->reason;
    }
  }
  return "layer " + std::to_string(layer) + " expert " + std::to_string(expert) +
         ": could not be read";
}

// A request rank 0 could only send by mistake (another rank's expert, a dense layer): refused
// job by job, so rank 0 reports it instead of this rank computing garbage.
std::string CheckJob(const Work& w, const Job& j, const ModelConfig& c,
                     const prepared::ExpertMap& map, int rank) {
  if (w.layer < static_cast<uint32_t>(c.first_dense) || w.layer >= static_cast<uint32_t>(c.n_layers)) {
    return "layer " + std::to_string(w.layer) + " is not a MoE layer of this model";
  }
  if (j.expert >= static_cast<uint32_t>(c.n_experts) ||
      map.Owner(static_cast<int>(j.expert)) != rank) {
    return "expert " + std::to_string(j.expert) + " of layer " + std::to_string(w.layer) +
           " is not this rank's (" + map.Describe() + ")";
  }
  return "";
}

}  // namespace

Status ServeExperts(World* world, WeightSource* source, const ModelConfig& config,
                    ServerStats* stats) {
  ops::Dims d = DimsFromConfig(config);
  const int64_t Lt = d.latent;
  d.topk = 1;  // one slot per received row
  const prepared::ExpertMap map{world->size(), config.n_experts};
  for (;;) {
    const auto idle0 = std::chrono::steady_clock::now();
    K3_ASSIGN_OR_RETURN(std::vector<uint64_t> msg,
                        world->Receive(0, kTagWork, 0, "rank " + std::to_string(world->rank())));
    stats->idle_seconds += Since(idle0);
    const auto t0 = std::chrono::steady_clock::now();
    K3_ASSIGN_OR_RETURN(Work w, DecodeWork(msg, Lt, "a request from rank 0"));
    if (w.shutdown()) break;
    Reply reply;
    reply.layer = w.layer;
    reply.pass = w.pass;
    reply.n_jobs = static_cast<uint32_t>(w.jobs.size());
    reply.n_rows = w.n_rows;
    ops::Routing routing;
    routing.T = static_cast<int64_t>(w.n_rows);
    routing.topk = 1;
    std::vector<int32_t> chosen;
    for (uint32_t ji = 0; ji < w.jobs.size(); ++ji) {
      const Job& j = w.jobs[ji];
      const std::string bad = CheckJob(w, j, config, map, world->rank());
      if (!bad.empty()) reply.failures.push_back(Failure{ji, bad});
      for (uint32_t q = 0; q < j.rows; ++q) {
        routing.idx.push_back(bad.empty() ? static_cast<int32_t>(j.expert) : -1);
        routing.weight.push_back(1.0f);
      }
      if (bad.empty() && (chosen.empty() || chosen.back() != static_cast<int32_t>(j.expert))) {
        chosen.push_back(static_cast<int32_t>(j.expert));
      }
    }
    ops::MoeScratch s;
    s.T = routing.T;
    s.z.assign(w.rows, w.rows + w.n_rows * static_cast<uint64_t>(Lt));
    s.slots.assign(static_cast<size_t>(w.n_rows * static_cast<uint64_t>(Lt)), 0.0f);
    s.have.assign(static_cast<size_t>(w.n_rows), 0);
    if (std::is_sorted(chosen.begin(), chosen.end())) {
      ExpertWaves waves(source, static_cast<int>(w.layer), d, routing, chosen);
      waves.Start();
      ops::MoeStats moe;
      waves.Run(&s, &moe);
      for (int32_t e : moe.missing) {
        for (uint32_t ji = 0; ji < w.jobs.size(); ++ji) {
          if (w.jobs[ji].expert == static_cast<uint32_t>(e)) {
            reply.failures.push_back(Failure{ji, ReasonFor(*source, w.layer, w.jobs[ji].expert)});
          }
        }
      }
    } else {
      reply.failures.push_back(Failure{0, "the request's experts are not in ascending order"});
    }
    K3_RETURN_IF_ERROR(world->Send(0, EncodeReply(reply, s.slots.data(), Lt), kTagReply));
    stats->requests += 1;
    stats->rows += w.n_rows;
    stats->compute_seconds += Since(t0);
  }
  stats->bytes = source->Counters();
  return Status::Ok();
}

}  // namespace k3::run::mpi
