// The --resume journal (internal to `k3prep pack`; the contract is pack.h "Resume"):
// PREPARED/pack-journal.k3tmp, an identity line and then one line per finished unit.
//
// Line format: "k3pack-journal 1 <identity hex>\n", then per unit
// "u <unit index> <span XXH3-128> <n> <n region/expert hashes> <XXH3-64 of the line so far>\n".
// A line whose own hash does not match (torn, edited) is ignored; so is the whole journal when
// its identity differs from the current plan's.
// Non-goals: writing and fsyncing the journal file (k3prep/pack/pipeline.h owns that, so a line is
// appended only after its unit's bytes are on disk).
// Thread safety: plain functions over a Plan the caller owns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/env.h"
#include "common/hash.h"
#include "formats/prepared_manifest.h"
#include "k3prep/pack/pack.h"
#include "k3prep/pack/plan.h"

namespace k3::prep::pack_internal {

// XXH3-128 over the canonical config, the experts mode, the output streams and every source
// shard's name and size: a journal written for another plan is never trusted.
Hash128 PlanIdentity(const Plan& plan, prepared::ExpertsMode mode);

// The journal's first line.
std::string JournalHeader(const Hash128& identity);

// The line for a finished unit: its span hash and the hashes of its regions/experts.
std::string JournalLine(const Plan& plan, size_t unit_index);

// Re-reads every journaled unit from its temporary file; a unit whose span hash matches is
// marked reused (its region/expert hashes taken from the journal) and counted in stats.
// Returns the journal text to continue from (the header alone when the journal is missing,
// unreadable or for another plan; never an error: resume then redoes everything).
std::string ReverifyJournal(Env* env, const std::string& journal_path, const Hash128& identity,
                            Plan* plan, PackStats* stats, uint64_t window_bytes);

}  // namespace k3::prep::pack_internal
