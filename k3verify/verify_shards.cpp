#include "k3verify/verify_shards.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/hash.h"
#include "common/parallel.h"
#include "common/sysinfo.h"
#include "formats/config.h"
#include "formats/vision_config.h"
#include "formats/download_manifest.h"
#include "formats/prepared_layout.h"
#include "formats/safetensors.h"
#include "k3verify/verdict.h"

namespace k3::verify {
namespace {

constexpr size_t kHashChunk = 8u << 20;  // large sequential reads: the disk, not syscalls, limits
constexpr char kIndexFileName[] = "model.safetensors.index.json";

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// SHA-256 of one file, streamed in large chunks, reporting bytes to `progress` as they pass.
Result<std::string> HashFile(Env* env, const std::string& path, Progress* progress) {
  K3_ASSIGN_OR_RETURN(auto file, env->Open(path, OpenMode::kRead));
  K3_ASSIGN_OR_RETURN(uint64_t size, file->Size());
  std::string buf(kHashChunk, '\0');
  Sha256Stream sha;
  for (uint64_t off = 0; off < size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kHashChunk, size - off));
    K3_RETURN_IF_ERROR(file->ReadExact(off, n, buf.data()));
    sha.Update(buf.data(), n);
    off += n;
    progress->Add(n);
  }
  return sha.HexDigest();
}

// The structure of each shard on its own, so that every bad shard is reported.
void CheckShardStructure(Env* env, const std::string& dir, ShardReport* shard) {
  std::string scratch;
  auto header = st::ReadHeader(env, JoinPath(dir, shard->name), &scratch);
  if (!header.ok()) {
    shard->problems.push_back(header.status());
    return;
  }
  shard->tensors = header->tensors.size();
}

// Compares the report's shards (and every other file the manifest lists) with the manifest.
void CompareWithManifest(Env* env, const std::string& dir, const dl::DownloadManifest& m,
                         const std::string& source, ShardsReport* report) {
  for (ShardReport& s : report->shards) {
    const dl::DownloadFile* f = m.Find(s.name);
    if (f == nullptr) {
      s.problems.push_back(Status::Integrity(
          s.name + ": not listed in " + source +
          " (a file the download did not verify; remove it or re-run k3prep download)"));
      continue;
    }
    s.expected_sha256 = f->sha256;
    if (f->size != s.size) {
      s.problems.push_back(Status::Integrity(
          s.name + ": size " + std::to_string(s.size) + " bytes, the manifest says " +
          std::to_string(f->size) + " (re-run k3prep download to repair it)"));
    } else if (!s.sha256.empty() && s.sha256 != f->sha256) {
      s.problems.push_back(Status::Integrity(
          s.name + ": SHA-256 " + s.sha256 + " differs from the manifest's " + f->sha256 +
          " (the file is corrupt; re-run k3prep download to repair it)"));
    }
  }
  for (const dl::DownloadFile& f : m.files) {
    const bool is_shard = std::any_of(report->shards.begin(), report->shards.end(),
                                      [&](const ShardReport& s) { return s.name == f.path; });
    if (is_shard) continue;
    const std::string path = JoinPath(dir, f.path);
    if (!env->Exists(path)) {
      report->problems.push_back(Status::Integrity(
          f.path + ": listed in " + source + " but missing from " + dir +
          " (re-run k3prep download)"));
      continue;
    }
    auto size = env->FileSize(path);
    if (!size.ok()) {
      report->problems.push_back(size.status());
    } else if (*size != f.size) {
      report->problems.push_back(Status::Integrity(
          f.path + ": size " + std::to_string(*size) + " bytes, the manifest says " +
          std::to_string(f.size)));
    } else {
      Progress none("", 0, ProgressMode::kNone);
      auto sha = HashFile(env, path, &none);
      if (!sha.ok()) {
        report->problems.push_back(sha.status());
      } else if (*sha != f.sha256) {
        report->problems.push_back(Status::Integrity(
            f.path + ": SHA-256 " + *sha + " differs from the manifest's " + f.sha256));
      }
    }
  }
}

// The vision part: config.json's vision_config must read, and without an index file every
// tensor it implies must be in a shard (the index, when present, is checked against the shards).
Status CheckVisionTensors(Env* env, const std::string& config_path, const std::string& dir,
                          const st::CheckpointIndex* index) {
  K3_ASSIGN_OR_RETURN(const std::string text,
                      ReadFileToString(env, config_path, kMaxConfigBytes));
  K3_ASSIGN_OR_RETURN(const std::optional<VisionConfig> vision,
                      ParseVisionConfig(text, config_path));
  if (!vision || index == nullptr || env->Exists(JoinPath(dir, kIndexFileName))) {
    return Status::Ok();
  }
  uint64_t missing = 0;
  std::string first;
  const std::vector<VisionTensor> want = VisionTensors(*vision);
  for (const VisionTensor& t : want) {
    if (index->Find(t.name) != nullptr) continue;
    if (missing++ == 0) first = t.name;
  }
  if (missing == 0) return Status::Ok();
  return Status::Invalid(dir + ": " + std::to_string(missing) + " of " +
                         std::to_string(want.size()) + " vision tensors that config.json's "
                         "vision_config implies are in no shard (no " + kIndexFileName +
                         "); first: " + first + "; the checkpoint is incomplete (the vision "
                         "shards missing?): re-download or re-synthesize it");
}

