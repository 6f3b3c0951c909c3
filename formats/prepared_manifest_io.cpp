// k3.sum and the directory-level read/write of k3.json (hash before parse; sum written last).
#include <cstring>

#include "formats/prepared_manifest.h"

namespace k3::prepared {
namespace {

constexpr std::string_view kSumPrefix = "xxh3-128 ";
constexpr std::string_view kSumSuffix = " k3.json\n";

}  // namespace

std::string RenderSumLine(std::string_view manifest_text) {
  return std::string(kSumPrefix) + Xxh3_128(manifest_text.data(), manifest_text.size()).Hex() +
         std::string(kSumSuffix);
}

Result<Hash128> ParseSumLine(std::string_view text, const std::string& source) {
  const size_t want = kSumPrefix.size() + 32 + kSumSuffix.size();
  Hash128 h;
  if (text.size() != want || text.substr(0, kSumPrefix.size()) != kSumPrefix ||
      text.substr(kSumPrefix.size() + 32) != kSumSuffix ||
      !Hash128::FromHex(std::string(text.substr(kSumPrefix.size(), 32)), &h)) {
    return Status::Invalid(source +
                           ": malformed: must be exactly one line \"xxh3-128 <32 lowercase hex> "
                           "k3.json\" ending in a newline (the pack was interrupted or the file "
                           "was edited; re-run k3prep pack)");
  }
  return h;
}

Result<std::string> ReadVerifiedManifestText(Env* env, const std::string& dir) {
  const std::string sum_path = JoinPath(dir, std::string(kSumFile));
  const std::string json_path = JoinPath(dir, std::string(kManifestFile));
  if (!env->Exists(sum_path)) {
    return Status::Invalid(sum_path +
                           ": missing, so k3.json cannot be trusted (an interrupted pack, or not "
                           "a prepared directory); re-run k3prep pack");
  }
  K3_ASSIGN_OR_RETURN(std::string sum_text, ReadFileToString(env, sum_path, 4096));
  K3_ASSIGN_OR_RETURN(Hash128 want, ParseSumLine(sum_text, sum_path));
  if (!env->Exists(json_path)) {
    return Status::Invalid(json_path + ": missing although k3.sum exists; re-run k3prep pack");
  }
  K3_ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, json_path, kMaxManifestBytes));
  const Hash128 got = Xxh3_128(text.data(), text.size());
  if (got != want) {
    return Status::Integrity(json_path + ": k3.json altered: its XXH3-128 is " + got.Hex() +
                             ", k3.sum records " + want.Hex() +
                             " (the manifest changed after packing; re-run k3prep pack)");
  }
  return text;
}

Status WriteManifestAndSum(Env* env, const std::string& dir, const Manifest& m) {
  K3_ASSIGN_OR_RETURN(std::string text, RenderManifest(m));
  const std::string sum_path = JoinPath(dir, std::string(kSumFile));
  // A stale k3.sum next to a new k3.json would read as tampering; without one it reads as an
  // unfinished pack, which is the truth until the new sum lands.
  if (env->Exists(sum_path)) K3_RETURN_IF_ERROR(env->Remove(sum_path));
  K3_RETURN_IF_ERROR(WriteFileAtomic(env, JoinPath(dir, std::string(kManifestFile)), text));
  return WriteFileAtomic(env, sum_path, RenderSumLine(text));
}

std::string ResolveExpertPath(const Manifest& m, const std::string& prepared_dir,
                              const std::string& path, const std::string& model_dir) {
  if (!path.empty() && path.front() == '/') return path;
  if (m.experts_mode == ExpertsMode::kCopy) return JoinPath(prepared_dir, path);
  return JoinPath(model_dir.empty() ? m.source.model_dir_abs : model_dir, path);
}

