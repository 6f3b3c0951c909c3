// World's deadlines under a real mpirun of 2 ranks (k3run/mpi/world.h): a message arrives whole;
// a peer that never sends is named at the deadline; and a peer that stops in the middle of a
// large message is named at the deadline too, where a blocking MPI_Recv would wait for ever
// (CI saw that hang: mpi.Faults' stopped rank, 2026-12-07).
//
// The stall is made without signals: rank 1 posts a 1 MiB MPI_Isend and then sleeps without
// calling MPI. Over shared memory without single-copy (the CTest sets
// btl_vader_single_copy_mechanism=none, as scale_out_test.py does) and over TCP, a message past
// the eager limit starts at once but its rest moves only when the sender's MPI makes progress.
// Run: mpirun -np 2 k3run_mpi_world_test. Exit 0 when every check on rank 0 holds.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "k3run/mpi/world.h"

namespace k3::run::mpi {
namespace {

constexpr int kTag = kTagReply;
constexpr size_t kWords = size_t{1} << 17;  // 1 MiB: far past any eager limit
constexpr double kTimeout = 1.0;
constexpr int kStallSeconds = 6;

int failures = 0;

void Expect(bool ok, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

bool Contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<uint64_t> Pattern(uint64_t seed) {
  std::vector<uint64_t> v(kWords);
  for (size_t i = 0; i < kWords; ++i) v[i] = seed * 0x9E3779B97F4A7C15ull + i;
  return v;
}

void Rank1(World& w) {
  const std::vector<uint64_t> whole = Pattern(1);
  (void)w.Send(0, whole, kTag);  // 1: a message that arrives whole
  MPI_Barrier(MPI_COMM_WORLD);

  const std::vector<uint64_t> stalled = Pattern(2);  // 2: starts, then stalls with this rank
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Isend(stalled.data(), static_cast<int>(kWords), MPI_UINT64_T, 0, kTag, MPI_COMM_WORLD, &req);
  std::this_thread::sleep_for(std::chrono::seconds(kStallSeconds));  // no MPI call meanwhile
  MPI_Wait(&req, MPI_STATUS_IGNORE);
  MPI_Barrier(MPI_COMM_WORLD);

  MPI_Barrier(MPI_COMM_WORLD);  // 3: sends nothing while rank 0 waits
}

void Rank0(World& w) {
  Result<std::vector<uint64_t>> whole = w.Receive(1, kTag, kTimeout, "the whole message");
  Expect(whole.ok() && *whole == Pattern(1),
         "a 1 MiB message arrives whole" + (whole.ok() ? "" : ": " + whole.status().message()));
  MPI_Barrier(MPI_COMM_WORLD);

  auto t0 = std::chrono::steady_clock::now();
  Result<std::vector<uint64_t>> stalled = w.Receive(1, kTag, kTimeout, "the stalled message");
  double took = Since(t0);
  const std::string said = stalled.ok() ? "(received)" : stalled.status().message();
  Expect(!stalled.ok() && stalled.status().code() == Code::kIo,
         "a message whose sender stalls mid-way is an I/O error: " + said);
  Expect(Contains(said, "the stalled message: rank 1 did not answer within 1 s") &&
             Contains(said, "began and did not complete"),
         "the error names the message, the rank, the deadline and that it began");
  Expect(took < kStallSeconds - 2, "the wait ends at the deadline (" + std::to_string(took) +
                                       " s, the sender stalled " +
                                       std::to_string(kStallSeconds) + " s)");
  MPI_Barrier(MPI_COMM_WORLD);  // lets the abandoned receive finish into World's kept buffer

  t0 = std::chrono::steady_clock::now();
  Result<std::vector<uint64_t>> none = w.Receive(1, kTag, kTimeout, "a message never sent");
  took = Since(t0);
  const std::string none_said = none.ok() ? "(received)" : none.status().message();
  Expect(!none.ok() && Contains(none_said, "a message never sent: rank 1 did not answer within 1 s") &&
             !Contains(none_said, "began"),
         "a peer that sends nothing is named at the deadline: " + none_said);
  Expect(took >= kTimeout && took < kTimeout + 2, "that wait lasts the deadline (" +
                                                     std::to_string(took) + " s)");
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace k3::run::mpi

int main() {
  using k3::Result;
  using k3::run::mpi::World;
  Result<std::unique_ptr<World>> w = World::Init();
  if (!w.ok()) {
    std::fprintf(stderr, "FAIL: %s\n", w.status().message().c_str());
    return 1;
  }
  if ((*w)->size() != 2) {
    std::fprintf(stderr, "FAIL: run under mpirun -np 2 (this is %d ranks)\n", (*w)->size());
    return 1;
  }
  if ((*w)->rank() == 0) {
    k3::run::mpi::Rank0(**w);
  } else {
    k3::run::mpi::Rank1(**w);
  }
  return k3::run::mpi::failures == 0 ? 0 : 1;
}
