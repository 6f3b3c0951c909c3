// The floor of a run (DESIGN.md §9): the least time per token this machine could take at this
// memory budget, from bandwidths measured in the same run, so the report can say how far the
// engine is from physics (time ÷ floor).
//
// Per byte kind, the bytes that must be read per token ÷ the disk bandwidth measured with the
// engine's own request size and queue depth (experts: expert-record-sized random reads at the
// wave's queue depth; trunk runs and lm_head chunks: ring-slot-sized sequential reads through
// the same BatchReader, O_DIRECT), summed — or, when lower, all disk bytes ÷ the bandwidth of both
// streams measured running together, as the engine runs them; versus the weight bytes the token
// multiplies ÷ the memory read bandwidth, and its multiply-adds ÷ the kernels' measured peak. The
// floor is the largest of the three (each is a lower bound; disk and compute overlap at best).
//
// Probes run at start-up, before the weights are allocated, so their buffers never raise the
// run's peak RSS above the plan. Bounded: a fraction of a second each.
//   experts: records in a fixed pseudo-random order (std::mt19937_64(12345), so every run reads
//            the same records), batches of expert_queue_depth records sorted by (file, offset)
//            as the engine issues a wave, through ONE BatchReader of that queue depth. One
//            warm-up batch is not timed. Stops once seconds_per_probe has passed or every record
//            has been read once, whichever comes first, but never before two timed batches (a
//            model with fewer records than that cycles through them again).
//   trunk:   runs largest first, wrapping, each read front to back in requests of the ring's
//            size (QD 16, like the ring's reader) into one buffer; a small untimed warm-up read.
//   memory:  XOR-reduce of a 1 GiB buffer (beyond the caches; capped by the plan), all threads.
//   kernel:  bf16 MatMul (T = 1) on 128 rows × 1024 columns per thread (each thread's 256 KiB
//            share stays in its own L2), so the figure is the kernel's peak, not memory's; then
//            MatMul with T = 64 activation rows on that matrix and on 64 rows × 3072 per thread
//            (tiles of 4 and of 6), windows alternating, the best window (half the probe time
//            each).
// Every timed probe runs at least twice its unit (batch, request, pass, call).
// Non-goals: predicting the page cache (every weight read here is O_DIRECT); timing guarantees
// (a slow disk gives fewer bytes, never more than one batch beyond seconds_per_probe).
//
// Thread safety: ProbeBandwidths sets kernels::SetThreads for its kernel probe and restores the
// previous value; do not run it concurrently with MatMul. ComputeFloor is pure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/status.h"
#include "formats/prepared_manifest.h"

namespace k3::run {

struct ProbeOptions {
  double seconds_per_probe = 0.25;  // wall-time bound of each probe, in (0, 60]
  int expert_queue_depth = 16;      // the engine's batch: min(top-k, slots − 1) expert reads;
                                    // ≥ 1, clamped to the number of records
  uint64_t trunk_request_bytes = 0; // the ring's request (a whole run or lm_head chunk); 0: the
                                    // largest trunk run. Capped at 64 MiB and at the largest run
  bool force_pread = false;
  int threads = 0;                  // memory/compute probes; 0 = kernels::Threads(); ≥ 0
  uint64_t max_buffer_bytes = 0;    // caps the memory probe's buffer (the run's memory plan, so
                                    // the probe never sets the peak RSS); 0: 1 GiB
};

// The cap on a trunk request: larger requests gain nothing (the reader cuts them into 4 MiB
// pieces at QD 16 anyway) and would only grow the probe's buffer.
inline constexpr uint64_t kMaxTrunkProbeRequest = uint64_t{64} << 20;

struct Bandwidths {
  double expert_bytes_per_s = 0;  // 0 when the checkpoint has no experts
  uint64_t expert_request_bytes = 0;  // the largest record's length (one expert = one read)
  int expert_queue_depth = 0;         // records per batch as used (after clamping)
  double trunk_bytes_per_s = 0;
  uint64_t trunk_request_bytes = 0;   // as used (after the caps)
  double combined_bytes_per_s = 0;  // trunk and expert streams concurrently (0: one kind only)
  double memory_bytes_per_s = 0;   // streaming read of a buffer far larger than the caches
  double kernel_flops_per_s = 0;   // bf16 matvec on cache-resident weights, all threads (2 flops
                                   // per multiply-add)
  double kernel_matmul_flops_per_s = 0;  // bf16 × 64 activation rows (prefill widths), cache-
                                         // resident, the best of 20 short windows over two
                                         // row lengths: the prefill compute floor's peak
  std::string backend;             // the BatchReader backend used
};

// Reads real weight bytes of `p` (trunk.bin and expert records) with O_DIRECT through `env`.
// Errors: kInvalid for options out of range (naming the option) or an expert record whose
// file_id has no path; kIo for a file that cannot be opened or read (naming the file, the byte
// offset, the layer and expert or trunk run). The caller logs it and runs without a floor.
Result<Bandwidths> ProbeBandwidths(Env* env, const prepared::PreparedDir& p, const ProbeOptions& o);

// What one pass multiplies of `p`, from its manifest: the trunk runs of the first `layers`
// layers plus lm_head (every pass uses them all), and the largest expert record (one routed
// expert's bytes). The floors' weight bytes: a pass's are weights_used + distinct experts ×
// expert_record.
struct PassWeights {
  uint64_t weights_used = 0;
  uint64_t expert_record = 0;
};
PassWeights PassWeightBytes(const prepared::PreparedDir& p, int layers);

// Bytes per token, by kind, as the run measured them (averages over decode steps).
struct PerToken {
  double trunk_bytes = 0;    // trunk runs read from disk
  double lm_head_bytes = 0;  // lm_head chunks read from disk
  double expert_bytes = 0;   // expert records read from disk
  double other_bytes = 0;    // embedding rows and head vectors (small, read at trunk speed)
  double weight_bytes_used = 0;  // every weight byte the token multiplies (resident or not)
  double multiply_adds = 0;      // weight elements the token multiplies (≈ matvec MACs)
};

struct Floor {
  double disk_s = 0, memory_s = 0, compute_s = 0;
  double floor_s = 0;     // max of the three
  std::string bound;      // "disk", "memory" or "compute" (ties: that order); "" when floor_s
                          // is 0 (nothing to read or multiply, or nothing measured)
  // Bandwidths fields that were needed (their bytes or multiply-adds were > 0) but not
  // measured (0, negative or not finite), e.g. "expert_bytes_per_s". Their terms are left
  // out (counted as 0 s), never infinite: the floor stays a lower bound, just a weaker one, and
  // the report should print this list next to it.
  std::vector<std::string> unmeasured;
};

// disk_s = (trunk + lm_head + other) / trunk_bytes_per_s + expert / expert_bytes_per_s;
// memory_s = weight_bytes_used / memory_bytes_per_s; compute_s = 2 · multiply_adds /
// kernel_flops_per_s; floor_s = max.
Floor ComputeFloor(const PerToken& t, const Bandwidths& b);

}  // namespace k3::run
