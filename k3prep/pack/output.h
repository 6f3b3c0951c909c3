// The output directory of `k3prep pack` (internal): which files a pack leaves under final names,
// whether PREPARED may be packed into (pack.h "Resume"), free space, and the finish (small
// files written under temporary names, renames that roll back on failure).
//
// Invariant kept here: nothing appears under a final name until every output is complete; a
// failed rename puts the finished ones back under their temporary names.
// Non-goals: the big outputs' bytes (k3prep/pack/pipeline.h), k3.json/k3.sum (WriteManifestAndSum).
// Thread safety: plain functions; callers packing into different directories do not interact.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/status.h"
#include "formats/prepared_layout.h"
#include "k3prep/pack/pack.h"
#include "k3prep/pack/plan.h"

namespace k3::prep::pack_internal {

struct OutputFile {
  std::string final_path;
  uint64_t size = 0;
};

// Every file a pack would leave under a final name, with its expected size (k3.json and k3.sum
// have estimated sizes: they are checked for existence only).
std::vector<OutputFile> FinalOutputs(const Plan& plan, const std::string& out,
                                     const std::vector<uint64_t>& tokenizer_sizes);

enum class OutputState {
  kPackable,              // empty, or (with --resume) holding an earlier pack's parts
  kCompleteJournalLeft,   // k3.sum written, the journal not yet removed; only with --resume
};

// kInvalid when --out is not a directory, already holds a complete pack (k3.sum), or (without
// --resume) holds anything an earlier pack left (final or temporary names, the journal).
// A complete pack whose journal is still there is kCompleteJournalLeft under --resume.
Result<OutputState> CheckOutputState(Env* env, const PackOptions& o,
                                     const std::vector<OutputFile>& files);

// Finishes a kCompleteJournalLeft directory: opens it as k3run would, requires the journal to be
// this plan's (`journal_header`), removes the journal and returns the opened manifest.
Result<prepared::Manifest> RemoveJournalOfCompletePack(Env* env, const PackOptions& o,
                                             const std::string& journal_header);

// kIo naming the directory, the bytes required and the bytes available when a filesystem
// (--out's or a stripe directory's) cannot hold what is still to be written.
Status CheckFreeSpace(Env* env, const PackOptions& o, const std::vector<OutputFile>& files,
                      const std::vector<std::string>& stripe_abs, size_t n_units);

// A crash during the rename phase can leave finished files under final names without k3.sum:
// --resume takes them back as temporaries (and drops a k3.json without its k3.sum).
Status AdoptFinalNames(Env* env, const std::vector<OutputFile>& files);

// Writes a small whole file under its temporary name (synced); counts it in stats.
Status WriteSmallTemp(Env* env, const std::string& final_path, const std::string& data,
                      PackStats* stats);

// The manifest region covering a whole small file (experts.idx, tokenizer files).
prepared::Region WholeFileRegion(const std::string& name, const std::string& data);

// Renames every temporary to its final name; on failure renames the finished ones back, so a
// failed finish leaves no final name behind (and --resume still finds the temporaries).
Status RenameAll(Env* env, const std::vector<std::string>& finals);

// Renames finals[0, count) back to their temporary names, last first (best effort: used only
// on a path that already fails).
void RenameBack(Env* env, const std::vector<std::string>& finals, size_t count);

}  // namespace k3::prep::pack_internal
