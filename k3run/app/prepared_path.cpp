#include "k3run/app/prepared_path.h"

#include <algorithm>
#include <cctype>
#include <string_view>

#include "formats/prepared_layout.h"

namespace k3::run {
namespace {

// The journal `k3prep pack` keeps until a pack is complete (k3prep/pack/journal.h).
constexpr std::string_view kPackJournal = "pack-journal.k3tmp";
// A checkpoint's config (k3prep/doctor/model.h kConfigFile; k3run may not include k3prep).
constexpr std::string_view kCheckpointConfig = "config.json";

std::string WithoutTrailingSlashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

}  // namespace

std::string ShellQuoted(const std::string& s) {
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) ||
           std::string_view("/._-+:,=@").find(ch) != std::string_view::npos;
  });
  if (plain) return s;
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

Status CheckPreparedPath(Env* env, const std::string& dir) {
  if (!env->Exists(dir)) {
    return Status::Invalid(dir + " does not exist: give the directory that `k3prep pack "
                           "MODEL_DIR --out PREPARED` made");
  }
  if (!env->IsDirectory(dir)) {
    return Status::Invalid(dir + " is not a directory: give the directory that `k3prep pack "
                           "MODEL_DIR --out PREPARED` made");
  }
  if (env->Exists(JoinPath(dir, std::string(prepared::kManifestFile)))) return Status::Ok();
  if (env->Exists(JoinPath(dir, std::string(kPackJournal)))) {
    return Status::Invalid(dir + " is an incomplete prepared directory: its pack did not finish "
                           "(" + std::string(kPackJournal) + " is there, k3.json is not); "
                           "finish it with: k3prep pack MODEL_DIR --out " + ShellQuoted(dir) +
                           " --resume");
  }
  if (env->Exists(JoinPath(dir, std::string(kCheckpointConfig)))) {
    const std::string d = WithoutTrailingSlashes(dir);
    return Status::Invalid(dir + " is a checkpoint (config.json, no k3.json), not a prepared "
                           "directory: pack it first with: k3prep pack " + ShellQuoted(d) +
                           " --out " + ShellQuoted(d + ".prep"));
  }
  return Status::Invalid(dir + " is not a prepared directory (no k3.json) nor a checkpoint (no "
                         "config.json): give the directory that `k3prep pack MODEL_DIR --out "
                         "PREPARED` made (`k3prep doctor DIR` tells what a directory holds)");
}

Status ExplainOpenFailure(Env* env, const std::string& dir, const Status& failure) {
  // With k3.sum present the open error already names what is wrong (a hash, a moved shard).
  if (failure.ok() || env->Exists(JoinPath(dir, std::string(prepared::kSumFile)))) return failure;
  const std::string msg =
      dir + " is an incomplete prepared directory (no k3.sum): " + failure.message() +
      (env->Exists(JoinPath(dir, std::string(kPackJournal)))
           ? "; its pack did not finish: k3prep pack MODEL_DIR --out " + ShellQuoted(dir) +
                 " --resume"
           : "; audit it with: k3verify prepared " + ShellQuoted(dir));
  switch (failure.code()) {
    case Code::kIo: return Status::Io(msg);
    case Code::kIntegrity: return Status::Integrity(msg);
    case Code::kUnreliable: return Status::Unreliable(msg);
    default: return Status::Invalid(msg);
  }
}

}  // namespace k3::run
