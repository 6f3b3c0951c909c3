// The expert cache trace writer (see k3run/stream/cache_trace.h; format in docs/CACHE-TRACE.md).
#include "k3run/stream/cache_trace.h"

#include <string>

#include <nlohmann/json.hpp>

namespace k3::run {
namespace {

Status HeaderRule(const std::string& dir, const std::string& field, int64_t value,
                  const std::string& rule) {
  return Status::Invalid("--dump-cache-trace " + dir + ": trace header " + field + " = " +
                         std::to_string(value) + " breaks the rule '" + rule +
                         "' (internal: the header must come from the prepared model's config "
                         "and the streaming plan)");
}

Status ValidateHeader(const std::string& dir, const CacheTraceHeader& h) {
  if (h.n_layers < 1) return HeaderRule(dir, "n_layers", h.n_layers, "n_layers >= 1");
  if (h.first_dense < 0 || h.first_dense > h.n_layers) {
    return HeaderRule(dir, "first_dense", h.first_dense, "0 <= first_dense <= n_layers");
  }
  if (h.n_experts < 1) return HeaderRule(dir, "n_experts", h.n_experts, "n_experts >= 1");
  if (h.topk < 1 || h.topk > h.n_experts) {
    return HeaderRule(dir, "topk", h.topk, "1 <= topk <= n_experts");
  }
  // The engine refuses fewer slots (a wave of top-k misses plus nothing evictable).
  if (h.expert_slots < h.topk + 1) {
    return HeaderRule(dir, "expert_slots", h.expert_slots, "expert_slots >= topk + 1");
  }
  return Status::Ok();
}

}  // namespace

CacheTraceHeader TraceHeaderFor(const ModelConfig& c, const StreamingPlan& plan,
                                std::string prepared_dir) {
  CacheTraceHeader h;
  h.n_layers = c.n_layers;
  h.first_dense = c.first_dense;
  h.n_experts = c.n_experts;
  h.topk = c.topk;
  h.expert_slots = plan.expert_slots;
  h.expert_slot_bytes = plan.expert_slot_bytes;
  h.policy = plan.policy;
  h.prepared_dir = std::move(prepared_dir);
  return h;
}

Result<std::unique_ptr<CacheTraceWriter>> CacheTraceWriter::Create(
    Env* env, const std::string& dir, const CacheTraceHeader& header) {
  if (dir.empty()) {
    return Status::Invalid("--dump-cache-trace: empty directory name; give the directory to "
                           "write " + std::string(kCacheTraceFile) + " into");
  }
  K3_RETURN_IF_ERROR(ValidateHeader(dir, header));
  Status s = env->MakeDirs(dir);
  if (!s.ok()) {
    return s.WithContext("--dump-cache-trace " + dir +
                         ": cannot create the trace directory (choose a writable directory)");
  }
  std::string path = JoinPath(dir, kCacheTraceFile);
  // Probe with the temporary name Finish will use: a read-only or full directory is reported
  // now, and nothing ever appears under the final name before the trace is complete.
  const std::string probe = TempPathFor(path);
  Result<std::unique_ptr<File>> f = env->Open(probe, OpenMode::kCreate);
  if (!f.ok()) {
    return f.status().WithContext("--dump-cache-trace " + dir +
                                  ": cannot create files in the trace directory (choose a "
                                  "writable directory)");
  }
  (void)(*f)->Close();
  (void)env->Remove(probe);
  return std::unique_ptr<CacheTraceWriter>(new CacheTraceWriter(env, std::move(path), header));
}

void CacheTraceWriter::Wave(int64_t step, int layer, std::span<const int32_t> experts) {
  waves_.push_back(WaveRec{step, layer, ids_.size(), experts.size()});
  ids_.insert(ids_.end(), experts.begin(), experts.end());
}

void CacheTraceWriter::SetEngineCounters(const CacheTraceCounters& counters) {
  counters_ = counters;
  have_counters_ = true;
}

std::string CacheTraceWriter::Serialize() const {
  nlohmann::ordered_json h;
  h["format"] = kCacheTraceFormat;
  h["version"] = kCacheTraceVersion;
  h["n_layers"] = header_.n_layers;
  h["first_moe_layer"] = header_.first_dense;
  h["n_experts"] = header_.n_experts;
  h["topk"] = header_.topk;
  h["expert_slots"] = header_.expert_slots;
  h["expert_slot_bytes"] = header_.expert_slot_bytes;
  h["policy"] = CachePolicyName(header_.policy);
  h["prepared_dir"] = header_.prepared_dir;
  h["waves"] = waves_.size();
  h["expert_ids"] = ids_.size();
  if (have_counters_) {
    h["engine"] = {{"requests", counters_.requests},
                   {"true_hits", counters_.true_hits},
                   {"reads", counters_.reads},
                   {"evictions", counters_.evictions}};
  } else {
    h["engine"] = nullptr;
  }
  // A path need not be UTF-8; the trace must still be valid JSON.
  std::string out = h.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  out += '\n';
  out.reserve(out.size() + waves_.size() * 40 + ids_.size() * 4);
  for (const WaveRec& w : waves_) {
    const nlohmann::ordered_json line = {
        {"step", w.step},
        {"layer", w.layer},
        {"experts", std::vector<int32_t>(ids_.begin() + static_cast<std::ptrdiff_t>(w.begin),
                                         ids_.begin() + static_cast<std::ptrdiff_t>(w.begin + w.count))}};
    out += line.dump();
    out += '\n';
  }
  return out;
}

Status CacheTraceWriter::Finish() {
  Status s = WriteFileAtomic(env_, path_, Serialize());
  if (!s.ok()) {
    return s.WithContext("--dump-cache-trace: writing " + path_ +
                         " failed (any older file under that name is unchanged; check free space "
                         "and permissions, then re-run)");
  }
  return Status::Ok();
}

}  // namespace k3::run