// One problem summarising what is missing, a line per incomplete layer (the first kShownUnits).
Status MissingTensorsProblem(const std::string& dir,
                             const std::vector<prepared::MissingTensors>& missing) {
  constexpr size_t kShownUnits = 8;
  uint64_t total = 0;
  for (const prepared::MissingTensors& m : missing) total += m.missing;
  std::string msg = dir + ": " + std::to_string(total) + " tensor(s) that config.json implies " +
                    "are in no shard, in " + std::to_string(missing.size()) +
                    " layer(s)/unit(s) (no " + kIndexFileName +
                    ", so the tensors were checked against config.json):";
  for (size_t i = 0; i < missing.size() && i < kShownUnits; ++i) {
    const prepared::MissingTensors& m = missing[i];
    msg += "\n    " + (m.layer < 0 ? std::string("model-level") : "layer " + std::to_string(m.layer)) +
           ": " + std::to_string(m.missing) + " of " + std::to_string(m.expected) +
           " tensors missing; first: " + m.first;
  }
  if (missing.size() > kShownUnits) {
    msg += "\n    ... and " + std::to_string(missing.size() - kShownUnits) + " more";
  }
  msg += "\n  the checkpoint is incomplete (shards missing or renamed, or an interrupted synth "
         "or download): re-download or re-synthesize it";
  return Status::Invalid(std::move(msg));
}

}  // namespace

Status ShardsReport::Verdict() const {
  std::vector<Status> all = problems;
  for (const ShardReport& sh : shards) all.insert(all.end(), sh.problems.begin(), sh.problems.end());
  return WorstVerdict(all, model_dir);
}

Result<ShardsReport> VerifyShards(Env* env, const ShardsOptions& options) {
  const std::string& dir = options.model_dir;
  if (!env->IsDirectory(dir)) {
    return Status::Invalid(dir + ": not a directory (give the checkpoint directory)");
  }
  ShardsReport report;
  report.model_dir = dir;

  K3_ASSIGN_OR_RETURN(auto entries, env->ListDir(dir));
  for (const DirEntry& e : entries) {
    if (e.is_dir || !EndsWith(e.name, ".safetensors")) continue;
    ShardReport s;
    s.name = e.name;
    s.size = e.size;
    report.total_bytes += e.size;
    report.shards.push_back(std::move(s));
  }
  if (report.shards.empty()) {
    report.problems.push_back(Status::Invalid(dir + ": no *.safetensors shards found"));
    return report;
  }

  // 1. Each shard's structure, then the checkpoint as a whole. The whole-checkpoint pass reads
  // the headers again; they are a few MB against the terabytes hashed below.
  bool all_parsed = true;
  for (ShardReport& s : report.shards) {
    CheckShardStructure(env, dir, &s);
    report.total_tensors += s.tensors;
    all_parsed = all_parsed && s.problems.empty();
  }
  std::optional<st::CheckpointIndex> index;
  if (all_parsed) {
    auto opened = st::CheckpointIndex::Open(env, dir);
    if (opened.ok()) {
      index = std::move(opened).value();
    } else {
      report.problems.push_back(opened.status());
    }
  }

  // 2. config.json, and without an index file the tensors it implies: the index is what lists
  // every tensor, so without one a checkpoint missing whole shards (an interrupted synth or
  // download) would otherwise pass.
  const std::string config_path = JoinPath(dir, "config.json");
  if (!env->Exists(config_path)) {
    report.problems.push_back(
        Status::Invalid(config_path + ": missing (every checkpoint needs its config.json)"));
  } else {
    auto config = LoadModelConfig(env, config_path);
    if (!config.ok()) {
      report.problems.push_back(config.status());
    } else if (index && !env->Exists(JoinPath(dir, kIndexFileName))) {
      const std::vector<prepared::MissingTensors> missing =
          prepared::FindMissingTensors(*config, prepared::TensorsOf(*index));
      if (!missing.empty()) report.problems.push_back(MissingTensorsProblem(dir, missing));
    }
    if (Status v = CheckVisionTensors(env, config_path, dir, index ? &*index : nullptr);
        !v.ok()) {
      report.problems.push_back(v);
    }
  }

  // 3. The download manifest, when there is one.
  std::string manifest_path = options.manifest;
  if (manifest_path.empty() && env->Exists(JoinPath(dir, std::string(dl::kFileName)))) {
    manifest_path = JoinPath(dir, std::string(dl::kFileName));
  }
  report.manifest_path = manifest_path;
  std::optional<dl::DownloadManifest> manifest;
  if (!manifest_path.empty()) {
    auto m = dl::LoadDownloadManifest(env, manifest_path);
    if (m.ok()) {
      manifest = std::move(m).value();
    } else {
      report.problems.push_back(m.status());
    }
  }

  // 4. SHA-256 of every shard, files hashed in parallel (one file per thread: each stream is
  // sequential, which is what the disk wants).
  const int jobs = std::max(1, options.jobs > 0 ? options.jobs : CoreCount());
  Progress progress("sha256", report.total_bytes, options.progress);
  const auto t0 = std::chrono::steady_clock::now();
  // Each item writes only its own ShardReport.
  ParallelFor(report.shards.size(), jobs, [&](size_t i, size_t) {
    ShardReport& s = report.shards[i];
    auto sha = HashFile(env, JoinPath(dir, s.name), &progress);
    if (sha.ok()) {
      s.sha256 = std::move(sha).value();
    } else {
      s.problems.push_back(sha.status());
    }
  });
  progress.Finish();
  report.hash_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (manifest) CompareWithManifest(env, dir, *manifest, manifest_path, &report);
  return report;
}

