// The MPI process group of a scale-out run (Open MPI, docs/SCALE-OUT.md): start-up, the rank and
// size, and the byte messages of k3run/mpi/wire.h with deadlines.
//
// Waiting polls (MPI_Iprobe / MPI_Test) with a short sleep between polls instead of blocking in
// MPI: a rank that waits then costs no core (ranks are often oversubscribed on a test machine),
// and a wait can end at a deadline with an error that names the peer, where a blocking MPI call
// would hang forever. Errors return (MPI_ERRORS_RETURN) and become Status; nothing aborts
// except Abort().
// Thread safety: MPI is initialised MPI_THREAD_SERIALIZED; one thread at a time calls it (the
// pass thread during a run, the main thread at start and end).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace k3::run::mpi {

enum Tag : int { kTagHello = 1, kTagWork = 2, kTagReply = 3 };

class World {
 public:
  // MPI_Init_thread. kIo when MPI cannot start (e.g. run outside mpirun with no singleton
  // support) or gives less than MPI_THREAD_SERIALIZED.
  static Result<std::unique_ptr<World>> Init();
  ~World();  // MPI_Finalize
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& host() const { return host_; }

  // Sends one message to each destination at once and returns when every send completed;
  // `timeout_s` ≤ 0 waits for ever, else kIo "<what>: rank R did not take … within S s" (a large
  // message completes only when its receiver takes it).
  Status SendAll(std::span<const int> dests, std::span<const std::vector<uint64_t>* const> msgs,
                 int tag, double timeout_s = 0, const std::string& what = "sending");
  Status Send(int dest, const std::vector<uint64_t>& msg, int tag);
  // The next message from `source` with `tag`; `timeout_s` ≤ 0 waits for ever. The deadline
  // covers the whole message, not only its start: kIo "<what>: rank R did not answer within S s",
  // and then the run must end (Abort): the late message stays posted.
  Result<std::vector<uint64_t>> Receive(int source, int tag, double timeout_s,
                                        const std::string& what);
  // Every rank's `mine` at rank 0 (index = rank); other ranks get an empty vector.
  Result<std::vector<std::string>> GatherToRoot(const std::string& mine);
  // Rank 0's `text` at every rank.
  Result<std::string> BroadcastFromRoot(const std::string& text);
  // Ends every rank of the job now with `code` (MPI_Abort).
  [[noreturn]] void Abort(int code);

 private:
  World() = default;
  int rank_ = 0, size_ = 1;
  std::string host_;
  // Buffers of receives that passed their deadline mid-message (Receive): MPI may still fill them.
  std::vector<std::unique_ptr<std::vector<uint64_t>>> abandoned_;
};

}  // namespace k3::run::mpi
