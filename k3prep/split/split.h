// `k3prep split PREPARED --ranks N --rank R --out DIR`: the share of a prepared directory that
// MPI rank R of an N-rank run needs (formats/expert_share.h, docs/SCALE-OUT.md).
//
// Goals:
// - DIR is a copy-mode prepared directory that opens like any other: trunk.bin, resident.bin and
//   the tokenizer files copied whole, only rank R's experts under the contiguous map (experts
//   [Begin(R), End(R)) of every MoE layer, in experts/layer-LLL.bin laid out by
//   PlanShareExperts: copy mode's rules, the other experts left out), a new experts.idx whose
//   records of the other experts are absent, and k3.json with "share" and k3.sum
//   (WriteManifestAndSum, k3.sum last). Its ModelIdentity is PREPARED's.
// - Every byte copied is verified while it is copied: trunk and resident regions and tokenizer
//   files against k3.json's XXH3-128, each expert against its record's XXH3-64 (copy.h); a
//   mismatch is kIntegrity naming the file, the region or expert and the offset.
// - Nothing looks complete until it is: outputs are written under temporary names and renamed at
//   the end, k3.json and k3.sum last; on any failure every output written so far (temporary or
//   renamed) and the subdirectories the split made are removed, so DIR holds nothing under a
//   final name (and may be split into again).
// - PREPARED is checked as k3run opens it (OpenPrepared) before anything is written; a
//   directory that is itself a share is refused, as is a DIR that exists and is not empty.
// Non-goals: resuming an interrupted split (the share is rewritten whole: it is one rank's
// fraction of the experts); striping the share over disks.
// Thread safety: RunSplit may run concurrently for different output directories.
#pragma once

#include <cstdint>
#include <string>

#include "common/env.h"
#include "common/progress.h"
#include "common/status.h"
#include "formats/prepared_manifest.h"

namespace k3::prep {

struct SplitOptions {
  std::string prepared;   // the full prepared directory (link or copy mode)
  std::string out;        // DIR
  int ranks = 0;          // --ranks N
  int rank = -1;          // --rank R
  std::string model_dir;  // link mode: where PREPARED's shards are now (default: k3.json's)
  ProgressMode progress = ProgressMode::kNone;
};

struct SplitStats {
  uint64_t experts_total = 0;  // expert records (every MoE layer)
  uint64_t experts_held = 0;   // of them, in the share
  uint64_t expert_bytes = 0;   // the held experts' record bytes
  uint64_t trunk_bytes = 0;    // trunk.bin
  uint64_t resident_bytes = 0; // resident.bin
  uint64_t bytes_read = 0;     // source bytes read and verified
  uint64_t bytes_written = 0;  // every output file's bytes (incl. padding, idx, k3.json)
  double seconds = 0;
};

struct SplitResult {
  prepared::Manifest manifest;  // DIR's k3.json
  SplitStats stats;
};

// kInvalid (exit 2): bad --ranks/--rank (naming the flag), PREPARED that does not open or is a
// share, DIR not empty; kIntegrity (exit 3): a source byte differs from its recorded hash; kIo
// (exit 1): read/write failures, not enough free space.
Result<SplitResult> RunSplit(Env* env, const SplitOptions& options);

}  // namespace k3::prep
