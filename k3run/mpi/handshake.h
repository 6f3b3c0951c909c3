// The start-up check of a scale-out run (docs/SCALE-OUT.md "What each rank needs"): every rank
// opens its own prepared directory, then rank 0 gathers what each has and refuses to start,
// on every rank, when one differs: another k3run binary (its XXH3-128), another model
// (prepared::ModelIdentity), a share made for another rank or rank count, or a directory that
// did not open. The verdict is broadcast so every rank stops at once with the same message.
#pragma once

#include <string>

#include "common/status.h"
#include "formats/prepared_manifest.h"
#include "k3run/mpi/world.h"

namespace k3::run::mpi {

struct RankIdentity {
  int rank = 0;
  std::string host;
  long pid = 0;
  std::string binary;    // XXH3-128 hex of /proc/self/exe ("" when unreadable)
  std::string prepared;  // the directory as given
  std::string model;     // ModelIdentity hex ("" when `error` is set)
  int share_ranks = 0;   // 0: a full directory
  int share_rank = 0;
  int n_experts = 0;
  std::string error;     // why the directory did not open ("" when it did)
};

// This process's identity for `prepared` (null with `open_error` when it did not open).
RankIdentity IdentityOf(const World& world, const std::string& prepared_path,
                        const prepared::PreparedDir* prepared, const std::string& open_error);

// rank 0's verdict over every identity ("" to start). Pure: the test of every refusal.
std::string Verdict(const std::vector<RankIdentity>& ranks);

// Gathers, decides and broadcasts: kInvalid with the verdict on every rank when it is not "".
Status Handshake(World* world, const RankIdentity& mine);

std::string EncodeIdentity(const RankIdentity& id);
Result<RankIdentity> DecodeIdentity(const std::string& text);

}  // namespace k3::run::mpi
