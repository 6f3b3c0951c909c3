// `k3prep doctor [DIR]` (DESIGN.md §6, docs/DOCTOR.md): can this machine and DIR run Kimi K3,
// with what budget, how fast is DIR's disk for expert reads, and what to run next.
//
// Goals: one report, gathered without side effects beyond scratch files that are always removed;
// every finding is a fact, a warning (exit 0) or a blocking problem (exit 1: DIR missing, not a
// directory or not writable; MemAvailable below the smallest budget the model in DIR can run
// with). With --ranks N, also each rank's needs for an N-rank MPI run (ranks.h). The report is the same data for the aligned text table and the --json object.
// Non-goals: fixing anything; validating a checkpoint or prepared directory byte by byte
// (k3verify does that: the doctor only opens what it needs and points there on failure).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/status.h"
#include "k3prep/doctor/budget.h"
#include "k3prep/doctor/probe.h"
#include "k3prep/doctor/ranks.h"
#include "k3prep/doctor/system.h"

namespace k3::prep {

struct DoctorOptions {
  std::string dir = ".";
  uint64_t probe_bytes = uint64_t{1024} << 20;  // --probe-mb
  double probe_seconds = 3.0;                   // --probe-seconds, per queue depth
  std::optional<uint64_t> read_size;            // --read-size
  bool probe = true;                            // --no-probe turns it off
  bool force_pread = false;                     // --pread
  // Facts tests pin instead of asking the machine.
  std::optional<uint64_t> mem_available;
  // See ProbeOptions::require_direct (tests through FaultEnv only).
  bool require_direct = true;
  // --ranks N: also print what each rank of an N-rank MPI run needs (ranks.h); 0: not asked.
  int ranks = 0;
};

enum class ModelKind { kNone, kCheckpoint, kPrepared };
const char* ModelKindName(ModelKind k);  // "none" | "checkpoint" | "prepared"

struct ModelReport {
  ModelKind kind = ModelKind::kNone;
  std::string summary;  // one line: what DIR holds
  std::string problem;  // when it does not open or lay out (then floor is unset)
  std::optional<BudgetFloor> floor;
  uint64_t expert_bytes = 0;  // largest expert record (0: unknown or none)
  std::string expert_dir;     // where k3run's expert reads will go (link mode: the shards)
  std::string download_repo;  // from DIR/k3-download.json, when present (resume a download)
  std::optional<ModelSizes> sizes;  // what --ranks plans from (when the model lays out)
  std::string share;          // a prepared DIR that is one rank's share: "rank 1 of 4 (contiguous)"
};

struct MemoryReport {
  std::optional<uint64_t> available;  // MemAvailable; unset when /proc/meminfo is unreadable
  uint64_t usable = 0;                // 80 %
  std::string suggested_preset;       // largest k3run preset ≤ usable; empty when none
  bool released_fits = false;         // usable ≥ kReleasedFloorBytes
  uint64_t released_trunk_min = 0;    // computed from the released config
  std::optional<SynthFit> largest_synth;  // when the released model does not fit
};

struct ProbeSection {
  bool ran = false;
  std::string skipped;      // why not, when !ran
  std::string read_source;  // where the read size came from
  uint64_t requested_read_bytes = 0;
  ProbeReport result;
};

struct DoctorReport {
  std::string dir;
  std::string dir_abs;  // canonical, when DIR exists
  CpuReport cpu;
  std::string kernel_path;
  int cores = 0;
  MemoryReport memory;
  UringReport uring;
  bool dir_ok = false;  // exists, is a directory, writable
  WritableReport writable;
  DirectIoReport direct;
  FsType fs;
  std::optional<uint64_t> free_bytes;
  ProbeSection probe;
  ModelReport model;
  std::optional<RanksReport> ranks;  // --ranks
  std::string ranks_problem;         // --ranks N that the model cannot be split into (exit 2)
  std::string next_command;
  std::vector<std::string> notes;     // facts worth a sentence
  std::vector<std::string> warnings;  // do not fail the run
  std::vector<std::string> blocking;  // exit 1

  // OK; kInvalid for a --ranks the model cannot be split into (exit 2); else kIo "<n> blocking
  // problem(s): <first>" (exit 1).
  Status Verdict() const;
};

DoctorReport RunDoctor(Env* env, const DoctorOptions& options);

// Aligned table of every check, then notes, warnings, blocking problems and the next command.
std::string RenderDoctorText(const DoctorReport& r);
// {"format":"k3-doctor","version":1,…} (field list in docs/DOCTOR.md), '\n'-terminated.
std::string RenderDoctorJson(const DoctorReport& r);

}  // namespace k3::prep
