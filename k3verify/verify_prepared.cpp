#include "k3verify/verify_prepared.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "common/hash.h"
#include "common/sysinfo.h"
#include "formats/prepared_manifest.h"
#include "formats/safetensors.h"
#include "k3verify/file_scan.h"
#include "k3verify/verdict.h"

namespace k3::verify {
namespace {

using prepared::ExpertsIndex;
using prepared::Manifest;

std::string ShapeString(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

// Step 2: every file k3.json lists, present with its recorded size. Returns the bad ones.
std::set<std::string> CheckFiles(Env* env, const std::string& dir, const Manifest& m,
                                 PreparedReport* r) {
  std::set<std::string> bad;
  for (const prepared::FileEntry& f : m.files) {
    ++r->files;
    const std::string path = JoinPath(dir, f.path);
    if (!env->Exists(path)) {
      r->problems.push_back(Status::Invalid(path + ": missing (k3.json lists it with " +
                                            std::to_string(f.size) +
                                            " bytes); re-run k3prep pack"));
      bad.insert(f.path);
      continue;
    }
    auto size = env->FileSize(path);
    if (!size.ok()) {
      r->problems.push_back(size.status());
      bad.insert(f.path);
    } else if (*size != f.size) {
      r->problems.push_back(Status::Invalid(
          path + ": file is " + std::to_string(*size) + " bytes, k3.json records " +
          std::to_string(f.size) + (*size < f.size ? " (truncated" : " (grown") +
          " after packing; re-run k3prep pack)"));
      bad.insert(f.path);
    }
  }
  return bad;
}

// Step 3a: experts.idx hashed before it is interpreted, then decoded and validated with the
// format's own rules (ReadExpertsIndex, the call OpenPrepared makes).
std::optional<ExpertsIndex> CheckExpertsIndex(Env* env, const std::string& dir, const Manifest& m,
                                              PreparedReport* r) {
  Result<ExpertsIndex> idx = prepared::ReadExpertsIndex(env, dir, m);
  if (!idx.ok()) {
    r->problems.push_back(idx.status().code() == Code::kIntegrity
                              ? Status::Integrity(idx.status().message() +
                                                  " (no expert was checked; re-run k3prep pack)")
                              : idx.status());
    return std::nullopt;
  }
  return std::move(idx).value();
}

// Step 3b: every expert file present with its recorded size. Returns resolved paths; `ok[i]`
// says whether file i may be scanned.
std::vector<std::string> CheckExpertFiles(Env* env, const PreparedOptions& o, const Manifest& m,
                                          std::vector<bool>* ok, PreparedReport* r) {
  std::vector<std::string> paths;
  const bool link = m.experts_mode == prepared::ExpertsMode::kLink;
  for (const prepared::FileEntry& f : m.expert_files) {
    ++r->files;
    std::string path = prepared::ResolveExpertPath(m, o.dir, f.path, o.model_dir);
    bool good = false;
    if (!env->Exists(path)) {
      r->problems.push_back(Status::Invalid(
          path + ": expert file is missing" +
          (link ? " (link mode reads experts from the source shard \"" + f.path +
                      "\"; if the checkpoint moved, pass --model-dir DIR)"
                : std::string(" (re-run k3prep pack)"))));
    } else if (auto size = env->FileSize(path); !size.ok()) {
      r->problems.push_back(size.status());
    } else if (*size != f.size) {
      r->problems.push_back(Status::Invalid(path + ": expert file is " + std::to_string(*size) +
                                            " bytes, k3.json records " + std::to_string(f.size) +
                                            (link ? " (the source shard changed since packing)"
                                                  : " (re-run k3prep pack)")));
    } else {
      good = true;
    }
    ok->push_back(good);
    paths.push_back(std::move(path));
  }
  return paths;
}

// The source of a packed tensor region in MODEL_DIR, or a problem.
std::optional<ScanSource> TensorSource(const st::CheckpointIndex& index, const std::string& name,
                                       DType dtype, const std::vector<uint64_t>& shape,
                                       uint64_t length, const std::string& what,
                                       std::vector<Status>* problems) {
  const st::CheckpointIndex::Location* loc = index.Find(name);
  if (loc == nullptr) {
    problems->push_back(Status::Invalid(index.dir() + ": has no tensor \"" + name + "\" (" + what +
                                        "); is this the checkpoint it was packed from?"));
    return std::nullopt;
  }
  const st::TensorInfo& t = *loc->tensor;
  if (t.dtype != dtype || t.shape != shape || t.nbytes() != length) {
    problems->push_back(Status::Integrity(
        what + ": source tensor \"" + name + "\" in " + loc->shard->path + " is " +
        DTypeName(t.dtype) + " " + ShapeString(t.shape) + ", the packed copy is " +
        DTypeName(dtype) + " " + ShapeString(shape)));
    return std::nullopt;
  }
  return ScanSource{0, length, loc->shard->path, loc->file_offset(), "tensor \"" + name + "\""};
}

class ScanPlan {
 public:
  ScanFile& For(const std::string& path) {
    auto it = by_path_.find(path);
    if (it != by_path_.end()) return files_[it->second];
    by_path_.emplace(path, files_.size());
    files_.push_back(ScanFile{path, {}});
    return files_.back();
  }
  std::vector<ScanFile>& files() { return files_; }
  uint64_t Bytes() const {
    uint64_t n = 0;
    for (const ScanFile& f : files_) {
      for (const ScanItem& it : f.items) n += it.length;
    }
    return n;
  }

 private:
  std::vector<ScanFile> files_;
  std::map<std::string, size_t> by_path_;
};

void PlanRegions(Env* env, const PreparedOptions& o, const Manifest& m, const std::set<std::string>& bad,
                 const st::CheckpointIndex* src, ScanPlan* plan, PreparedReport* r) {
  for (const prepared::Region& reg : m.regions) {
    // experts.idx was hashed in step 3; a bad-size file was reported in step 2.
    if (reg.name == prepared::kExpertsIndexFile || bad.count(reg.file)) continue;
    ScanItem it;
    it.label = "region \"" + reg.name + "\"";
    it.offset = reg.offset;
    it.length = reg.length;
    if (o.deep) {
      it.hash = ScanHash::kXxh3_128;
      it.want128 = reg.xxh3_128;
      it.want_from = "k3.json";
    }
    if (src != nullptr) {
      const std::string tok_prefix = std::string(prepared::kTokenizerDir) + "/";
      if (reg.file.rfind(tok_prefix, 0) == 0) {
        const std::string name = reg.file.substr(tok_prefix.size());
        const std::string path = JoinPath(o.against, name);
        if (env->Exists(path)) {
          it.sources.push_back(ScanSource{0, reg.length, path, 0, "file " + name});
        } else {
          r->problems.push_back(Status::Invalid(path + ": missing, but the prepared directory "
                                                "holds a copy (" + reg.file +
                                                "); is this the checkpoint it was packed from?"));
        }
      } else if (auto s = TensorSource(*src, reg.name, reg.dtype, reg.shape, reg.length, it.label,
                                       &r->problems)) {
        it.sources.push_back(std::move(*s));
      }
    }
    if (it.hash != ScanHash::kNone || !it.sources.empty()) {
      plan->For(JoinPath(o.dir, reg.file)).items.push_back(std::move(it));
    }
  }
}

void PlanExperts(const PreparedOptions& o, const Manifest& m, const ExpertsIndex& idx,
                 const std::vector<std::string>& paths, const std::vector<bool>& ok,
                 const st::CheckpointIndex* src, ScanPlan* plan, PreparedReport* r) {
  for (uint64_t k = 0; k < idx.records.size(); ++k) {
    const prepared::ExpertRecord& rec = idx.records[k];
    // Another rank's share holds it: nothing here to read (ReadExpertsIndex checked the map).
    if (rec.absent() || !ok[rec.file_id]) continue;
    const int layer = static_cast<int>(idx.first_moe_layer + k / idx.n_experts);
    const int expert = static_cast<int>(k % idx.n_experts);
    ScanItem it;
    it.label = "layer " + std::to_string(layer) + " expert " + std::to_string(expert);
    it.offset = rec.offset;
    it.length = rec.length;
    if (o.deep) {
      it.hash = ScanHash::kXxh3_64;
      it.want64 = rec.xxh3_64;
      it.want_from = "experts.idx";
    }
    if (src != nullptr) {
      for (int s = 0; s < prepared::kExpertSubCount; ++s) {
        const auto si = static_cast<size_t>(s);
        auto source = TensorSource(*src, prepared::ExpertTensorName(layer, expert, s), DType::kU8,
                                   prepared::ExpertSubShape(m.config, s), rec.sub_size[si], it.label,
                                   &r->problems);
        if (!source) continue;
        source->item_offset = rec.sub_offset[si];
        it.sources.push_back(std::move(*source));
      }
    }
    if (it.hash != ScanHash::kNone || !it.sources.empty()) {
      plan->For(paths[rec.file_id]).items.push_back(std::move(it));
    }
  }
}

// --against: the checkpoint's own structure and its shards' sizes against k3.json's record.
std::optional<st::CheckpointIndex> OpenSource(Env* env, const PreparedOptions& o,
                                              const Manifest& m, PreparedReport* r) {
  auto index = st::CheckpointIndex::Open(env, o.against);
  if (!index.ok()) {
    r->problems.push_back(index.status().WithContext("--against " + o.against));
    return std::nullopt;
  }
  for (const prepared::SourceShard& s : m.source.shards) {
    const std::string path = JoinPath(o.against, s.name);
    auto size = env->FileSize(path);
    if (size.ok() && *size != s.size) {
      r->problems.push_back(Status::Integrity(
          path + ": " + std::to_string(*size) + " bytes, but k3.json records that the pack read " +
          std::to_string(s.size) + " (the checkpoint changed since packing, or is another one)"));
    }
  }
  return std::move(index).value();
}

nlohmann::ordered_json ProblemJson(const Status& s) {
  return nlohmann::ordered_json{
      {"code", s.exit_code()}, {"kind", CodeName(s.code())}, {"message", s.message()}};
}

}  // namespace

Status PreparedReport::Verdict() const { return WorstVerdict(problems, dir); }

Result<PreparedReport> VerifyPrepared(Env* env, const PreparedOptions& o) {
  if (!env->IsDirectory(o.dir)) {
    return Status::Invalid(o.dir + ": not a directory (give the prepared directory k3prep pack "
                                   "wrote)");
  }
  if (!o.against.empty() && !env->IsDirectory(o.against)) {
    return Status::Invalid("--against " + o.against + ": not a directory (give the checkpoint "
                           "directory the prepared directory was packed from)");
  }
  PreparedReport r;
  r.dir = o.dir;
  r.deep = o.deep;
  r.against = o.against;

  // 1. Nothing below can be trusted without a manifest that matches its sum.
  auto text = prepared::ReadVerifiedManifestText(env, o.dir);
  if (!text.ok()) {
    r.problems.push_back(text.status());
    return r;
  }
  auto parsed = prepared::ParseManifest(*text, JoinPath(o.dir, std::string(prepared::kManifestFile)));
  if (!parsed.ok()) {
    r.problems.push_back(parsed.status());
    return r;
  }
  const Manifest& m = *parsed;
  r.experts_mode = prepared::ExpertsModeName(m.experts_mode);
  r.regions = m.regions.size();

  // 2–3.
  const std::set<std::string> bad = CheckFiles(env, o.dir, m, &r);
  std::optional<ExpertsIndex> idx;
  if (!bad.count(std::string(prepared::kExpertsIndexFile))) idx = CheckExpertsIndex(env, o.dir, m, &r);
  std::vector<bool> expert_ok;
  const std::vector<std::string> expert_paths = CheckExpertFiles(env, o, m, &expert_ok, &r);
  if (idx) {
    r.experts = idx->records.size();
    r.experts_present = static_cast<uint64_t>(
        std::count_if(idx->records.begin(), idx->records.end(),
                      [](const prepared::ExpertRecord& rec) { return !rec.absent(); }));
  }
  if (m.share) r.share = prepared::DescribeShare(*m.share);
  if (!o.deep && o.against.empty()) return r;

  // 4–5: one pass per file.
  std::optional<st::CheckpointIndex> src;
  if (!o.against.empty()) src = OpenSource(env, o, m, &r);
  const st::CheckpointIndex* src_ptr = src ? &*src : nullptr;
  if (!o.deep && src_ptr == nullptr) return r;
  ScanPlan plan;
  PlanRegions(env, o, m, bad, src_ptr, &plan, &r);
  if (idx) PlanExperts(o, m, *idx, expert_paths, expert_ok, src_ptr, &plan, &r);

  Progress progress(o.deep ? (src_ptr ? "verify+compare" : "verify") : "compare", plan.Bytes(),
                    o.progress);
  const int jobs = std::max(1, o.jobs > 0 ? o.jobs : CoreCount());
  const auto t0 = std::chrono::steady_clock::now();
  const ScanStats stats = ScanFiles(env, plan.files(), jobs, &progress, &r.problems);
  progress.Finish();
  r.scan_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.items_hashed = stats.items_hashed + (o.deep && idx ? 1 : 0);  // + experts.idx (step 3)
  r.items_compared = stats.items_compared;
  r.bytes_scanned = stats.bytes;
  return r;
}

std::string RenderPreparedText(const PreparedReport& r) {
  std::string out = "prepared " + r.dir +
                    (r.experts_mode.empty() ? "" : " (experts: " + r.experts_mode + " mode)") + "\n";
  char line[512];
  std::snprintf(line, sizeof(line), "structure: %llu files, %llu regions, %llu experts checked\n",
                static_cast<unsigned long long>(r.files),
                static_cast<unsigned long long>(r.regions),
                static_cast<unsigned long long>(r.experts));
  out += line;
  if (!r.share.empty()) {
    out += "share: " + r.share + ", experts " + std::to_string(r.experts_present) + " of " +
           std::to_string(r.experts) + " present\n";
  }
  if (r.deep || !r.against.empty()) {
    const double gb = static_cast<double>(r.bytes_scanned) / 1e9;
    std::snprintf(line, sizeof(line),
                  "%s%s: %llu hashed, %llu compared, %.3f GB in %.1f s (%.0f MB/s)\n",
                  r.deep ? "deep" : "", r.against.empty() ? "" : (" against " + r.against).c_str(),
                  static_cast<unsigned long long>(r.items_hashed),
                  static_cast<unsigned long long>(r.items_compared), gb, r.scan_seconds,
                  r.scan_seconds > 0 ? gb * 1e3 / r.scan_seconds : 0.0);
    out += line;
  } else {
    out += "bytes not re-hashed (add --deep to re-hash every region and expert)\n";
  }
  out += ProblemLines(r.problems, 50);
  const Status v = r.Verdict();
  out += v.ok() ? "verdict: OK\n" : "verdict: " + v.ToString() + "\n";
  return out;
}

std::string RenderPreparedJson(const PreparedReport& r) {
  nlohmann::ordered_json j;
  j["dir"] = r.dir;
  j["experts_mode"] =
      r.experts_mode.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(r.experts_mode);
  j["deep"] = r.deep;
  j["against"] = r.against.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(r.against);
  j["files"] = r.files;
  j["regions"] = r.regions;
  j["experts"] = r.experts;
  j["experts_present"] = r.experts_present;
  j["share"] = r.share.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(r.share);
  j["items_hashed"] = r.items_hashed;
  j["items_compared"] = r.items_compared;
  j["bytes_scanned"] = r.bytes_scanned;
  j["scan_seconds"] = r.scan_seconds;
  j["problems"] = nlohmann::ordered_json::array();
  for (const Status& p : r.problems) j["problems"].push_back(ProblemJson(p));
  const Status v = r.Verdict();
  j["ok"] = v.ok();
  j["exit_code"] = v.exit_code();
  return j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace k3::verify
