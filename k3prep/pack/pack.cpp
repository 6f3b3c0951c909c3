// k3prep pack: RunPack, the orchestration (options, plan, output checks, resume, the pipeline,
// the finish). The parts live beside it: pack_plan (what goes where), pack_journal (--resume),
// pack_pipeline (read → hash → write), pack_output (directory state, free space, renames).
// See pack.h for the contract.
#include "k3prep/pack/pack.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "common/align.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/progress.h"
#include "formats/experts_index.h"
#include "formats/prepared_layout.h"
#include "k3prep/pack/journal.h"
#include "k3prep/pack/manifest.h"
#include "k3prep/pack/output.h"
#include "k3prep/pack/pipeline.h"
#include "k3prep/pack/plan.h"

namespace k3::prep {

using pack_internal::AdoptFinalNames;
using pack_internal::CheckFreeSpace;
using pack_internal::CheckOutputState;
using pack_internal::FinalOutputs;
using pack_internal::JournalHeader;
using pack_internal::MakePlan;
using pack_internal::MakeWindows;
using pack_internal::OutputFile;
using pack_internal::OutputState;
using pack_internal::Packer;
using pack_internal::Plan;
using pack_internal::PlanIdentity;
using pack_internal::RemoveJournalOfCompletePack;
using pack_internal::RenameAll;
using pack_internal::RenameBack;
using pack_internal::ReverifyJournal;
using pack_internal::Stream;
using pack_internal::Unit;
using pack_internal::WholeFileRegion;
using pack_internal::Window;
using pack_internal::WriteSmallTemp;

namespace {

Result<std::string> AbsoluteDir(Env* env, const std::string& dir) {
  if (env->Exists(dir)) return env->CanonicalPath(dir);
  if (!dir.empty() && dir.front() == '/') return dir;
  K3_ASSIGN_OR_RETURN(std::string cwd, env->CanonicalPath("."));
  return JoinPath(cwd, dir);
}

// The directories a pack writes into, in creation order: made before the first write and
// fsynced (same order) once every final name is in place.
std::vector<std::string> OutputDirs(const PackOptions& o, const Plan& plan,
                                    const std::vector<std::string>& stripe_abs) {
  std::vector<std::string> dirs = {o.out};
  if (o.experts == prepared::ExpertsMode::kCopy && stripe_abs.empty()) {
    dirs.push_back(JoinPath(o.out, std::string(prepared::kExpertsDir)));
  }
  if (!plan.tokenizer_files.empty()) dirs.push_back(JoinPath(o.out, std::string(prepared::kTokenizerDir)));
  dirs.insert(dirs.end(), stripe_abs.begin(), stripe_abs.end());
  return dirs;
}

// Checks the options, rounds the window to whole trunk runs, and returns the --stripe
// directories as absolute paths (each once).
Result<std::vector<std::string>> CheckOptions(Env* env, PackOptions* o) {
  if (o->model_dir.empty()) return Status::Invalid("MODEL_DIR: required");
  if (o->out.empty()) return Status::Invalid("--out: required");
  if (o->jobs < 1) return Status::Invalid("--jobs " + std::to_string(o->jobs) + ": must be >= 1");
  if (!o->stripe_dirs.empty() && o->experts != prepared::ExpertsMode::kCopy) {
    return Status::Invalid("--stripe: spreads copied experts over disks, so it needs "
                           "--experts copy");
  }
  o->window_bytes =
      AlignUp(std::max<uint64_t>(o->window_bytes, prepared::kRunAlign), prepared::kRunAlign);
  std::vector<std::string> stripe_abs;
  for (const std::string& d : o->stripe_dirs) {
    if (d.empty()) return Status::Invalid("--stripe: empty directory name");
    K3_ASSIGN_OR_RETURN(std::string abs, AbsoluteDir(env, d));
    if (std::find(stripe_abs.begin(), stripe_abs.end(), abs) != stripe_abs.end()) {
      return Status::Invalid("--stripe: directory " + abs + " is listed twice");
    }
    stripe_abs.push_back(std::move(abs));
  }
  return stripe_abs;
}

// Files written after the streams, whole: experts.idx and the tokenizer copies (under
// temporary names, appended to *finals), with their manifest entries (in *parts).
Status WriteSmallFiles(Env* env, const PackOptions& o, const Plan& plan, PackStats* stats,
                       std::vector<std::string>* finals, ManifestParts* parts) {
  auto add = [&](const std::string& rel, const std::string& bytes) -> Status {
    const std::string path = JoinPath(o.out, rel);
    K3_RETURN_IF_ERROR(WriteSmallTemp(env, path, bytes, stats));
    finals->push_back(path);
    parts->small_regions.push_back(WholeFileRegion(rel, bytes));
    parts->small_files.push_back(prepared::FileEntry{rel, bytes.size()});
    return Status::Ok();
  };
  K3_RETURN_IF_ERROR(add(std::string(prepared::kExpertsIndexFile),
                         prepared::EncodeExpertsIndex(
                             MakeExpertsIndex(plan.config, plan.expert_files, plan.records))));
  for (const std::string& name : plan.tokenizer_files) {
    K3_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(env, JoinPath(o.model_dir, name)));
    K3_RETURN_IF_ERROR(add(std::string(prepared::kTokenizerDir) + "/" + name, bytes));
  }
  return Status::Ok();
}

// k3.json of the finished pack, validated.
Result<prepared::Manifest> MakeManifest(const PackOptions& o, const Plan& plan,
                                        const ManifestParts& parts) {
  for (size_t e = 0; e < plan.expert_hashed.size(); ++e) {
    if (!plan.expert_hashed[e]) {
      return Status::Io("internal: expert record " + std::to_string(e) +
                        " was never hashed (please report)");
    }
  }
  return AssembleManifest(plan.config, plan.source, o.experts, parts);
}

// Renames every output to its final name, writes k3.json and k3.sum, fsyncs the directories
// and removes the journal. If k3.json/k3.sum cannot be written, the renames are undone.
Status Publish(Env* env, const PackOptions& o, const prepared::Manifest& m,
               const std::vector<std::string>& finals, const std::vector<std::string>& dirs,
               const std::string& journal_path) {
  K3_RETURN_IF_ERROR(RenameAll(env, finals));
  Status s = prepared::WriteManifestAndSum(env, o.out, m);
  if (!s.ok()) {
    const std::string json_path = JoinPath(o.out, std::string(prepared::kManifestFile));
    if (env->Exists(json_path) && !env->Exists(JoinPath(o.out, std::string(prepared::kSumFile)))) {
      (void)env->Remove(json_path);
    }
    RenameBack(env, finals, finals.size());
    return s.WithContext("writing k3.json/k3.sum (nothing was left under a final name; re-run "
                         "with --resume)");
  }
  for (const std::string& d : dirs) K3_RETURN_IF_ERROR(env->SyncDir(d));
  return env->Remove(journal_path);
}

}  // namespace

