// One output file of `k3prep split` (internal): assembled from byte ranges of the source
// directory, each hashed while it is copied and compared with the hash the source records.
//
// Goals: the share holds no byte that was not checked on its way in. Every item's bytes are read
// once (large O_DIRECT reads through DirectRead), hashed (XXH3-128 for a k3.json region, XXH3-64
// for an experts.idx record) and appended to the output; the bytes between and after items are
// written as zeros (the format's padding), so the output never carries unchecked source bytes.
// A mismatch is kIntegrity naming the source file, the item and its offset.
// Non-goals: deciding where items go (k3prep/split/split.cpp and formats/prepared_layout.h);
// final names (the caller renames the temporary when every file is done).
// Thread safety: plain functions; one call per output file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/hash.h"
#include "common/progress.h"
#include "common/status.h"

namespace k3::prep::split_internal {

enum class CopyCheck { kXxh3_128, kXxh3_64 };

struct CopyItem {
  size_t source = 0;  // index into CopyJob::sources
  uint64_t src_offset = 0;
  uint64_t length = 0;
  uint64_t dst_offset = 0;
  CopyCheck check = CopyCheck::kXxh3_128;
  Hash128 want128;
  uint64_t want64 = 0;
  std::string label;      // "region \"<tensor>\"", "layer 3 expert 5"
  std::string want_from;  // where the expected hash is recorded: "k3.json", "experts.idx"
};

struct CopyJob {
  std::string final_path;            // written under TempPathFor(final_path)
  uint64_t size = 0;                 // the output's size (zeros after the last item)
  std::vector<std::string> sources;  // source files the items read
  std::vector<CopyItem> items;       // ascending, non-overlapping dst ranges inside [0, size)
  std::string status;                // progress text while this file is written
};

struct CopyStats {
  uint64_t bytes_read = 0;     // item bytes read from the sources
  uint64_t bytes_written = 0;  // output bytes (items and padding)
};

// Writes `job` to TempPathFor(job.final_path), synced and closed. On failure the temporary may
// remain (the caller removes it). `progress` counts item bytes.
Status CopyVerified(Env* env, const CopyJob& job, Progress* progress, CopyStats* stats);

}  // namespace k3::prep::split_internal
