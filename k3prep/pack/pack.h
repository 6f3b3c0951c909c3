// `k3prep pack`: turns a checkpoint directory into the prepared directory k3run reads
// (DESIGN.md §5, docs/FORMATS.md "The prepared directory").
//
// Goals:
// - One pass over the source bytes: every tensor is read once with large batched reads
//   (BatchReader: io_uring, pread fallback), hashed while it is in memory (XXH3-128 per region,
//   XXH3-64 per expert) and written with large aligned writes. With --jobs ≥ 2 a reader thread
//   fills the next window while the main thread hashes and writes the previous one. Hashes are
//   computed in destination byte order by one thread, so no result depends on --jobs.
// - Nothing looks complete until it is: every output is written under its temporary name
//   (TempPathFor), synced, renamed at the very end (a failed rename rolls the earlier ones
//   back), and k3.json + k3.sum come last (WriteManifestAndSum). A failed or interrupted pack
//   leaves no trunk.bin / resident.bin / experts.idx / k3.json / k3.sum under a final name.
// - Free space is checked before anything is written (kIo naming the directory, the bytes
//   required and the bytes available).
// - k3.json holds nothing time-dependent: packing the same checkpoint twice with the same
//   arguments gives byte-identical manifests.
//
// Link mode (default): no expert bytes are written; each expert's six tensors must be one
// contiguous run in canonical order inside one shard (else kInvalid naming the layer/expert and
// suggesting --experts copy). Every expert is still read and hashed: its XXH3-64 in
// experts.idx is the integrity anchor k3run checks with --verify-reads.
// Copy mode: experts are copied to experts/layer-LLL.bin or, with stripe dirs, spread over
// <dir>/layer-LLL.bin by the stripe rule (PlanCopyExperts).
//
// Resume (--resume), precisely:
// - The unit of work is a "unit": one trunk layer run, one resident.bin tensor (with its
//   padding), or one copy-mode expert (with its padding). While packing, each finished unit
//   appends one line to PREPARED/pack-journal.k3tmp: the XXH3-128 of the unit's whole byte span
//   in the temporary output file, and the hashes of the regions/experts inside it as computed
//   from the source bytes. Lines are appended only after the output file holding the unit has
//   been fsynced (periodically, every `journal_flush_bytes`, and when a pack fails), so a line
//   never describes bytes that are not on disk. Each line carries its own XXH3-64, so a torn
//   last line is ignored.
// - The journal starts with an identity line: XXH3-128 over the canonical config, the experts
//   mode, the output file plan and every source shard's name and size. A journal whose identity
//   differs (another checkpoint, mode or stripe set) is discarded and everything is redone.
// - On --resume every journaled unit is re-read from the temporary file and re-hashed; when the
//   span hash matches the journal, the unit is kept (its region/expert hashes are taken from the
//   journal) and its source bytes are not read again. Units that do not match, or are not in the
//   journal, are redone. Link-mode experts (not written) are always re-read and re-hashed.
//   Resume trusts that shards with the same names and sizes still hold the same bytes; run
//   `k3verify prepared --deep --against` to check.
// - Without --resume, a PREPARED that already holds pack output (final or temporary names, or a
//   journal) is refused (kInvalid): pass --resume or choose an empty directory. A complete
//   PREPARED (k3.sum present) is refused in both cases, with one exception: a pack stopped
//   after it wrote k3.sum and before it removed its journal (its very last step). Without
//   --resume that is refused naming the journal; with --resume the directory is opened and
//   checked like k3run does (k3.sum, k3.json, sizes, experts.idx's hash), the journal must be
//   this plan's, and then it is removed: the result is `already_complete`, nothing re-read.
//
// Non-goals: the byte layout (formats/prepared_layout.h decides it), the manifest schema
// (formats/prepared_manifest.h), verifying an existing prepared directory (k3verify).
// Thread safety: RunPack may be called concurrently for different output directories.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/progress.h"
#include "common/status.h"
#include "formats/prepared_manifest.h"

namespace k3::prep {

inline constexpr std::string_view kPackJournalFile = "pack-journal.k3tmp";

struct PackOptions {
  std::string model_dir;  // as given by the user (recorded as source.model_dir_given)
  std::string out;        // PREPARED
  prepared::ExpertsMode experts = prepared::ExpertsMode::kLink;
  // Copy mode only; relative dirs are made absolute (the manifest records absolute paths).
  std::vector<std::string> stripe_dirs;
  bool resume = false;
  // Carry the vision tower and projector (vision.bin) when config.json has a vision_config;
  // false (--no-vision) makes a text-only directory of a checkpoint with or without them.
  bool vision = true;
  int jobs = 2;  // 1: read, hash and write in one thread; ≥ 2: reader thread + hash/write thread
  ProgressMode progress = ProgressMode::kNone;
  // Size of one read/hash/write window. Tests lower it to exercise window boundaries.
  uint64_t window_bytes = uint64_t{16} << 20;
  // The journal is brought up to date (outputs fsynced, lines appended) after this many output
  // bytes; it is also flushed at the end of the copy and when a pack fails.
  uint64_t journal_flush_bytes = uint64_t{1} << 30;
  // Force the pread pool instead of io_uring (tests, and `doctor`-style comparisons).
  bool force_pread = false;
};

struct PackStats {
  uint64_t units_total = 0;      // written units (trunk runs, resident tensors, copy experts)
  uint64_t units_reused = 0;     // kept by --resume after re-verification
  uint64_t regions_reused = 0;   // trunk/resident regions inside reused units
  uint64_t experts_reused = 0;   // copy-mode experts inside reused units
  uint64_t bytes_read = 0;       // source bytes read (tensors; excludes resume re-verification)
  uint64_t bytes_written = 0;    // bytes written to output files (incl. padding, idx, tokenizer)
  uint64_t bytes_reverified = 0; // bytes re-read from temporary files by --resume
  std::string read_backend;      // BatchReader::backend()
  double seconds = 0;
};

struct PackResult {
  prepared::Manifest manifest;
  PackStats stats;
  // --resume found the pack finished (k3.sum written) with only its journal left to remove.
  bool already_complete = false;
};

// Runs the whole pack. Status codes: kInvalid (exit 2) for usage errors, a missing or invalid
// config/checkpoint, a checkpoint that cannot be packed in the requested mode, or an output
// directory that already holds a pack; kIo (exit 1) for read/write failures and not enough
// disk space; kIntegrity (exit 3) when a shard's size contradicts the download manifest.
Result<PackResult> RunPack(Env* env, const PackOptions& options);

}  // namespace k3::prep
