// k3prep split: RunSplit, the orchestration (checks, plan, verified copies, publish, cleanup).
// See k3prep/split/split.h for the contract; copy.h copies and verifies one file.
#include "k3prep/split/split.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/hash.h"
#include "formats/expert_share.h"
#include "formats/experts_index.h"
#include "formats/prepared_layout.h"
#include "k3prep/split/copy.h"

namespace k3::prep {

using split_internal::CopyCheck;
using split_internal::CopyItem;
using split_internal::CopyJob;
using split_internal::CopyStats;

namespace {

using prepared::ExpertShare;
using prepared::FileEntry;
using prepared::Manifest;
using prepared::PreparedDir;
using prepared::Region;

// Everything the split writes, decided before the first byte is written.
struct Plan {
  std::vector<CopyJob> jobs;  // trunk.bin, resident.bin, expert files, tokenizer files
  std::string index_bytes;    // the share's experts.idx
  Manifest manifest;          // the share's k3.json
  std::string manifest_text;  // its rendering (for the free-space check)
  std::vector<std::string> subdirs;  // experts/, tokenizer/ (made by the split)
  SplitStats stats;
};

Status CheckOptions(const SplitOptions& o) {
  if (o.prepared.empty()) return Status::Invalid("PREPARED: required");
  if (o.out.empty()) return Status::Invalid("--out: required");
  if (o.ranks < 1 || o.ranks > prepared::kMaxRanks) {
    return Status::Invalid("--ranks " + std::to_string(o.ranks) + ": must be 1 to " +
                           std::to_string(prepared::kMaxRanks));
  }
  if (o.rank < 0 || o.rank >= o.ranks) {
    return Status::Invalid("--rank " + std::to_string(o.rank) + ": must be below --ranks " +
                           std::to_string(o.ranks) + " (ranks are numbered 0 to " +
                           std::to_string(o.ranks - 1) + ")");
  }
  return Status::Ok();
}

// A share is written into a fresh directory only: anything already there could be taken for
// part of it.
Status CheckOut(Env* env, const std::string& out) {
  if (!env->Exists(out)) return Status::Ok();
  if (!env->IsDirectory(out)) {
    return Status::Invalid(out + ": --out exists and is not a directory; choose another --out");
  }
  K3_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, env->ListDir(out));
  if (!entries.empty()) {
    return Status::Invalid(out + ": --out exists and is not empty (it holds \"" +
                           entries.front().name + "\"" +
                           (entries.size() > 1 ? " and " + std::to_string(entries.size() - 1) +
                                                     " more"
                                               : std::string()) +
                           "); remove it or choose another --out");
  }
  return Status::Ok();
}

// A whole file of PREPARED (trunk.bin, resident.bin, a tokenizer file) copied to the same path
// under DIR, each of its regions checked against k3.json.
CopyJob WholeFileJob(const PreparedDir& src, const std::string& out, const FileEntry& f) {
  CopyJob job;
  job.final_path = JoinPath(out, f.path);
  job.size = f.size;
  job.sources = {JoinPath(src.dir, f.path)};
  job.status = f.path;
  for (const Region& r : src.manifest.regions) {
    if (r.file != f.path) continue;
    CopyItem it;
    it.src_offset = r.offset;
    it.length = r.length;
    it.dst_offset = r.offset;
    it.check = CopyCheck::kXxh3_128;
    it.want128 = r.xxh3_128;
    it.label = "region \"" + r.name + "\"";
    it.want_from = "k3.json";
    job.items.push_back(std::move(it));
  }
  std::sort(job.items.begin(), job.items.end(),
            [](const CopyItem& a, const CopyItem& b) { return a.dst_offset < b.dst_offset; });
  return job;
}

// The experts the share holds, placed by PlanShareExperts; fills the share's records (absent for
// the other ranks' experts) and one job per expert file.
std::vector<CopyJob> PlanExperts(const PreparedDir& src, const std::string& out,
                                 const prepared::ExpertMap& map, int rank,
                                 prepared::ExpertsIndex* index, std::vector<FileEntry>* files,
                                 SplitStats* stats) {
  const ModelConfig& c = src.manifest.config;
  const int begin = map.Begin(rank), end = map.End(rank);
  const prepared::ExpertPlan ep = prepared::PlanShareExperts(c, begin, end);
  std::vector<CopyJob> jobs(ep.files.size());
  std::vector<std::map<std::string, size_t>> source_ids(ep.files.size());
  for (size_t f = 0; f < ep.files.size(); ++f) {
    jobs[f].final_path = JoinPath(out, ep.files[f]);
    jobs[f].size = ep.file_sizes[f];
    jobs[f].status = ep.files[f];
    files->push_back(FileEntry{ep.files[f], ep.file_sizes[f]});
  }
  const auto sub_sizes = prepared::ExpertSubSizes(c);
  index->files = ep.files;
  index->records.assign(src.experts.records.size(), prepared::MakeAbsentRecord());
  for (int layer = c.first_dense; layer < c.n_layers; ++layer) {
    for (int e = begin; e < end; ++e) {
      const uint64_t i = prepared::ExpertRecordIndex(c, layer, e);
      const prepared::ExpertRecord& rec = src.experts.records[i];
      const prepared::ExpertSlot& slot = ep.slots[i];
      CopyJob& job = jobs[slot.file_id];
      const std::string& path = src.expert_paths[rec.file_id];
      auto [id, added] = source_ids[slot.file_id].emplace(path, job.sources.size());
      if (added) job.sources.push_back(path);
      CopyItem it;
      it.source = id->second;
      it.src_offset = rec.offset;
      it.length = rec.length;
      it.dst_offset = slot.offset;
      it.check = CopyCheck::kXxh3_64;
      it.want64 = rec.xxh3_64;
      it.label = "layer " + std::to_string(layer) + " expert " + std::to_string(e);
      it.want_from = "experts.idx";
      job.items.push_back(std::move(it));  // ascending e: ascending offset in the layer's file
      index->records[i] = prepared::MakeExpertRecord(slot.file_id, slot.offset, sub_sizes,
                                                     rec.xxh3_64);
      ++stats->experts_held;
      stats->expert_bytes += rec.length;
    }
  }
  return jobs;
}

Result<Plan> MakePlan(const PreparedDir& src, const SplitOptions& o) {
  const Manifest& m = src.manifest;
  const ModelConfig& c = m.config;
  Plan plan;
  plan.stats.experts_total = src.experts.records.size();
  for (const FileEntry& f : m.files) {
    if (f.path == prepared::kExpertsIndexFile) continue;
    plan.jobs.push_back(WholeFileJob(src, o.out, f));
    if (f.path == prepared::kTrunkFile) plan.stats.trunk_bytes = f.size;
    if (f.path == prepared::kResidentFile) plan.stats.resident_bytes = f.size;
  }
  prepared::ExpertsIndex index;
  index.n_layers = src.experts.n_layers;
  index.first_moe_layer = src.experts.first_moe_layer;
  index.n_experts = src.experts.n_experts;
  const prepared::ExpertMap map{o.ranks, c.n_experts};
  std::vector<FileEntry> expert_files;
  for (CopyJob& job : PlanExperts(src, o.out, map, o.rank, &index, &expert_files, &plan.stats)) {
    plan.jobs.push_back(std::move(job));
  }
  plan.index_bytes = prepared::EncodeExpertsIndex(index);

  Manifest& share = plan.manifest;
  share = m;
  share.experts_mode = prepared::ExpertsMode::kCopy;
  share.share = ExpertShare{static_cast<uint32_t>(o.ranks), static_cast<uint32_t>(o.rank),
                            std::string(prepared::kContiguousMap)};
  share.expert_files = std::move(expert_files);
  const Hash128 idx_hash = Xxh3_128(plan.index_bytes.data(), plan.index_bytes.size());
  for (FileEntry& f : share.files) {
    if (f.path == prepared::kExpertsIndexFile) f.size = plan.index_bytes.size();
  }
  for (Region& r : share.regions) {
    if (r.name != prepared::kExpertsIndexFile) continue;
    r.length = plan.index_bytes.size();
    r.shape = {r.length};
    r.xxh3_128 = idx_hash;
  }
  // The reader's rules before anything is written: a split that would not open is a bug here.
  Result<std::string> text = prepared::RenderManifest(share);
  if (!text.ok()) return text.status().WithContext("internal: the share's k3.json (please report)");
  plan.manifest_text = std::move(text).value();
  if (!share.expert_files.empty()) plan.subdirs.push_back(JoinPath(o.out, std::string(prepared::kExpertsDir)));
  for (const FileEntry& f : m.files) {
    if (f.path.rfind(std::string(prepared::kTokenizerDir) + "/", 0) == 0) {
      plan.subdirs.push_back(JoinPath(o.out, std::string(prepared::kTokenizerDir)));
      break;
    }
  }
  return plan;
}

// The nearest directory that exists, for the free-space question about a DIR not made yet.
std::string ExistingAncestor(Env* env, std::string path) {
  for (int i = 0; i < 4096 && !env->Exists(path); ++i) {
    const size_t slash = path.find_last_of('/');
    const std::string up = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    if (up == path) break;
    path = up;
  }
  return path;
}

Status CheckFreeSpace(Env* env, const std::string& out, const Plan& plan) {
  uint64_t need = plan.index_bytes.size() + plan.manifest_text.size() + 4096;
  for (const CopyJob& job : plan.jobs) need += job.size;
  const std::string where = ExistingAncestor(env, out);
  K3_ASSIGN_OR_RETURN(uint64_t avail, env->FreeSpace(where));
  if (avail >= need) return Status::Ok();
  return Status::Io("not enough disk space on " + where + ": the share needs " +
                    std::to_string(need) + " bytes (" + FormatIecBytes(double(need)) + "), " +
                    std::to_string(avail) + " bytes (" + FormatIecBytes(double(avail)) +
                    ") are available; free space or choose another --out");
}

// Every path the split may have written under DIR (final and temporary names, k3.json, k3.sum),
// then the subdirectories it made: removed on failure, best effort (DIR was empty before).
void Cleanup(Env* env, const std::string& out, const Plan& plan) {
  std::vector<std::string> paths = {JoinPath(out, std::string(prepared::kSumFile)),
                                    JoinPath(out, std::string(prepared::kManifestFile)),
                                    JoinPath(out, std::string(prepared::kExpertsIndexFile))};
  for (const CopyJob& job : plan.jobs) paths.push_back(job.final_path);
  for (const std::string& p : paths) {
    for (const std::string& q : {p, TempPathFor(p)}) {
      if (env->Exists(q)) (void)env->Remove(q);
    }
  }
  for (const std::string& d : plan.subdirs) {
    if (env->Exists(d)) (void)env->Remove(d);
  }
}

// Writes every output under its temporary name, then renames them all and writes k3.json and
// k3.sum (WriteManifestAndSum: k3.sum last).
Status WriteShare(Env* env, const SplitOptions& o, Plan* plan) {
  K3_RETURN_IF_ERROR(env->MakeDirs(o.out));
  for (const std::string& d : plan->subdirs) K3_RETURN_IF_ERROR(env->MakeDirs(d));
  uint64_t total = 0;
  for (const CopyJob& job : plan->jobs) {
    for (const CopyItem& it : job.items) total += it.length;
  }
  CopyStats copied;
  {
    Progress progress("split", total, o.progress);
    for (const CopyJob& job : plan->jobs) {
      K3_RETURN_IF_ERROR(split_internal::CopyVerified(env, job, &progress, &copied));
    }
    progress.Finish();
  }
  const std::string idx_path = JoinPath(o.out, std::string(prepared::kExpertsIndexFile));
  {
    K3_ASSIGN_OR_RETURN(std::unique_ptr<File> f, env->Open(TempPathFor(idx_path), OpenMode::kCreate));
    K3_RETURN_IF_ERROR(f->WriteExact(0, plan->index_bytes.data(), plan->index_bytes.size()));
    K3_RETURN_IF_ERROR(f->Sync());
    K3_RETURN_IF_ERROR(f->Close());
  }
  K3_RETURN_IF_ERROR(env->Rename(TempPathFor(idx_path), idx_path));
  for (const CopyJob& job : plan->jobs) {
    K3_RETURN_IF_ERROR(env->Rename(TempPathFor(job.final_path), job.final_path));
  }
  K3_RETURN_IF_ERROR(prepared::WriteManifestAndSum(env, o.out, plan->manifest));
  for (const std::string& d : plan->subdirs) K3_RETURN_IF_ERROR(env->SyncDir(d));
  K3_RETURN_IF_ERROR(env->SyncDir(o.out));
  plan->stats.bytes_read = copied.bytes_read;
  plan->stats.bytes_written = copied.bytes_written + plan->index_bytes.size() +
                              plan->manifest_text.size() +
                              prepared::RenderSumLine(plan->manifest_text).size();
  return Status::Ok();
}

}  // namespace