std::string RenderShardsText(const ShardsReport& r) {
  std::string out;
  char line[256];
  for (const ShardReport& s : r.shards) {
    const char* verdict = s.problems.empty() ? (s.expected_sha256.empty() ? "ok" : "ok (matches manifest)")
                                             : "BAD";
    std::snprintf(line, sizeof(line), "%-40s %14llu bytes %6llu tensors  sha256 %s  %s\n",
                  s.name.c_str(), static_cast<unsigned long long>(s.size),
                  static_cast<unsigned long long>(s.tensors),
                  s.sha256.empty() ? "-" : s.sha256.c_str(), verdict);
    out += line;
    for (const Status& p : s.problems) out += "  problem: " + p.ToString() + "\n";
  }
  for (const Status& p : r.problems) out += "problem: " + p.ToString() + "\n";
  const double gb = static_cast<double>(r.total_bytes) / 1e9;
  std::snprintf(line, sizeof(line),
                "%zu shards, %llu tensors, %.3f GB hashed in %.1f s (%.0f MB/s)%s\n",
                r.shards.size(), static_cast<unsigned long long>(r.total_tensors), gb,
                r.hash_seconds, r.hash_seconds > 0 ? gb * 1e3 / r.hash_seconds : 0.0,
                r.manifest_path.empty() ? ", no download manifest: hashes printed, not compared"
                                        : "");
  out += line;
  const Status v = r.Verdict();
  out += v.ok() ? "verdict: OK\n" : "verdict: " + v.ToString() + "\n";
  return out;
}

std::string RenderShardsJson(const ShardsReport& r) {
  nlohmann::ordered_json j;
  j["model_dir"] = r.model_dir;
  j["manifest"] = r.manifest_path.empty() ? nlohmann::ordered_json(nullptr)
                                          : nlohmann::ordered_json(r.manifest_path);
  auto problem_json = [](const Status& s) {
    return nlohmann::ordered_json{{"code", s.exit_code()}, {"kind", CodeName(s.code())},
                                  {"message", s.message()}};
  };
  nlohmann::ordered_json shards = nlohmann::ordered_json::array();
  for (const ShardReport& s : r.shards) {
    nlohmann::ordered_json js;
    js["name"] = s.name;
    js["size"] = s.size;
    js["tensors"] = s.tensors;
    js["sha256"] = s.sha256.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(s.sha256);
    js["expected_sha256"] = s.expected_sha256.empty() ? nlohmann::ordered_json(nullptr)
                                                      : nlohmann::ordered_json(s.expected_sha256);
    js["problems"] = nlohmann::ordered_json::array();
    for (const Status& p : s.problems) js["problems"].push_back(problem_json(p));
    shards.push_back(std::move(js));
  }
  j["shards"] = std::move(shards);
  j["problems"] = nlohmann::ordered_json::array();
  for (const Status& p : r.problems) j["problems"].push_back(problem_json(p));
  j["total_bytes"] = r.total_bytes;
  j["total_tensors"] = r.total_tensors;
  j["hash_seconds"] = r.hash_seconds;
  const Status v = r.Verdict();
  j["ok"] = v.ok();
  j["exit_code"] = v.exit_code();
  return j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace k3::verify
