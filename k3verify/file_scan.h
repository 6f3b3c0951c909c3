// The read engine of `k3verify prepared --deep/--against`: streams each file of a prepared
// directory once, in large sequential windows, hashing every listed byte range and/or comparing
// it with where the same bytes live in the source checkpoint.
//
// Why one engine for both: with --deep --against every packed byte is read once, not twice, and
// the two checks report through the same item labels. Files are processed in parallel (one file
// per thread: each stream stays sequential, which is what a disk wants); inside a file, ranges
// are visited in offset order and gaps of up to kSkipGap are read through rather than seeked
// over. Reads go through DirectRead on files opened kReadDirect, so a terabyte audit does not
// evict the page cache.
//
// Thread safety: ScanFiles runs its own threads; the inputs must not change while it runs.
// Results never depend on the thread count (problems are reported in file order, then offset
// order).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/hash.h"
#include "common/progress.h"
#include "common/status.h"

namespace k3::verify {

// Where bytes [item_offset, item_offset + length) of an item live in a source file.
struct ScanSource {
  uint64_t item_offset = 0;
  uint64_t length = 0;
  std::string path;
  uint64_t offset = 0;
  std::string label;  // e.g. the source tensor's name
};

enum class ScanHash { kNone, kXxh3_128, kXxh3_64 };

struct ScanItem {
  std::string label;          // "region \"<tensor>\"" or "layer 3 expert 7"
  uint64_t offset = 0;        // in the scanned file
  uint64_t length = 0;
  ScanHash hash = ScanHash::kNone;
  Hash128 want128;
  uint64_t want64 = 0;
  std::string want_from;      // where the expected hash is recorded ("k3.json", "experts.idx")
  std::vector<ScanSource> sources;  // empty: no byte comparison
};

struct ScanFile {
  std::string path;
  std::vector<ScanItem> items;  // non-overlapping (the manifest reader guarantees it)
};

struct ScanStats {
  uint64_t items_hashed = 0;
  uint64_t items_compared = 0;
  uint64_t bytes = 0;  // item bytes read
};

// Scans every file; appends each problem found (hash mismatch, first differing byte, I/O
// failure, items left unchecked after one) to `problems`.
ScanStats ScanFiles(Env* env, std::vector<ScanFile>& files, int jobs, Progress* progress,
                    std::vector<Status>* problems);

}  // namespace k3::verify