Result<SplitResult> RunSplit(Env* env, const SplitOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  K3_RETURN_IF_ERROR(CheckOptions(o));
  K3_RETURN_IF_ERROR(CheckOut(env, o.out));
  prepared::OpenOptions open;
  open.model_dir = o.model_dir;
  Result<PreparedDir> src = prepared::OpenPrepared(env, o.prepared, open);
  if (!src.ok()) return src.status().WithContext("PREPARED " + o.prepared);
  if (const std::optional<ExpertShare>& s = src->manifest.share) {
    return Status::Invalid(o.prepared + ": already a share (rank " + std::to_string(s->rank) +
                           " of " + std::to_string(s->ranks) + "); split the full directory");
  }
  K3_RETURN_IF_ERROR(
      prepared::ValidateRanks(o.ranks, prepared::RoutedExperts(src->manifest.config), "--ranks"));
  K3_ASSIGN_OR_RETURN(Plan plan, MakePlan(*src, o));
  K3_RETURN_IF_ERROR(CheckFreeSpace(env, o.out, plan));
  Status s = WriteShare(env, o, &plan);
  if (!s.ok()) {
    Cleanup(env, o.out, plan);
    return s;
  }
  SplitResult r;
  r.manifest = std::move(plan.manifest);
  r.stats = plan.stats;
  r.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace k3::prep
