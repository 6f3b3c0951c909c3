#include "k3run/mpi/handshake.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "common/env.h"
#include "common/hash.h"
#include "formats/expert_share.h"

namespace k3::run::mpi {
namespace {

std::string Where(const RankIdentity& id) {
  return "rank " + std::to_string(id.rank) + " (" + id.host + ", " + id.prepared + ")";
}

}  // namespace

RankIdentity IdentityOf(const World& world, const std::string& prepared_path,
                        const prepared::PreparedDir* prepared, const std::string& open_error) {
  RankIdentity id;
  id.rank = world.rank();
  id.host = world.host();
  id.pid = static_cast<long>(::getpid());
  id.prepared = prepared_path;
  Result<Hash128> exe = Xxh3_128File(Env::Default(), "/proc/self/exe");
  if (exe.ok()) id.binary = exe->Hex();
  if (prepared == nullptr) {
    id.error = open_error.empty() ? "the prepared directory did not open" : open_error;
    return id;
  }
  id.model = prepared::ModelIdentity(prepared->manifest).Hex();
  id.n_experts = prepared->manifest.config.n_experts;
  if (prepared->manifest.share) {
    id.share_ranks = static_cast<int>(prepared->manifest.share->ranks);
    id.share_rank = static_cast<int>(prepared->manifest.share->rank);
  }
  return id;
}

std::string Verdict(const std::vector<RankIdentity>& ranks) {
  if (ranks.empty()) return "no ranks";
  const int n = static_cast<int>(ranks.size());
  for (const RankIdentity& id : ranks) {
    if (!id.error.empty()) return Where(id) + ": " + id.error;
  }
  const RankIdentity& root = ranks[0];
  if (Status s = prepared::ValidateRanks(n, root.n_experts, "mpirun -np"); !s.ok()) {
    return s.message();
  }
  for (const RankIdentity& id : ranks) {
    if (id.binary != root.binary) {
      return Where(id) + " runs another k3run binary (xxh3-128 " +
             (id.binary.empty() ? "unreadable" : id.binary) + ") than rank 0 (" + root.binary +
             "): install the same build on every machine";
    }
    if (id.model != root.model) {
      return Where(id) + " holds another model (identity " + id.model + ") than " + Where(root) +
             " (identity " + root.model + "): every rank needs a directory of the same model";
    }
    if (id.share_ranks != 0 && (id.share_ranks != n || id.share_rank != id.rank)) {
      return Where(id) + " holds the share of rank " + std::to_string(id.share_rank) + " of " +
             std::to_string(id.share_ranks) + " (k3prep split --ranks " +
             std::to_string(id.share_ranks) + " --rank " + std::to_string(id.share_rank) +
             "), but it runs as rank " + std::to_string(id.rank) + " of " + std::to_string(n) +
             ": give it the share made with --ranks " + std::to_string(n) + " --rank " +
             std::to_string(id.rank) + ", or a full prepared directory";
    }
  }
  return "";
}

std::string EncodeIdentity(const RankIdentity& id) {
  nlohmann::json j = {{"rank", id.rank},           {"host", id.host},
                      {"pid", id.pid},             {"binary", id.binary},
                      {"prepared", id.prepared},   {"model", id.model},
                      {"share_ranks", id.share_ranks}, {"share_rank", id.share_rank},
                      {"n_experts", id.n_experts}, {"error", id.error}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<RankIdentity> DecodeIdentity(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    RankIdentity id;
    id.rank = j.at("rank").get<int>();
    id.host = j.at("host").get<std::string>();
    id.pid = j.at("pid").get<long>();
    id.binary = j.at("binary").get<std::string>();
    id.prepared = j.at("prepared").get<std::string>();
    id.model = j.at("model").get<std::string>();
    id.share_ranks = j.at("share_ranks").get<int>();
    id.share_rank = j.at("share_rank").get<int>();
    id.n_experts = j.at("n_experts").get<int>();
    id.error = j.at("error").get<std::string>();
    return id;
  } catch (const nlohmann::json::exception& e) {
    return Status::Invalid(std::string("--mpi: a rank's start-up identity is malformed: ") + e.what());
  }
}

Status Handshake(World* world, const RankIdentity& mine) {
  K3_ASSIGN_OR_RETURN(std::vector<std::string> all, world->GatherToRoot(EncodeIdentity(mine)));
  std::string verdict;
  if (world->rank() == 0) {
    std::vector<RankIdentity> ids;
    for (size_t r = 0; r < all.size() && verdict.empty(); ++r) {
      Result<RankIdentity> id = DecodeIdentity(all[r]);
      if (!id.ok()) {
        verdict = "rank " + std::to_string(r) + ": " + id.status().message();
      } else {
        id->rank = static_cast<int>(r);
        ids.push_back(*std::move(id));
      }
    }
    if (verdict.empty()) verdict = Verdict(ids);
  }
  K3_ASSIGN_OR_RETURN(std::string told, world->BroadcastFromRoot(verdict));
  if (!told.empty()) return Status::Invalid("--mpi: refused to start: " + told);
  return Status::Ok();
}

}  // namespace k3::run::mpi
