// The two messages of scale-out (docs/SCALE-OUT.md "Wire"): rank 0 hands a MoE layer's rows to
// the rank that owns their experts (Work), the rank answers with the experts' outputs (Reply).
// Both are flat byte strings, little-endian, encoded field by field:
//   Work:  u32 magic "K3MW", u32 layer, u64 pass, u32 n_jobs, u32 reserved 0, u64 n_rows,
//          n_jobs × {u32 expert, u32 rows}, then n_rows × latent f32 (the jobs' rows in order)
//   Reply: u32 magic "K3MR", u32 layer, u64 pass, u32 n_jobs, u32 n_failed, u64 n_rows,
//          n_failed × {u32 job, u32 reason_len, reason bytes}, then n_rows × latent f32 (rows of
//          a failed job are zero and never used)
// Shutdown is a Work with no jobs and layer 0xffffffff. Decoding checks every size against the
// byte count before anything is read, so a short or foreign message is an error, not garbage.
// Non-goals: mixed-endian clusters (every rank is x86-64 or another little-endian machine).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace k3::run::mpi {

inline constexpr uint32_t kShutdownLayer = 0xffffffffu;

struct Job {
  uint32_t expert = 0;
  uint32_t rows = 0;
};

struct Work {
  uint32_t layer = 0;
  uint64_t pass = 0;
  std::vector<Job> jobs;
  const float* rows = nullptr;  // decoded: points into the message; [n_rows][latent]
  uint64_t n_rows = 0;
  bool shutdown() const { return layer == kShutdownLayer; }
};

struct Failure {
  uint32_t job = 0;
  std::string reason;
};

struct Reply {
  uint32_t layer = 0;
  uint64_t pass = 0;
  uint32_t n_jobs = 0;
  std::vector<Failure> failures;
  const float* rows = nullptr;  // decoded: points into the message; [n_rows][latent]
  uint64_t n_rows = 0;
};

// The row payload starts 8-byte aligned in both messages when the buffer does, so `rows` may
// be read as floats in place (buffers come from std::vector<uint64_t>-backed storage).
std::vector<uint64_t> EncodeWork(const Work& w, const float* rows, int64_t latent);
std::vector<uint64_t> EncodeShutdown();
std::vector<uint64_t> EncodeReply(const Reply& r, const float* rows, int64_t latent);
// `bytes` must stay alive while the result's rows are read. Errors are kInvalid naming `from`.
Result<Work> DecodeWork(std::span<const uint64_t> msg, int64_t latent, const std::string& from);
Result<Reply> DecodeReply(std::span<const uint64_t> msg, int64_t latent, const std::string& from);

}  // namespace k3::run::mpi
