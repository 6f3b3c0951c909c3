// The doctor's checks and rules, in the order the report prints them (see doctor.h).
#include "k3prep/doctor/doctor.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string_view>

#include "common/progress.h"
#include "common/sysinfo.h"
#include "k3prep/doctor/model.h"
#include "k3prep/synth/presets.h"

namespace k3::prep {
namespace {

// The released checkpoint's 96 shards (DESIGN.md §1): what a download needs on disk.
constexpr uint64_t kReleasedCheckpointBytes = 1'560'936'091'448;
constexpr const char* kReleasedRepo = "moonshotai/Kimi-K3";

// Quotes a path for a copy-pasteable shell command when it needs it.
std::string Sh(const std::string& s) {
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || std::string_view("/._-+:,=@").find(ch) !=
                                                               std::string_view::npos;
  });
  if (plain) return s;
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

// DIR without trailing slashes; "." and ".." become their absolute path so "DIR.prep" and
// "DIR/kimi-k3" name sensible places.
std::string CommandDir(const DoctorReport& r) {
  std::string d = r.dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  if ((d == "." || d == "..") && !r.dir_abs.empty()) d = r.dir_abs;
  return d;
}

void CheckMemory(const DoctorOptions& o, DoctorReport* r) {
  MemoryReport& m = r->memory;
  if (o.mem_available) {
    m.available = *o.mem_available;
  } else {
    Result<uint64_t> avail = MemAvailableBytes();
    if (avail.ok()) {
      m.available = *avail;
    } else {
      r->warnings.push_back("MemAvailable unknown (" + avail.status().message() +
                            "): no budget suggested; pass --budget-gb to k3run yourself");
    }
  }
  Result<ModelConfig> released = synth::PresetConfig("full");
  if (released.ok()) {
    Result<BudgetFloor> f = FloorFromConfig(*released);
    if (f.ok()) m.released_trunk_min = f->trunk_min;
  }
  if (!m.available) return;
  m.usable = UsableBudget(*m.available);
  if (const RunPreset* p = LargestPresetWithin(m.usable)) m.suggested_preset = p->name;
  m.released_fits = m.usable >= kReleasedFloorBytes;
  if (m.released_fits) return;
  m.largest_synth = LargestSynthPresetWithin(m.usable);
  r->warnings.push_back(
      "the released model cannot run here: 80 % of MemAvailable is " + DecimalGb(m.usable) +
      ", its floor is " + DecimalGb(kReleasedFloorBytes) + " (the laptop preset; trunk minimum " +
      DecimalGb(m.released_trunk_min) + " = 2 × its largest layer run)" +
      (m.largest_synth ? "; the largest synthetic model that fits is `k3prep synth --preset " +
                             m.largest_synth->preset + "` (needs " +
                             DecimalGb(m.largest_synth->floor.total()) + ")"
                       : std::string("; not even the tiny synthetic model fits")));
}

void CheckCpu(DoctorReport* r) {
  r->cpu = DetectCpuReport();
  r->kernel_path = KernelPathFor(r->cpu.base);
  r->cores = CoreCount();
  if (r->kernel_path == std::string("scalar")) {
    r->warnings.push_back("no AVX2+FMA: k3run falls back to its scalar kernels (several times "
                          "slower); results are bit-identical, only slower");
  }
}

// DIR itself: blocking when it cannot hold anything.
void CheckDir(Env* env, DoctorReport* r) {
  const std::string& dir = r->dir;
  if (!env->Exists(dir)) {
    r->blocking.push_back(dir + ": no such directory; create it (mkdir -p " + Sh(dir) +
                          ") or name the directory that holds or will hold the model");
    return;
  }
  if (!env->IsDirectory(dir)) {
    r->blocking.push_back(dir + ": not a directory; name the directory that holds or will hold "
                                "the model");
    return;
  }
  Result<std::string> abs = env->CanonicalPath(dir);
  if (abs.ok()) r->dir_abs = *abs;
  r->fs = FileSystemOf(dir);
  Result<uint64_t> free_bytes = env->FreeSpace(dir);
  if (free_bytes.ok()) r->free_bytes = *free_bytes;
  r->writable = CheckWritable(env, dir);
  if (!r->writable.writable) {
    r->blocking.push_back(dir + " is not writable (" + r->writable.reason +
                          "); download, pack and this probe write there: fix its permissions "
                          "or choose another directory");
    return;
  }
  r->dir_ok = true;
  r->direct = CheckDirectIo(env, dir);
  if (!r->direct.available) {
    r->warnings.push_back("O_DIRECT refused on " + dir + " (" + r->fs.name + "): " +
                          r->direct.reason + "; k3run would read experts through the page "
                          "cache there, which competes with its own expert cache for memory");
  }
  if (r->fs.in_memory) {
    r->warnings.push_back(dir + " is on " + r->fs.name + ", i.e. in memory: no disk to measure, "
                          "and a model stored there takes RAM the budget cannot use");
  }
  for (const std::string& f : LeftoverScratchFiles(env, dir)) {
    r->warnings.push_back(f + " was left by an interrupted doctor; remove it");
  }
}

void CheckModel(Env* env, DoctorReport* r) {
  if (!r->dir_ok) return;
  r->model = InspectModelDir(env, r->dir);
  const ModelReport& m = r->model;
  if (!m.problem.empty()) {
    r->warnings.push_back(r->dir + " holds a " +
                          (m.kind == ModelKind::kPrepared ? "prepared directory" : "checkpoint") +
                          " that does not open: " + m.problem);
  }
  if (!m.expert_dir.empty() && m.kind == ModelKind::kPrepared && m.expert_dir != r->dir &&
      m.expert_dir != r->dir_abs && m.expert_bytes > 0) {
    r->notes.push_back("expert reads go to " + m.expert_dir + ", not " + r->dir +
                       ": measure that disk too with `k3prep doctor " + Sh(m.expert_dir) +
                       " --read-size " + std::to_string(m.expert_bytes) + "`");
  }
  if (!m.floor || !r->memory.available) return;
  const uint64_t need = m.floor->total();
  const std::string why = "trunk minimum " + DecimalGb(m.floor->trunk_min) +
                          " = 2 × the largest layer run, expert cache minimum " +
                          DecimalGb(m.floor->cache_min) + " = top-k + 1 slots";
  if (*r->memory.available < need) {
    r->blocking.push_back("MemAvailable " + DecimalGb(*r->memory.available) +
                          " is below the smallest budget the model in " + r->dir +
                          " runs with, " + DecimalGb(need) + " (" + why +
                          "); free memory or use a machine with more");
  } else if (r->memory.usable < need) {
    r->warnings.push_back("80 % of MemAvailable (" + DecimalGb(r->memory.usable) +
                          ") is below the model's smallest budget " + DecimalGb(need) + " (" +
                          why + "); k3run --budget-gb " + BudgetFlagGb(need + 999'999) +
                          " leaves little for the rest of the system");
  }
}

void RunProbe(Env* env, const DoctorOptions& o, DoctorReport* r) {
  ProbeSection& p = r->probe;
  if (o.read_size) {
    p.requested_read_bytes = *o.read_size;
    p.read_source = "--read-size";
  } else if (r->model.kind == ModelKind::kPrepared && r->model.expert_bytes > 0) {
    p.requested_read_bytes = r->model.expert_bytes;
    p.read_source = "the largest expert record in experts.idx";
  } else if (r->model.kind == ModelKind::kCheckpoint && r->model.expert_bytes > 0) {
    p.requested_read_bytes = r->model.expert_bytes;
    p.read_source = "one expert of this checkpoint (config.json)";
  } else {
    p.requested_read_bytes = kReleasedExpertBytes;
    p.read_source = "one expert of the released model";
  }
  if (!o.probe) {
    p.skipped = "--no-probe";
  } else if (!r->dir_ok) {
    p.skipped = "DIR is unusable";
  } else if (o.require_direct && !r->direct.available) {
    p.skipped = "O_DIRECT refused (a page-cache measurement would not be the disk's)";
  } else if (r->fs.in_memory) {
    p.skipped = r->fs.name + " is memory, not a disk";
  }
  if (!p.skipped.empty()) return;
  ProbeOptions po;
  po.dir = r->dir;
  po.file_bytes = o.probe_bytes;
  po.read_bytes = p.requested_read_bytes;
  po.seconds_per_depth = o.probe_seconds;
  po.force_pread = o.force_pread;
  po.require_direct = o.require_direct;
  Result<ProbeReport> result = RunDiskProbe(env, po);
  if (!result.ok()) {
    p.skipped = result.status().message();
    r->warnings.push_back(result.status().message());
    return;
  }
  p.ran = true;
  p.result = *result;
  if (p.result.read_bytes < p.requested_read_bytes) {
    r->warnings.push_back("reads were " + std::to_string(p.result.read_bytes) +
                          " bytes, not the " + std::to_string(p.requested_read_bytes) +
                          " asked for: the probe file is smaller; pass a larger --probe-mb");
  }
  r->notes.push_back("the read probe bypasses the page cache (O_DIRECT, a fresh file): these are "
                     "the disk's own rates, what every expert-cache miss in k3run pays");
}

// The budget suggested for one process of a model whose floor is `need`: the largest preset
// within 80 % of MemAvailable that is at least the floor, else that 80 % (or just above the
// floor when 80 % is below it). *flag gets the k3run flag that gives it.
uint64_t SuggestedBudget(const MemoryReport& mem, uint64_t need, std::string* flag) {
  if (const RunPreset* p = LargestPresetWithin(mem.usable, need)) {
    *flag = std::string("--preset ") + p->name;
    return static_cast<uint64_t>(std::llround(p->gb * 1e9));
  }
  const uint64_t bytes = std::max(mem.usable, need + 999'999);
  *flag = "--budget-gb " + BudgetFlagGb(bytes);
  return bytes;
}

// --ranks N: the per-rank plan, from DIR's model, or the released config when DIR holds none.
void PlanScaleOut(const DoctorOptions& o, DoctorReport* r) {
  if (o.ranks <= 0 || !r->dir_ok) return;
  std::optional<ModelSizes> sizes = r->model.sizes;
  std::optional<BudgetFloor> floor = r->model.floor;
  if (r->model.kind == ModelKind::kNone) {
    Result<ModelConfig> c = synth::PresetConfig("full");
    Result<prepared::Layout> layout =
        c.ok() ? LayoutFromConfig(*c) : Result<prepared::Layout>(c.status());
    if (layout.ok()) {
      sizes = SizesOfLayout(*c, *layout, "the released config (estimated: BF16 trunk, no tokenizer)");
      floor = FloorOfLayout(*layout, *c);
    }
  }
  if (!sizes || !floor) {
    r->warnings.push_back("--ranks " + std::to_string(o.ranks) +
                          ": no per-rank plan, the model in " + r->dir + " does not open");
    return;
  }
  std::string flag;
  const uint64_t base = SuggestedBudget(r->memory, floor->total(), &flag);
  Result<RanksReport> plan = PlanRanks(*sizes, o.ranks, base);
  if (!plan.ok()) {
    r->ranks_problem = plan.status().message();
    return;
  }
  r->ranks = std::move(plan).value();
  const std::string n = std::to_string(o.ranks);
  r->notes.push_back("--ranks " + n + ": every rank's share directory holds the whole trunk, "
                     "but only rank 0 reads it in a run; each budget holds the rank's experts in "
                     "RAM: rank 0 gets the one-process budget (" + flag + ") plus its share, "
                     "ranks >= 1 their share plus " + DecimalGb(kRankMarginBytes) +
                     " (they read no trunk: k3run plans them experts-only)");
  if (r->model.kind == ModelKind::kPrepared && r->model.share.empty()) {
    r->notes.push_back("make each rank's directory with `k3prep split " + Sh(CommandDir(*r)) +
                       " --ranks " + n + " --rank R --out " + Sh(CommandDir(*r) + ".rankR") +
                       "` (R = 0 to " + std::to_string(o.ranks - 1) +
                       ") and check it with `k3verify prepared DIR --deep`");
  } else if (!r->model.share.empty()) {
    r->warnings.push_back(r->dir + " is a share (" + r->model.share +
                          "): the plan uses its config and trunk; split the full directory");
  }
}

void ChooseNext(DoctorReport* r) {
  if (!r->blocking.empty()) return;  // the blocking problems say what to do first
  const std::string dir = CommandDir(*r);
  const ModelReport& m = r->model;
  const MemoryReport& mem = r->memory;
  switch (m.kind) {
    case ModelKind::kPrepared: {
      if (!m.problem.empty() || !m.floor) {
        r->next_command = "k3verify prepared " + Sh(dir);
        return;
      }
      std::string budget;
      (void)SuggestedBudget(mem, m.floor->total(), &budget);
      r->next_command = "k3run " + Sh(dir) + " " + budget + " --prompt \"...\"";
      return;
    }
    case ModelKind::kCheckpoint:
      r->next_command = m.problem.empty() ? "k3prep pack " + Sh(dir) + " --out " + Sh(dir + ".prep")
                        : !m.download_repo.empty()
                            ? "k3prep download " + m.download_repo + " --dest " + Sh(dir)
                            : "k3verify shards " + Sh(dir);
      return;
    case ModelKind::kNone:
      break;
  }
  if (!m.download_repo.empty()) {
    r->next_command = "k3prep download " + m.download_repo + " --dest " + Sh(dir);
    return;
  }
  if (mem.available && !mem.released_fits) {
    if (mem.largest_synth) {
      r->next_command = "k3prep synth --preset " + mem.largest_synth->preset + " --out " +
                        Sh(dir + "/synth-" + mem.largest_synth->preset);
    }
    return;
  }
  r->next_command = std::string("k3prep download ") + kReleasedRepo + " --dest " +
                    Sh(dir + "/kimi-k3");
  if (r->free_bytes && *r->free_bytes < kReleasedCheckpointBytes) {
    r->warnings.push_back("the released checkpoint takes " + DecimalGb(kReleasedCheckpointBytes) +
                          "; " + r->dir + " has " + DecimalGb(*r->free_bytes) +
                          " free: download to a larger disk");
  }
}

}  // namespace

const char* ModelKindName(ModelKind k) {
  switch (k) {
    case ModelKind::kCheckpoint: return "checkpoint";
    case ModelKind::kPrepared: return "prepared";
    case ModelKind::kNone: break;
  }
  return "none";
}

Status DoctorReport::Verdict() const {
  if (!ranks_problem.empty()) return Status::Invalid(ranks_problem);
  if (blocking.empty()) return Status::Ok();
  return Status::Io(std::to_string(blocking.size()) + " blocking problem" +
                    (blocking.size() == 1 ? "" : "s") + ": " + blocking.front());
}

DoctorReport RunDoctor(Env* env, const DoctorOptions& o) {
  DoctorReport r;
  r.dir = o.dir.empty() ? "." : o.dir;
  CheckCpu(&r);
  CheckMemory(o, &r);
  r.uring = ProbeIoUring();
  if (!r.uring.available) r.warnings.push_back(r.uring.reason);
  CheckDir(env, &r);
  CheckModel(env, &r);
  RunProbe(env, o, &r);
  ChooseNext(&r);
  PlanScaleOut(o, &r);
  return r;
}

}  // namespace k3::prep
