// The output directory: final outputs, its state, free space and the finish (see k3prep/pack/output.h).
#include "k3prep/pack/output.h"

#include <algorithm>
#include <map>
#include <memory>

#include "common/align.h"
#include "common/hash.h"
#include "common/progress.h"
#include "formats/experts_index.h"

namespace k3::prep::pack_internal {
namespace {

std::string Parent(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// The nearest directory that exists, for free-space questions about a path not created yet.
std::string ExistingAncestor(Env* env, std::string path) {
  for (int i = 0; i < 4096 && !env->Exists(path); ++i) {
    const std::string up = Parent(path);
    if (up == path) break;
    path = up;
  }
  return path;
}

}  // namespace

std::vector<OutputFile> FinalOutputs(const Plan& plan, const std::string& out,
                                     const std::vector<uint64_t>& tokenizer_sizes) {
  std::vector<OutputFile> files;
  for (const Stream& s : plan.streams) {
    if (!s.final_path.empty()) files.push_back(OutputFile{s.final_path, s.size});
  }
  for (size_t i = 0; i < plan.tokenizer_files.size(); ++i) {
    files.push_back(OutputFile{
        JoinPath(JoinPath(out, std::string(prepared::kTokenizerDir)), plan.tokenizer_files[i]),
        tokenizer_sizes[i]});
  }
  uint64_t table = 0;
  for (const prepared::FileEntry& f : plan.expert_files) table += 4 + f.path.size();
  const uint64_t idx = prepared::kExpertsIndexHeaderSize +
                       AlignUp(table, prepared::kPathTableAlign) +
                       uint64_t{prepared::kExpertRecordSize} * plan.records.size();
  files.push_back(OutputFile{JoinPath(out, std::string(prepared::kExpertsIndexFile)), idx});
  // The manifest: ~300 bytes per region plus the config and file lists.
  files.push_back(OutputFile{JoinPath(out, std::string(prepared::kManifestFile)),
                             (uint64_t{64} << 10) + 512 * plan.regions.size()});
  return files;
}

Result<OutputState> CheckOutputState(Env* env, const PackOptions& o,
                                     const std::vector<OutputFile>& files) {
  if (env->Exists(o.out) && !env->IsDirectory(o.out)) {
    return Status::Invalid(o.out + ": --out exists and is not a directory");
  }
  const std::string sum = JoinPath(o.out, std::string(prepared::kSumFile));
  const std::string journal = JoinPath(o.out, std::string(kPackJournalFile));
  if (env->Exists(sum) && env->Exists(journal)) {
    // The journal goes last, after k3.sum: a pack stopped between the two left it behind.
    if (o.resume) return OutputState::kCompleteJournalLeft;
    return Status::Invalid(journal + ": left by a pack stopped after it wrote " + sum +
                           "; run the same command with --resume to finish it (the directory "
                           "is checked and the journal removed)");
  }
  if (env->Exists(sum)) {
    return Status::Invalid(o.out + ": already holds a complete prepared directory (" + sum +
                           " exists); check it with k3verify prepared, or delete it / choose "
                           "another --out to pack again");
  }
  if (o.resume) return OutputState::kPackable;
  std::vector<std::string> candidates = {journal};
  for (const OutputFile& f : files) {
    candidates.push_back(f.final_path);
    candidates.push_back(TempPathFor(f.final_path));
  }
  for (const std::string& c : candidates) {
    if (env->Exists(c)) {
      return Status::Invalid(c + ": left by an earlier pack; pass --resume to continue it (finished "
                                 "parts are re-verified by hash and kept), or delete it");
    }
  }
  return OutputState::kPackable;
}

Result<prepared::Manifest> RemoveJournalOfCompletePack(Env* env, const PackOptions& o,
                                             const std::string& journal_header) {
  const std::string journal = JoinPath(o.out, std::string(kPackJournalFile));
  prepared::OpenOptions open;
  open.model_dir = o.model_dir;
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(env, o.out, open);
  if (!p.ok()) {
    return p.status().WithContext("finishing the stopped pack in " + o.out +
                                  " (k3.sum and its journal are there, but it does not open; "
                                  "delete the directory and pack again)");
  }
  K3_ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, journal, uint64_t{1} << 30));
  if (text.compare(0, journal_header.size(), journal_header) != 0) {
    return Status::Invalid(journal + ": belongs to another pack (config, mode, outputs or shards "
                           "differ) than the complete one in " + o.out +
                           "; check the command, or delete the journal");
  }
  K3_RETURN_IF_ERROR(env->Remove(journal));
  K3_RETURN_IF_ERROR(env->SyncDir(o.out));
  return std::move(p->manifest);
}