Result<PackResult> RunPack(Env* env, const PackOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  PackOptions o = opts;
  K3_ASSIGN_OR_RETURN(const std::vector<std::string> stripe_abs, CheckOptions(env, &o));

  K3_ASSIGN_OR_RETURN(Plan plan, MakePlan(env, o, stripe_abs));
  std::vector<uint64_t> tokenizer_sizes;
  for (const std::string& name : plan.tokenizer_files) {
    K3_ASSIGN_OR_RETURN(uint64_t size, env->FileSize(JoinPath(o.model_dir, name)));
    tokenizer_sizes.push_back(size);
  }
  const std::vector<OutputFile> files = FinalOutputs(plan, o.out, tokenizer_sizes);
  K3_ASSIGN_OR_RETURN(const OutputState state, CheckOutputState(env, o, files));
  const Hash128 identity = PlanIdentity(plan, o.experts);
  if (state == OutputState::kCompleteJournalLeft) {
    PackResult done;
    K3_ASSIGN_OR_RETURN(done.manifest,
                        RemoveJournalOfCompletePack(env, o, JournalHeader(identity)));
    done.already_complete = true;
    done.stats.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return done;
  }
  K3_RETURN_IF_ERROR(CheckFreeSpace(env, o, files, stripe_abs, plan.units.size()));

  // From here on the pack writes (temporary names only until the finish).
  const std::vector<std::string> dirs = OutputDirs(o, plan, stripe_abs);
  for (const std::string& d : dirs) K3_RETURN_IF_ERROR(env->MakeDirs(d));

  PackResult result;
  PackStats& stats = result.stats;
  const std::string journal_path = JoinPath(o.out, std::string(kPackJournalFile));
  std::string journal_text = JournalHeader(identity);
  if (o.resume) {
    K3_RETURN_IF_ERROR(AdoptFinalNames(env, files));
    journal_text = ReverifyJournal(env, journal_path, identity, &plan, &stats, o.window_bytes);
  }
  for (const Unit& u : plan.units) {
    if (!plan.streams[u.stream].final_path.empty()) ++stats.units_total;
  }
  if (o.resume) {
    LogInfo("resume: kept " + std::to_string(stats.units_reused) + " of " +
            std::to_string(stats.units_total) + " finished units after re-hashing " +
            FormatIecBytes(static_cast<double>(stats.bytes_reverified)));
  }

  const std::vector<Window> windows = MakeWindows(plan, o.window_bytes);
  uint64_t total = 0;
  for (const Window& w : windows) total += w.end - w.begin;
  Packer packer(env, &plan, o, &stats);
  K3_RETURN_IF_ERROR(packer.OpenSources());
  K3_RETURN_IF_ERROR(packer.StartJournal(journal_path, journal_text));
  K3_RETURN_IF_ERROR(packer.OpenOutputs());
  {
    Progress progress("pack", total, o.progress);
    K3_RETURN_IF_ERROR(packer.Run(windows, &progress));
    progress.Finish();
  }
  stats.read_backend = packer.backend();
  K3_RETURN_IF_ERROR(packer.FinishOutputs());

  // Small files (temporary names), then k3.json, then every final name at once.
  std::vector<std::string> finals;
  for (const Stream& st : plan.streams) {
    if (!st.final_path.empty()) finals.push_back(st.final_path);
  }
  ManifestParts parts{&plan.layout, &plan.regions, &plan.expert_files, {}, {}, plan.vision,
                      plan.vision_layout.bytes};
  K3_RETURN_IF_ERROR(WriteSmallFiles(env, o, plan, &stats, &finals, &parts));
  K3_ASSIGN_OR_RETURN(result.manifest, MakeManifest(o, plan, parts));
  K3_RETURN_IF_ERROR(Publish(env, o, result.manifest, finals, dirs, journal_path));
  stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace k3::prep
