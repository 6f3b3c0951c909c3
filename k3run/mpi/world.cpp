#include "k3run/mpi/world.h"

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <thread>

namespace k3::run::mpi {
namespace {

std::string MpiError(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

Status Check(int code, const std::string& what) {
  if (code == MPI_SUCCESS) return Status::Ok();
  return Status::Io(what + ": " + MpiError(code));
}

// Sleeps a little longer each poll, from 5 µs to 200 µs: fast answers stay fast, long waits
// cost no core.
class Backoff {
 public:
  void Wait() {
    std::this_thread::sleep_for(std::chrono::microseconds(us_));
    us_ = std::min(us_ * 2, 200);
  }

 private:
  int us_ = 5;
};

// The end of a wait of `timeout_s` seconds from now; ≤ 0 never ends.
class Deadline {
 public:
  explicit Deadline(double timeout_s)
      : timeout_s_(timeout_s), start_(std::chrono::steady_clock::now()) {}
  bool Passed() const {
    return timeout_s_ > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                           start_).count() > timeout_s_;
  }

 private:
  double timeout_s_;
  std::chrono::steady_clock::time_point start_;
};

int Count(size_t words) {
  // Message sizes are bounded by a pass's rows (wire.h); past INT_MAX words MPI's int count
  // cannot say it. A caller never gets here with one that large (kernels bound the rows).
  return static_cast<int>(std::min<size_t>(words, INT_MAX));
}

}  // namespace

Result<std::unique_ptr<World>> World::Init() {
  int provided = 0;
  int argc = 0;
  char** argv = nullptr;
  K3_RETURN_IF_ERROR(Check(MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided),
                           "--mpi: MPI_Init_thread"));
  std::unique_ptr<World> w(new World());
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if (provided < MPI_THREAD_SERIALIZED) {
    return Status::Io("--mpi: this MPI library gives thread level " + std::to_string(provided) +
                      ", k3run needs MPI_THREAD_SERIALIZED (passes run on their own thread)");
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &w->rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &w->size_);
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  if (MPI_Get_processor_name(name, &len) == MPI_SUCCESS) w->host_.assign(name, static_cast<size_t>(len));
  return w;
}

World::~World() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

Status World::SendAll(std::span<const int> dests, std::span<const std::vector<uint64_t>* const> msgs,
                      int tag, double timeout_s, const std::string& what) {
  const Deadline deadline(timeout_s);
  std::vector<MPI_Request> reqs(dests.size(), MPI_REQUEST_NULL);
  for (size_t i = 0; i < dests.size(); ++i) {
    K3_RETURN_IF_ERROR(Check(MPI_Isend(msgs[i]->data(), Count(msgs[i]->size()), MPI_UINT64_T,
                                       dests[i], tag, MPI_COMM_WORLD, &reqs[i]),
                             "sending to rank " + std::to_string(dests[i])));
  }
  Backoff backoff;
  for (;;) {
    int done = 0;
    K3_RETURN_IF_ERROR(Check(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done,
                                         MPI_STATUSES_IGNORE),
                             "sending to ranks"));
    if (done) return Status::Ok();
    if (deadline.Passed()) {
      std::string late;
      for (size_t i = 0; i < reqs.size(); ++i) {
        int one = 0;
        if (reqs[i] != MPI_REQUEST_NULL &&
            MPI_Test(&reqs[i], &one, MPI_STATUS_IGNORE) == MPI_SUCCESS && !one) {
          late += (late.empty() ? "" : ", ") + std::to_string(dests[i]);
        }
      }
      return Status::Io(what + ": rank " + late + " did not take its message within " +
                        std::to_string(static_cast<int64_t>(timeout_s)) + " s");
    }
    backoff.Wait();
  }
}

Status World::Send(int dest, const std::vector<uint64_t>& msg, int tag) {
  const std::vector<uint64_t>* one = &msg;
  return SendAll(std::span<const int>(&dest, 1), std::span<const std::vector<uint64_t>* const>(&one, 1),
                 tag);
}