Status CheckFreeSpace(Env* env, const PackOptions& o, const std::vector<OutputFile>& files,
                      const std::vector<std::string>& stripe_abs, size_t n_units) {
  std::map<std::string, uint64_t> need;  // existing directory → bytes still to be written
  const std::string out_key = ExistingAncestor(env, o.out);
  need[out_key] += 128 * n_units + 4096;  // the journal
  for (const OutputFile& f : files) {
    std::string key = out_key;
    for (const std::string& d : stripe_abs) {
      if (Parent(f.final_path) == d) key = ExistingAncestor(env, d);
    }
    uint64_t have = 0;
    for (const std::string& p : {TempPathFor(f.final_path), f.final_path}) {
      if (o.resume && env->Exists(p)) {
        Result<uint64_t> size = env->FileSize(p);
        if (size.ok()) have = std::max(have, std::min(*size, f.size));
      }
    }
    need[key] += f.size - have;
  }
  for (const auto& [dir, bytes] : need) {
    K3_ASSIGN_OR_RETURN(uint64_t avail, env->FreeSpace(dir));
    if (avail < bytes) {
      return Status::Io("not enough disk space on " + dir + ": pack needs " +
                        std::to_string(bytes) + " bytes (" + FormatIecBytes(static_cast<double>(bytes)) +
                        "), " + std::to_string(avail) + " bytes (" +
                        FormatIecBytes(static_cast<double>(avail)) +
                        ") are available; free space, or choose another --out" +
                        (stripe_abs.empty() ? std::string(" (or --experts link)")
                                            : std::string(" or --stripe directories")));
    }
  }
  return Status::Ok();
}

Status AdoptFinalNames(Env* env, const std::vector<OutputFile>& files) {
  for (const OutputFile& f : files) {
    const std::string tmp = TempPathFor(f.final_path);
    if (!env->Exists(f.final_path)) continue;
    const std::string manifest = "/" + std::string(prepared::kManifestFile);
    if (f.final_path.size() >= manifest.size() &&
        f.final_path.compare(f.final_path.size() - manifest.size(), manifest.size(), manifest) ==
            0) {
      K3_RETURN_IF_ERROR(env->Remove(f.final_path));
    } else if (!env->Exists(tmp)) {
      K3_RETURN_IF_ERROR(env->Rename(f.final_path, tmp));
    }
  }
  return Status::Ok();
}

Status WriteSmallTemp(Env* env, const std::string& final_path, const std::string& data,
                      PackStats* stats) {
  K3_ASSIGN_OR_RETURN(std::unique_ptr<File> f, env->Open(TempPathFor(final_path), OpenMode::kCreate));
  K3_RETURN_IF_ERROR(f->WriteExact(0, data.data(), data.size()));
  K3_RETURN_IF_ERROR(f->Sync());
  K3_RETURN_IF_ERROR(f->Close());
  stats->bytes_written += data.size();
  return Status::Ok();
}

prepared::Region WholeFileRegion(const std::string& name, const std::string& data) {
  return prepared::Region{name, name, 0, data.size(), DType::kU8, {data.size()},
                Xxh3_128(data.data(), data.size())};
}

Status RenameAll(Env* env, const std::vector<std::string>& finals) {
  for (size_t i = 0; i < finals.size(); ++i) {
    Status s = env->Rename(TempPathFor(finals[i]), finals[i]);
    if (!s.ok()) {
      RenameBack(env, finals, i);
      return s.WithContext("finishing the pack (nothing was left under a final name; re-run "
                           "with --resume)");
    }
  }
  return Status::Ok();
}

void RenameBack(Env* env, const std::vector<std::string>& finals, size_t count) {
  for (size_t k = count; k-- > 0;) (void)env->Rename(finals[k], TempPathFor(finals[k]));
}

}  // namespace k3::prep::pack_internal
