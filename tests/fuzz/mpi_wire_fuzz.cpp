// Fuzz target for the scale-out messages (k3run/mpi/wire.h): DecodeWork and DecodeReply must
// never crash or read past the message, refuse only with kInvalid, and whatever they accept
// must re-encode to a message of the same size that decodes to the same fields. A violated
// property aborts, which libFuzzer and the replay driver both report as a failure.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "k3run/mpi/wire.h"

namespace {

constexpr int64_t kLatent = 3;

void Require(bool ok) {
  if (!ok) std::abort();
}

void CheckWork(const std::vector<uint64_t>& msg) {
  k3::Result<k3::run::mpi::Work> w = k3::run::mpi::DecodeWork(msg, kLatent, "fuzz");
  if (!w.ok()) {
    Require(w.status().code() == k3::Code::kInvalid);
    return;
  }
  const std::vector<uint64_t> again = k3::run::mpi::EncodeWork(*w, w->rows, kLatent);
  Require(again.size() == msg.size());
  k3::Result<k3::run::mpi::Work> back = k3::run::mpi::DecodeWork(again, kLatent, "fuzz");
  Require(back.ok() && back->layer == w->layer && back->pass == w->pass &&
          back->n_rows == w->n_rows && back->jobs.size() == w->jobs.size());
  Require(w->n_rows == 0 ||
          std::memcmp(back->rows, w->rows, w->n_rows * kLatent * sizeof(float)) == 0);
}

void CheckReply(const std::vector<uint64_t>& msg) {
  k3::Result<k3::run::mpi::Reply> r = k3::run::mpi::DecodeReply(msg, kLatent, "fuzz");
  if (!r.ok()) {
    Require(r.status().code() == k3::Code::kInvalid);
    return;
  }
  const std::vector<uint64_t> again = k3::run::mpi::EncodeReply(*r, r->rows, kLatent);
  Require(again.size() == msg.size());
  k3::Result<k3::run::mpi::Reply> back = k3::run::mpi::DecodeReply(again, kLatent, "fuzz");
  Require(back.ok() && back->layer == r->layer && back->n_jobs == r->n_jobs &&
          back->failures.size() == r->failures.size());
  for (size_t i = 0; i < r->failures.size(); ++i) {
    Require(back->failures[i].job == r->failures[i].job &&
            back->failures[i].reason == r->failures[i].reason);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint64_t> msg(size / 8);  // messages are whole 8-byte words
  if (!msg.empty()) std::memcpy(msg.data(), data, msg.size() * 8);
  CheckWork(msg);
  CheckReply(msg);
  return 0;
}
