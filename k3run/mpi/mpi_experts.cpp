#include "k3run/mpi/mpi_experts.h"

#include <algorithm>
#include <chrono>

#include "k3run/mpi/fault_report.h"
#include "k3run/mpi/wire.h"

namespace k3::run::mpi {
namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

MpiExperts::MpiExperts(World* world, const ops::Dims& dims, int n_experts, double timeout_s)
    : world_(world), dims_(dims), map_{world->size(), n_experts}, timeout_s_(timeout_s) {
  stats_.ranks = world->size();
  stats_.map = map_.Describe();
  for (int r = 1; r < world->size(); ++r) stats_.per_rank.push_back(RemoteRankStats{r});
}

bool MpiExperts::IsLocal(int /*layer*/, int expert) const { return map_.Owner(expert) == 0; }

Status MpiExperts::Send(int layer, const ops::Routing& routing, std::span<const int32_t> remote,
                        const ops::MoeScratch& s) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t Lt = dims_.latent, k = routing.topk;
  outstanding_.clear();
  ++pass_;
  for (int32_t e : remote) {  // ascending ids, so ranks come in ascending order
    const int owner = map_.Owner(e);
    if (outstanding_.empty() || outstanding_.back().rank != owner) {
      outstanding_.push_back(Outstanding{owner, {}, {}, 0});
    }
    Outstanding& o = outstanding_.back();
    o.experts.push_back(e);
    o.slots.emplace_back();
    ops::RowsOf(routing, e, &o.slots.back());
    o.rows += o.slots.back().size();
  }
  messages_.resize(outstanding_.size());
  std::vector<int> dests;
  std::vector<const std::vector<uint64_t>*> msgs;
  for (size_t i = 0; i < outstanding_.size(); ++i) {
    const Outstanding& o = outstanding_[i];
    Work w;
    w.layer = static_cast<uint32_t>(layer);
    w.pass = pass_;
    rows_.resize(static_cast<size_t>(o.rows) * static_cast<size_t>(Lt));
    float* dst = rows_.data();
    for (size_t j = 0; j < o.experts.size(); ++j) {
      w.jobs.push_back(Job{static_cast<uint32_t>(o.experts[j]),
                           static_cast<uint32_t>(o.slots[j].size())});
      for (int64_t slot : o.slots[j]) {  // the token's latent row (slot = t·topk + j)
        std::copy_n(s.z.data() + slot / k * Lt, Lt, dst);
        dst += Lt;
      }
    }
    messages_[i] = EncodeWork(w, rows_.data(), Lt);
    RemoteRankStats& st = stats_.per_rank[static_cast<size_t>(o.rank - 1)];
    st.bytes_sent += messages_[i].size() * 8;
    st.messages += 1;
    st.experts += o.experts.size();
    st.rows += o.rows;
    dests.push_back(o.rank);
    msgs.push_back(&messages_[i]);
  }
  FaultReport::Waiting(layer, dests);
  Status sent = world_->SendAll(dests, msgs, kTagWork, timeout_s_,
                                "the rows of layer " + std::to_string(layer));
  stats_.send_seconds += Since(t0);
  if (!sent.ok()) return Fail(sent);
  return Status::Ok();
}

Status MpiExperts::Receive(int layer, ops::MoeScratch* s, ops::MoeStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t Lt = dims_.latent;
  for (const Outstanding& o : outstanding_) {
    const std::string from = "rank " + std::to_string(o.rank) + ", layer " + std::to_string(layer);
    Result<std::vector<uint64_t>> msg =
        world_->Receive(o.rank, kTagReply, timeout_s_, "the experts of layer " + std::to_string(layer));
    if (!msg.ok()) return Fail(msg.status());
    stats_.per_rank[static_cast<size_t>(o.rank - 1)].bytes_received += msg->size() * 8;
    Result<Reply> decoded = DecodeReply(*msg, Lt, from);
    if (!decoded.ok()) return Fail(Status::Io(decoded.status().message()));
    const Reply& reply = *decoded;
    if (reply.layer != static_cast<uint32_t>(layer) || reply.pass != pass_ ||
        reply.n_jobs != o.experts.size() || reply.n_rows != o.rows) {
      return Fail(Status::Io(from + ": the reply answers layer " + std::to_string(reply.layer) +
                        " request " + std::to_string(reply.pass) + " (" +
                        std::to_string(reply.n_rows) + " rows), not request " +
                        std::to_string(pass_) + " (" + std::to_string(o.rows) + " rows)"));
    }
    std::vector<bool> failed(o.experts.size(), false);
    for (const Failure& f : reply.failures) {
      failed[f.job] = true;
      const int32_t e = o.experts[f.job];
      failures_.push_back(ExpertFailure{layer, e, "rank " + std::to_string(o.rank) + ": " + f.reason});
      stats->experts_skipped += static_cast<int64_t>(o.slots[f.job].size());
      stats->missing.push_back(e);
    }
    const float* y = reply.rows;
    for (size_t j = 0; j < o.experts.size(); ++j) {
      for (int64_t slot : o.slots[j]) {
        if (!failed[j]) {
          std::copy_n(y, Lt, s->slots.data() + slot * Lt);
          s->have[static_cast<size_t>(slot)] = 1;
        }
        y += Lt;
      }
    }
  }
  FaultReport::Waiting(layer, {});
  outstanding_.clear();
  stats_.wait_seconds += Since(t0);
  return Status::Ok();
}

Status MpiExperts::Fail(Status s) {
  failed_ = true;
  error_ = s.message();
  return s;
}

RemoteStats MpiExperts::Stats() const { return stats_; }

Status MpiExperts::Shutdown() {
  const std::vector<uint64_t> bye = EncodeShutdown();
  std::vector<int> dests;
  std::vector<const std::vector<uint64_t>*> msgs;
  for (int r = 1; r < world_->size(); ++r) {
    dests.push_back(r);
    msgs.push_back(&bye);
  }
  return world_->SendAll(dests, msgs, kTagWork, timeout_s_, "the end of the run");
}

}  // namespace k3::run::mpi
