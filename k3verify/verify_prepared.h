// `k3verify prepared PREPARED [--deep] [--against MODEL_DIR] [--model-dir DIR]`: audits a
// prepared directory (DESIGN.md §5, §6).
//
// Checks, in order, collecting every problem rather than stopping at the first:
//   1. k3.sum, then k3.json (ReadVerifiedManifestText + ParseManifest: a sum mismatch is
//      integrity, exit 3 "k3.json altered"; a missing sum or invalid manifest is exit 2; nothing
//      else can be checked without a trusted manifest);
//   2. every file k3.json lists is present with its recorded size (exit 2 naming it);
//   3. experts.idx: its XXH3-128 against k3.json BEFORE decoding, then the format's decode and
//      validation against the config and expert_files; then every expert file (shards in link
//      mode, relocatable with --model-dir) present with its recorded size;
//   4. --deep: every region re-hashed (XXH3-128) and every expert (XXH3-64 of its `length`
//      bytes), mismatches named by region (tensor, file, offset) or by layer/expert; a share's
//      absent experts are not read (step 3 checked they are exactly those of the other ranks);
//   5. --against MODEL_DIR: every trunk/resident region, every expert sub-tensor and every
//      tokenizer file byte-compared with its source, naming the first differing byte.
// Steps 4 and 5 share one pass over each file (file_scan.h). Files whose size is wrong are not
// scanned (their problem is already reported). Exit: 3 > 2 > 1 precedence (WorstVerdict).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/progress.h"
#include "common/status.h"

namespace k3::verify {

struct PreparedOptions {
  std::string dir;
  bool deep = false;
  std::string against;    // MODEL_DIR to byte-compare with; empty: no comparison
  std::string model_dir;  // link mode: where the shards are now (default: k3.json's model_dir)
  int jobs = 0;           // files scanned at once; 0 = number of cores
  ProgressMode progress = ProgressMode::kAuto;
};

struct PreparedReport {
  std::string dir;
  std::string experts_mode;  // "link" / "copy"; empty when k3.json could not be read
  bool deep = false;
  std::string against;
  uint64_t files = 0;         // files whose presence and size were checked
  uint64_t regions = 0;       // regions listed in k3.json
  uint64_t experts = 0;       // expert records
  uint64_t experts_present = 0;  // of them, not absent (all of them unless a share)
  std::string share;          // "rank 1 of 4 (contiguous)" for a share; empty for a full dir
  uint64_t items_hashed = 0;  // regions + experts re-hashed (--deep)
  uint64_t items_compared = 0;
  uint64_t bytes_scanned = 0;
  double scan_seconds = 0;
  std::vector<Status> problems;

  Status Verdict() const;
};

// Runs every check. A Status is returned only when the audit cannot start (PREPARED is not a
// directory); everything found is in the report.
Result<PreparedReport> VerifyPrepared(Env* env, const PreparedOptions& options);

std::string RenderPreparedText(const PreparedReport& report);
std::string RenderPreparedJson(const PreparedReport& report);

}  // namespace k3::verify
