// The disk half of `k3prep doctor`: may DIR be written, does its file system take O_DIRECT, and
// how fast does its disk serve random expert-sized reads at queue depth 1 and 16.
//
// Goals: measure what k3run will see (O_DIRECT reads of one expert record, through the same
// BatchReader, io_uring or the pread pool), with a bounded time and a bounded scratch file that
// never outlives the probe: it is removed on success, on every error, and on SIGINT/SIGTERM/
// SIGHUP (the signal is re-raised after the removal, so the process still ends the way the user
// asked). Only SIGKILL or a crash can leave ".k3-doctor-probe-<pid>.k3tmp" behind; the doctor
// reports such leftovers. Every file operation goes through Env, so tests inject faults.
// Non-goals: sequential-read or write benchmarks (docs/PERFORMANCE.md has those), timing
// guarantees (a slow disk gives fewer reads, never a longer run than seconds × depths plus one
// batch each).
//
// Thread safety: one probe at a time per process (the signal handlers are process-wide).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/status.h"

namespace k3::prep {

// The released model's routed expert record: w1, w2, w3 MXFP4 (each 3584 × 3072 values: packed
// nibbles 5,505,024 B + E8M0 scales 344,064 B) = 3 × 5,849,088 B (spec/MODEL.md, docs/FORMATS.md).
inline constexpr uint64_t kReleasedExpertBytes = 17'547'264;
// Head room the probe leaves on DIR's file system beyond its scratch file.
inline constexpr uint64_t kProbeFreeMargin = 1'000'000'000;

// Prefix of every scratch file the doctor creates in DIR.
inline constexpr const char* kScratchPrefix = ".k3-doctor-";

struct WritableReport {
  bool writable = false;
  std::string reason;  // when not writable: the Status message of the failed create/write
};
struct DirectIoReport {
  bool available = false;
  uint32_t alignment = 0;  // Env::DirectAlignment of the test file (0: none reported)
  std::string reason;      // when not available
};

// Creates a small scratch file in `dir`, writes one 4 KiB block and removes it. Then the same
// with O_DIRECT: switches the file to direct I/O, writes and reads back one aligned block and
// compares the bytes. Never leaves a file behind.
WritableReport CheckWritable(Env* env, const std::string& dir);
DirectIoReport CheckDirectIo(Env* env, const std::string& dir);

struct ProbeOptions {
  std::string dir;
  uint64_t file_bytes = uint64_t{1024} << 20;  // --probe-mb (MiB)
  uint64_t read_bytes = kReleasedExpertBytes;  // one request; clamped to file_bytes
  double seconds_per_depth = 3.0;              // --probe-seconds
  std::vector<int> queue_depths = {1, 16};
  uint64_t seed = 0x6b33646f63746f72;  // "k3doctor": the same offsets on every run
  bool force_pread = false;
  // Tests through FaultEnv (whose files cannot be direct) set this false to reach the write and
  // read paths; the real doctor never measures through the page cache.
  bool require_direct = true;
};

struct DepthResult {
  int queue_depth = 0;
  uint64_t reads = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  double mb_per_s() const { return seconds > 0 ? static_cast<double>(bytes) / 1e6 / seconds : 0; }
  double iops() const { return seconds > 0 ? static_cast<double>(reads) / seconds : 0; }
};

struct ProbeReport {
  std::string backend;          // BatchReader::backend() of the deepest queue
  uint64_t file_bytes = 0;      // scratch file actually written
  uint64_t read_bytes = 0;      // one request
  double write_mb_per_s = 0;    // writing the scratch file once (sequential, O_DIRECT)
  std::vector<DepthResult> depths;
};

// Refuses (kIo naming DIR, the free bytes, the bytes needed and a --probe-mb that would fit)
// when free space < file_bytes + kProbeFreeMargin. Failures name the scratch file and the
// offset; the scratch file is gone when this returns, whatever the outcome.
Result<ProbeReport> RunDiskProbe(Env* env, const ProbeOptions& options);

// Scratch files of earlier doctors (killed with SIGKILL) found in `dir`.
std::vector<std::string> LeftoverScratchFiles(Env* env, const std::string& dir);

}  // namespace k3::prep