Result<std::vector<uint64_t>> World::Receive(int source, int tag, double timeout_s,
                                             const std::string& what) {
  const Deadline deadline(timeout_s);
  const auto late = [&](const std::string& detail) {
    return Status::Io(what + ": rank " + std::to_string(source) + " did not answer within " +
                      std::to_string(static_cast<int64_t>(timeout_s)) + " s" + detail);
  };
  Backoff backoff;
  MPI_Status st;
  for (;;) {
    int flag = 0;
    K3_RETURN_IF_ERROR(Check(MPI_Iprobe(source, tag, MPI_COMM_WORLD, &flag, &st),
                             what + ": waiting for rank " + std::to_string(source)));
    if (flag) break;
    if (deadline.Passed()) return late("");
    backoff.Wait();
  }
  int count = 0;
  K3_RETURN_IF_ERROR(Check(MPI_Get_count(&st, MPI_UINT64_T, &count), what));
  // The probe saw the message begin; its rest may need the sender's progress (a large message
  // over shared memory without single-copy, or over TCP), and a sender stopped now would hang a
  // blocking MPI_Recv for ever. So the receive polls against the same deadline.
  auto msg = std::make_unique<std::vector<uint64_t>>(static_cast<size_t>(std::max(count, 0)));
  MPI_Request req = MPI_REQUEST_NULL;
  K3_RETURN_IF_ERROR(Check(MPI_Irecv(msg->data(), count, MPI_UINT64_T, source, tag,
                                     MPI_COMM_WORLD, &req),
                           what + ": receiving from rank " + std::to_string(source)));
  // Without an MPI progress thread the rest moves only while this rank is inside MPI, so the
  // first kSpinSeconds test without sleeping, as a blocking receive would; after that the sender
  // is late, and the waits back off again.
  constexpr double kSpinSeconds = 0.01;
  const Deadline spin(kSpinSeconds);
  Backoff late_backoff;
  for (;;) {
    int done = 0;
    K3_RETURN_IF_ERROR(Check(MPI_Test(&req, &done, MPI_STATUS_IGNORE),
                             what + ": receiving from rank " + std::to_string(source)));
    if (done) return std::move(*msg);
    if (deadline.Passed()) {
      // A matched receive cannot be cancelled: MPI may still write the rest into this buffer,
      // so the buffer lives as long as MPI does.
      abandoned_.push_back(std::move(msg));
      return late(" (its message began and did not complete)");
    }
    if (spin.Passed()) late_backoff.Wait();
  }
}

Result<std::vector<std::string>> World::GatherToRoot(const std::string& mine) {
  const int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<size_t>(size_), 0), offsets(static_cast<size_t>(size_), 0);
  K3_RETURN_IF_ERROR(Check(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD),
                           "--mpi: start-up check"));
  std::string all;
  if (rank_ == 0) {
    int total = 0;
    for (int r = 0; r < size_; ++r) {
      offsets[static_cast<size_t>(r)] = total;
      total += lens[static_cast<size_t>(r)];
    }
    all.resize(static_cast<size_t>(total));
  }
  K3_RETURN_IF_ERROR(Check(MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(),
                                       offsets.data(), MPI_CHAR, 0, MPI_COMM_WORLD),
                           "--mpi: start-up check"));
  std::vector<std::string> out;
  if (rank_ == 0) {
    for (int r = 0; r < size_; ++r) {
      out.push_back(all.substr(static_cast<size_t>(offsets[static_cast<size_t>(r)]),
                               static_cast<size_t>(lens[static_cast<size_t>(r)])));
    }
  }
  return out;
}

Result<std::string> World::BroadcastFromRoot(const std::string& text) {
  int len = static_cast<int>(text.size());
  K3_RETURN_IF_ERROR(Check(MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD), "--mpi: start-up check"));
  std::string out = rank_ == 0 ? text : std::string(static_cast<size_t>(len), '\0');
  K3_RETURN_IF_ERROR(
      Check(MPI_Bcast(out.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD), "--mpi: start-up check"));
  return out;
}

void World::Abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this is for the compiler
}

}  // namespace k3::run::mpi