Result<ExpertsIndex> ReadExpertsIndex(Env* env, const std::string& dir, const Manifest& m) {
  const std::string idx_path = JoinPath(dir, std::string(kExpertsIndexFile));
  K3_ASSIGN_OR_RETURN(std::string idx_bytes,
                      ReadFileToString(env, idx_path, m.FindFile(kExpertsIndexFile)->size));
  // Hashed before it is interpreted: records permuted within a layer decode and validate
  // (every offset is still inside its file) yet route tokens to the wrong experts.
  // ValidateManifest guarantees the whole-file region.
  const Region& region = *m.FindRegion(kExpertsIndexFile);
  const Hash128 got = Xxh3_128(idx_bytes.data(), idx_bytes.size());
  if (got != region.xxh3_128) {
    return Status::Integrity(idx_path + ": experts.idx altered: its XXH3-128 is " + got.Hex() +
                             ", k3.json records " + region.xxh3_128.Hex());
  }
  K3_ASSIGN_OR_RETURN(ExpertsIndex idx, DecodeExpertsIndex(idx_bytes, idx_path));
  if (idx.files.size() != m.expert_files.size()) {
    return Status::Invalid(idx_path + ": path table lists " +
                           std::to_string(idx.files.size()) + " files, k3.json expert_files " +
                           std::to_string(m.expert_files.size()));
  }
  ExpertsIndexCheck check;
  check.config = &m.config;
  check.require_aligned = m.experts_mode == ExpertsMode::kCopy;
  check.share = m.share ? &*m.share : nullptr;
  for (size_t i = 0; i < m.expert_files.size(); ++i) {
    if (idx.files[i] != m.expert_files[i].path) {
      return Status::Invalid(idx_path + ": path table entry " + std::to_string(i) + " \"" +
                             idx.files[i] + "\" differs from k3.json expert_files[" +
                             std::to_string(i) + "] \"" + m.expert_files[i].path + "\"");
    }
    check.file_sizes.push_back(m.expert_files[i].size);
  }
  K3_RETURN_IF_ERROR(ValidateExpertsIndex(idx, check, idx_path));
  return idx;
}

Result<PreparedDir> OpenPrepared(Env* env, const std::string& dir, const OpenOptions& options) {
  const std::string json_path = JoinPath(dir, std::string(kManifestFile));
  K3_ASSIGN_OR_RETURN(std::string text, ReadVerifiedManifestText(env, dir));
  PreparedDir out;
  out.dir = dir;
  out.manifest_hash = Xxh3_128(text.data(), text.size());
  K3_ASSIGN_OR_RETURN(out.manifest, ParseManifest(text, json_path));
  const Manifest& m = out.manifest;

  for (const FileEntry& f : m.files) {
    const std::string path = JoinPath(dir, f.path);
    K3_ASSIGN_OR_RETURN(uint64_t size, env->FileSize(path));
    if (size != f.size) {
      return Status::Invalid(path + ": file is " + std::to_string(size) + " bytes, k3.json records " +
                             std::to_string(f.size) +
                             (size < f.size ? " (truncated" : " (grown") +
                             " after packing; re-run k3prep pack)");
    }
  }

  K3_ASSIGN_OR_RETURN(out.experts, ReadExpertsIndex(env, dir, m));

  for (const FileEntry& f : m.expert_files) {
    std::string path = ResolveExpertPath(m, dir, f.path, options.model_dir);
    if (options.check_expert_files) {
      if (!env->Exists(path)) {
        return Status::Invalid(path + ": expert file is missing" +
                               (m.experts_mode == ExpertsMode::kLink
                                    ? std::string(" (link mode reads experts from the source "
                                                  "shards; pass --model-dir if they moved)")
                                    : std::string()));
      }
      K3_ASSIGN_OR_RETURN(uint64_t size, env->FileSize(path));
      if (size != f.size) {
        return Status::Invalid(path + ": expert file is " + std::to_string(size) +
                               " bytes, k3.json records " + std::to_string(f.size));
      }
    }
    out.expert_paths.push_back(std::move(path));
  }
  return out;
}

}  // namespace k3::prepared
