// k3prep pack: plan (what goes where), resume journal, the read → hash → write pipeline, and the
// finish (renames, experts.idx, manifest). See pack.h for the contract.
#include "k3prep/pack.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "common/aligned_buffer.h"
#include "common/direct_reader.h"
#include "common/hash.h"
#include "common/log.h"
#include "formats/config.h"
#include "formats/download_manifest.h"
#include "formats/experts_index.h"
#include "formats/prepared_layout.h"
#include "formats/safetensors.h"

namespace k3::prep {
namespace {

// ---------------------------------------------------------------------------------------------
// The plan: every output byte as (stream, offset), every source byte as a Piece.

// Source bytes that land at [dst, dst+len) of a stream; belongs to a region and/or an expert.
struct Piece {
  uint32_t src = 0;  // index into Plan::sources
  uint64_t src_off = 0;
  uint64_t len = 0;
  uint64_t dst = 0;
  int32_t region = -1;  // index into Plan::regions (trunk/resident tensors)
  int32_t expert = -1;  // record index (experts.idx)
};

// A journaled piece of work: a contiguous span of one stream (see pack.h "Resume").
struct Unit {
  size_t stream = 0;
  uint64_t begin = 0, end = 0;
  int layer = -1;                // for progress; -1 for resident tensors
  std::vector<int32_t> regions;  // in dst order
  std::vector<int32_t> experts;  // in dst order
  bool reused = false;
  Hash128 span;  // XXH3-128 of [begin, end) as written
};

// One output file (temp name while packing), or the virtual stream of link-mode experts
// (final_path empty: read and hashed, never written).
struct Stream {
  std::string final_path;  // absolute or relative to the cwd, as the Env sees it
  uint64_t size = 0;
  std::vector<Piece> pieces;  // sorted by dst
  std::vector<size_t> units;  // indices into Plan::units, sorted by begin, tiling [0, size)
  std::string label;          // progress text prefix
};

struct Plan {
  ModelConfig config;
  Layout layout;
  std::vector<std::string> sources;       // shard paths
  std::vector<uint64_t> source_sizes;     // shard file sizes
  std::vector<Stream> streams;
  std::vector<Unit> units;
  std::vector<Region> regions;  // trunk then resident (manifest order), hashes filled by packing
  std::vector<ExpertRecord> records;
  std::vector<bool> expert_hashed;
  std::vector<FileEntry> expert_files;  // experts.idx path table with sizes
  SourceInfo source;
  std::vector<std::string> tokenizer_files;  // names present in model_dir
  uint64_t expert_bytes = 0;
};

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

Result<std::string> AbsoluteDir(Env* env, const std::string& dir) {
  if (env->Exists(dir)) return env->CanonicalPath(dir);
  if (!dir.empty() && dir.front() == '/') return dir;
  K3_ASSIGN_OR_RETURN(std::string cwd, env->CanonicalPath("."));
  return JoinPath(cwd, dir);
}

// DESIGN.md §4: experts stored as U8 mean MXFP4 even when config.json (the flat fixture shape)
// has no quantization_config; the prepared format requires MXFP4 experts.
Status ResolveExpertsMxfp4(const st::CheckpointIndex& index, const std::string& config_path,
                           ModelConfig* c) {
  if (c->experts_mxfp4 || c->n_moe_layers() <= 0 || c->n_experts <= 0) {
    c->experts_mxfp4 = true;
    return c->n_moe_layers() > 0 ? ValidateMxfp4Dims(*c, config_path) : Status::Ok();
  }
  const std::string probe = ExpertTensorName(c->first_dense, 0, 0);
  const st::CheckpointIndex::Location* loc = index.Find(probe);
  if (loc == nullptr) {
    return Status::Invalid(index.dir() + ": expert tensor \"" + probe +
                           "\" is missing (the config says layer " +
                           std::to_string(c->first_dense) + " is a MoE layer)");
  }
  if (loc->tensor->dtype != DType::kU8) {
    return Status::Invalid(
        loc->shard->path + ": tensor \"" + probe + "\" is " + DTypeName(loc->tensor->dtype) +
        ": routed experts are not MXFP4, and prepared format version 1 stores only MXFP4 "
        "experts; this checkpoint cannot be packed");
  }
  c->experts_mxfp4 = true;
  c->mxfp4_group_size = kMxfp4GroupSize;
  return ValidateMxfp4Dims(*c, config_path + " (experts are U8, so MXFP4)");
}

// Trunk: one unit per layer run; resident: one unit per tensor (its padding included).
void PlanTensors(const st::CheckpointIndex& index, Plan* plan,
                 const std::map<std::string, uint32_t>& src_ids, const std::string& out) {
  const Layout& layout = plan->layout;
  for (const Region& r : layout.trunk) plan->regions.push_back(r);
  for (const Region& r : layout.resident) plan->regions.push_back(r);

  auto piece_for = [&](int32_t region_id) {
    const Region& r = plan->regions[static_cast<size_t>(region_id)];
    const st::CheckpointIndex::Location* loc = index.Find(r.name);
    Piece p;
    p.src = src_ids.at(loc->shard->path);
    p.src_off = loc->file_offset();
    p.len = r.length;
    p.dst = r.offset;
    p.region = region_id;
    return p;
  };

  Stream trunk;
  trunk.final_path = JoinPath(out, std::string(kTrunkFile));
  trunk.size = layout.trunk_bytes;
  trunk.label = "trunk";
  size_t next = 0;
  for (const TrunkRun& run : layout.runs) {
    Unit u;
    u.stream = plan->streams.size();
    u.begin = run.offset;
    u.end = run.offset + run.length;
    u.layer = run.layer;
    for (; next < layout.trunk.size() && layout.trunk[next].offset < u.end; ++next) {
      u.regions.push_back(static_cast<int32_t>(next));
      trunk.pieces.push_back(piece_for(static_cast<int32_t>(next)));
    }
    trunk.units.push_back(plan->units.size());
    plan->units.push_back(std::move(u));
  }
  plan->streams.push_back(std::move(trunk));

  Stream resident;
  resident.final_path = JoinPath(out, std::string(kResidentFile));
  resident.size = layout.resident_bytes;
  resident.label = "resident";
  const size_t base = layout.trunk.size();
  for (size_t i = 0; i < layout.resident.size(); ++i) {
    const int32_t id = static_cast<int32_t>(base + i);
    Unit u;
    u.stream = plan->streams.size();
    u.begin = layout.resident[i].offset;
    u.end = i + 1 < layout.resident.size() ? layout.resident[i + 1].offset : resident.size;
    u.regions.push_back(id);
    resident.pieces.push_back(piece_for(id));
    resident.units.push_back(plan->units.size());
    plan->units.push_back(std::move(u));
  }
  plan->streams.push_back(std::move(resident));
}

// Link mode: records point into the shards; each expert must be one canonical run.
Status PlanLinkExperts(const st::CheckpointIndex& index, Plan* plan,
                       const std::map<std::string, uint32_t>& src_ids) {
  const ModelConfig& c = plan->config;
  const auto sub_sizes = ExpertSubSizes(c);
  std::map<std::string, uint32_t> file_ids;
  Stream link;
  link.label = "experts (hash)";
  uint64_t dst = 0;
  for (int layer = c.first_dense; layer < c.n_layers; ++layer) {
    for (int e = 0; e < c.n_experts; ++e) {
      const st::CheckpointIndex::Location* first = index.Find(ExpertTensorName(layer, e, 0));
      for (int s = 1; s < kExpertSubCount; ++s) {
        const st::CheckpointIndex::Location* prev = index.Find(ExpertTensorName(layer, e, s - 1));
        const st::CheckpointIndex::Location* cur = index.Find(ExpertTensorName(layer, e, s));
        if (cur->shard != first->shard || cur->tensor->begin != prev->tensor->end) {
          return Status::Invalid(
              "link mode: layer " + std::to_string(layer) + " expert " + std::to_string(e) +
              ": its six tensors are not one contiguous run in canonical order (\"" +
              cur->tensor->name + "\" in " + cur->shard->name + " at data offset " +
              std::to_string(cur->tensor->begin) + " does not directly follow \"" +
              prev->tensor->name + "\" in " + prev->shard->name + ", which ends at " +
              std::to_string(prev->tensor->end) +
              "); k3run reads an expert with one read, so use --experts copy");
        }
      }
      auto [it, added] = file_ids.emplace(first->shard->name,
                                          static_cast<uint32_t>(plan->expert_files.size()));
      if (added) {
        plan->expert_files.push_back(FileEntry{first->shard->name, first->shard->header.file_size});
      }
      const uint64_t rec = ExpertRecordIndex(c, layer, e);
      plan->records[rec] = MakeExpertRecord(it->second, first->file_offset(), sub_sizes, 0);
      Piece p;
      p.src = src_ids.at(first->shard->path);
      p.src_off = first->file_offset();
      p.len = plan->expert_bytes;
      p.dst = dst;
      p.expert = static_cast<int32_t>(rec);
      link.pieces.push_back(p);
      Unit u;
      u.stream = plan->streams.size();
      u.begin = dst;
      u.end = dst + plan->expert_bytes;
      u.layer = layer;
      u.experts.push_back(static_cast<int32_t>(rec));
      link.units.push_back(plan->units.size());
      plan->units.push_back(std::move(u));
      dst += plan->expert_bytes;
    }
  }
  link.size = dst;
  plan->streams.push_back(std::move(link));
  return Status::Ok();
}

// Copy mode: PlanCopyExperts decides placement; each expert (with its padding) is a unit.
void PlanCopyExpertStreams(const st::CheckpointIndex& index, Plan* plan,
                           const std::map<std::string, uint32_t>& src_ids,
                           const std::vector<std::string>& stripe_dirs, const std::string& out) {
  const ModelConfig& c = plan->config;
  const ExpertPlan ep = PlanCopyExperts(c, stripe_dirs);
  const auto sub_sizes = ExpertSubSizes(c);
  const size_t first_stream = plan->streams.size();
  for (size_t f = 0; f < ep.files.size(); ++f) {
    plan->expert_files.push_back(FileEntry{ep.files[f], ep.file_sizes[f]});
    Stream s;
    s.final_path = stripe_dirs.empty() ? JoinPath(out, ep.files[f]) : ep.files[f];
    s.size = ep.file_sizes[f];
    plan->streams.push_back(std::move(s));
  }
  for (int layer = c.first_dense; layer < c.n_layers; ++layer) {
    for (int e = 0; e < c.n_experts; ++e) {
      const uint64_t rec = ExpertRecordIndex(c, layer, e);
      const ExpertSlot& slot = ep.slots[rec];
      Stream& s = plan->streams[first_stream + slot.file_id];
      s.label = "experts";
      plan->records[rec] = MakeExpertRecord(slot.file_id, slot.offset, sub_sizes, 0);
      uint64_t dst = slot.offset;
      for (int sub = 0; sub < kExpertSubCount; ++sub) {
        const st::CheckpointIndex::Location* loc = index.Find(ExpertTensorName(layer, e, sub));
        Piece p;
        p.src = src_ids.at(loc->shard->path);
        p.src_off = loc->file_offset();
        p.len = loc->tensor->nbytes();
        p.dst = dst;
        p.expert = static_cast<int32_t>(rec);
        s.pieces.push_back(p);
        dst += p.len;
      }
      Unit u;
      u.stream = first_stream + slot.file_id;
      u.begin = slot.offset;
      u.end = AlignUp(dst, kExpertAlign);
      u.layer = layer;
      u.experts.push_back(static_cast<int32_t>(rec));
      s.units.push_back(plan->units.size());
      plan->units.push_back(std::move(u));
    }
  }
  // Experts of one file were appended in ascending e, which is ascending offset: already sorted.
}

Status LoadSourceInfo(Env* env, const PackOptions& o, const st::CheckpointIndex& index,
                      SourceInfo* source) {
  source->model_dir_given = o.model_dir;
  K3_ASSIGN_OR_RETURN(source->model_dir_abs, env->CanonicalPath(o.model_dir));
  const std::string dl_path = JoinPath(o.model_dir, std::string(dl::kFileName));
  std::optional<dl::DownloadManifest> dm;
  if (env->Exists(dl_path)) {
    Result<dl::DownloadManifest> r = dl::LoadDownloadManifest(env, dl_path);
    if (!r.ok()) {
      return r.status().WithContext("reading the download manifest (fix or remove it; pack "
                                    "takes shard SHA-256 only from it)");
    }
    dm = std::move(r).value();
  }
  for (const auto& shard : index.shards()) {
    SourceShard s{shard->name, shard->header.file_size, ""};
    if (dm) {
      if (const dl::DownloadFile* f = dm->Find(shard->name)) {
        if (f->size != s.size) {
          return Status::Integrity(shard->path + ": shard is " + std::to_string(s.size) +
                                   " bytes, but " + dl_path + " records " +
                                   std::to_string(f->size) +
                                   " as downloaded and verified; run k3verify shards " +
                                   o.model_dir + " or download it again");
        }
        s.sha256 = f->sha256;
      }
    }
    source->shards.push_back(std::move(s));
  }
  return Status::Ok();
}

Result<Plan> MakePlan(Env* env, const PackOptions& o, const std::vector<std::string>& stripe_abs) {
  if (!env->IsDirectory(o.model_dir)) {
    return Status::Invalid(o.model_dir + ": MODEL_DIR is not a directory");
  }
  const std::string config_path = JoinPath(o.model_dir, "config.json");
  if (!env->Exists(config_path)) {
    return Status::Invalid(config_path +
                           ": missing; a checkpoint directory needs its config.json (nested "
                           "released shape or flat fixture shape) next to the shards");
  }
  Plan plan;
  K3_ASSIGN_OR_RETURN(plan.config, LoadModelConfig(env, config_path));
  K3_ASSIGN_OR_RETURN(st::CheckpointIndex index, st::CheckpointIndex::Open(env, o.model_dir));
  if (index.shards().empty()) {
    return Status::Invalid(o.model_dir + ": no *.safetensors shards found");
  }
  K3_RETURN_IF_ERROR(ResolveExpertsMxfp4(index, config_path, &plan.config));
  Result<Layout> layout = BuildLayout(plan.config, TensorsOf(index));
  if (!layout.ok()) return layout.status().WithContext(o.model_dir);
  plan.layout = std::move(layout).value();
  plan.expert_bytes = ExpertBytes(plan.config);
  plan.records.resize(static_cast<size_t>(plan.config.n_moe_layers()) *
                      static_cast<size_t>(plan.config.n_experts));
  plan.expert_hashed.assign(plan.records.size(), false);

  std::map<std::string, uint32_t> src_ids;
  for (const auto& shard : index.shards()) {
    src_ids.emplace(shard->path, static_cast<uint32_t>(plan.sources.size()));
    plan.sources.push_back(shard->path);
    plan.source_sizes.push_back(shard->header.file_size);
  }
  PlanTensors(index, &plan, src_ids, o.out);
  if (o.experts == ExpertsMode::kLink) {
    K3_RETURN_IF_ERROR(PlanLinkExperts(index, &plan, src_ids));
  } else {
    PlanCopyExpertStreams(index, &plan, src_ids, stripe_abs, o.out);
  }
  K3_RETURN_IF_ERROR(LoadSourceInfo(env, o, index, &plan.source));
  for (const char* name : {"tiktoken.model", "tokenizer_config.json"}) {
    if (env->Exists(JoinPath(o.model_dir, name))) plan.tokenizer_files.push_back(name);
  }
  return plan;
}

// ---------------------------------------------------------------------------------------------
// Journal (pack.h "Resume").

Hash128 PlanIdentity(const Plan& plan, ExpertsMode mode) {
  std::string id = "k3pack-journal-v1\n" + CanonicalConfigJson(plan.config) + "\nmode " +
                   ExpertsModeName(mode) + "\n";
  for (const Stream& s : plan.streams) {
    id += "stream " + s.final_path + " " + std::to_string(s.size) + " " +
          std::to_string(s.units.size()) + "\n";
  }
  for (const SourceShard& s : plan.source.shards) {
    id += "shard " + s.name + " " + std::to_string(s.size) + "\n";
  }
  return Xxh3_128(id.data(), id.size());
}

std::string JournalHeader(const Hash128& identity) {
  return "k3pack-journal 1 " + identity.Hex() + "\n";
}

std::string JournalLine(const Plan& plan, size_t unit_index) {
  const Unit& u = plan.units[unit_index];
  std::string body = "u " + std::to_string(unit_index) + " " + u.span.Hex() + " " +
                     std::to_string(u.regions.size() + u.experts.size());
  for (int32_t r : u.regions) body += " " + plan.regions[static_cast<size_t>(r)].xxh3_128.Hex();
  for (int32_t e : u.experts) body += " " + Hex64(plan.records[static_cast<size_t>(e)].xxh3_64);
  return body + " " + Hex64(Xxh3_64(body.data(), body.size())) + "\n";
}

struct JournalEntry {
  Hash128 span;
  std::vector<std::string> hashes;
};

std::vector<std::string> SplitSpaces(const std::string& line) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < line.size()) {
    size_t end = line.find(' ', start);
    if (end == std::string::npos) end = line.size();
    out.push_back(line.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// Entries of a journal whose identity matches; malformed or torn lines are skipped.
std::map<size_t, JournalEntry> ParseJournal(const std::string& text, const Hash128& identity,
                                            size_t n_units, bool* identity_ok) {
  std::map<size_t, JournalEntry> out;
  const std::string header = JournalHeader(identity);
  *identity_ok = text.compare(0, header.size(), header) == 0;
  if (!*identity_ok) return out;
  size_t pos = header.size();
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) break;  // torn last line
    const std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    const size_t last = line.find_last_of(' ');
    if (last == std::string::npos) continue;
    const std::string body = line.substr(0, last);
    if (Hex64(Xxh3_64(body.data(), body.size())) != line.substr(last + 1)) continue;
    const std::vector<std::string> f = SplitSpaces(body);
    if (f.size() < 4 || f[0] != "u") continue;
    JournalEntry e;
    size_t index = 0, count = 0;
    try {
      index = std::stoull(f[1]);
      count = std::stoull(f[3]);
    } catch (const std::exception&) {
      continue;
    }
    if (index >= n_units || f.size() != 4 + count || !Hash128::FromHex(f[2], &e.span)) continue;
    e.hashes.assign(f.begin() + 4, f.end());
    out[index] = std::move(e);
  }
  return out;
}

bool ParseHex64(const std::string& s, uint64_t* v) {
  if (s.size() != 16) return false;
  uint64_t x = 0;
  for (char ch : s) {
    int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
    if (d < 0) return false;
    x = x << 4 | static_cast<uint64_t>(d);
  }
  *v = x;
  return true;
}


// ---------------------------------------------------------------------------------------------
// Windows: what one buffer holds. Segments tile [begin, end): source bytes or zero padding, cut
// at piece and unit boundaries so the hashing side never has to split them again.

struct Seg {
  uint64_t dst = 0;
  uint64_t len = 0;
  int64_t piece = -1;  // index into the stream's pieces; -1: zero padding
};

struct Window {
  size_t stream = 0;
  uint64_t begin = 0, end = 0;
  std::vector<Seg> segs;
};

std::vector<Window> MakeWindows(const Plan& plan, uint64_t window_bytes) {
  std::vector<Window> out;
  for (size_t si = 0; si < plan.streams.size(); ++si) {
    const Stream& s = plan.streams[si];
    size_t pi = 0;
    size_t uk = 0;
    while (uk < s.units.size()) {
      if (plan.units[s.units[uk]].reused) {
        ++uk;
        continue;
      }
      // A maximal run of units to (re)do: [a, b).
      const uint64_t a = plan.units[s.units[uk]].begin;
      size_t last = uk;
      while (last + 1 < s.units.size() && !plan.units[s.units[last + 1]].reused) ++last;
      const uint64_t b = plan.units[s.units[last]].end;
      for (uint64_t ws = a; ws < b;) {
        const uint64_t we = std::min(b, ws + window_bytes);
        Window w;
        w.stream = si;
        w.begin = ws;
        w.end = we;
        uint64_t pos = ws;
        while (pi < s.pieces.size() && s.pieces[pi].dst + s.pieces[pi].len <= pos) ++pi;
        while (pos < we) {
          while (plan.units[s.units[uk]].end <= pos) ++uk;
          const uint64_t unit_end = plan.units[s.units[uk]].end;
          if (pi < s.pieces.size() && s.pieces[pi].dst <= pos) {
            const Piece& p = s.pieces[pi];
            const uint64_t end = std::min({p.dst + p.len, we, unit_end});
            w.segs.push_back(Seg{pos, end - pos, static_cast<int64_t>(pi)});
            pos = end;
            if (pos == p.dst + p.len) ++pi;
          } else {
            uint64_t end = std::min(we, unit_end);
            if (pi < s.pieces.size()) end = std::min(end, s.pieces[pi].dst);
            w.segs.push_back(Seg{pos, end - pos, -1});
            pos = end;
          }
        }
        out.push_back(std::move(w));
        ws = we;
      }
      uk = last + 1;
    }
  }
  return out;
}

// Windows [first, first + count), filled by one batched read.
struct Batch {
  size_t first = 0;
  size_t count = 0;
};

// ---------------------------------------------------------------------------------------------
// The pipeline: a reader fills window buffers (batched reads), the consumer hashes in dst order
// and writes. Everything that decides a hash runs on the consumer, in window order.

class Packer {
 public:
  Packer(Env* env, Plan* plan, const PackOptions& o, PackStats* stats)
      : env_(env), plan_(plan), o_(o), stats_(stats) {}

  Status OpenSources() {
    for (const std::string& path : plan_->sources) {
      K3_ASSIGN_OR_RETURN(std::unique_ptr<File> f, env_->Open(path, OpenMode::kReadDirect));
      sources_.push_back(std::move(f));
    }
    return Status::Ok();
  }

  // Opens every written stream's temporary file: kept (read-write) when resume reuses part of
  // it, else created empty.
  Status OpenOutputs() {
    outputs_.resize(plan_->streams.size());
    std::vector<bool> keep(plan_->streams.size(), false);
    for (const Unit& u : plan_->units) keep[u.stream] = keep[u.stream] || u.reused;
    for (size_t i = 0; i < plan_->streams.size(); ++i) {
      const Stream& s = plan_->streams[i];
      if (s.final_path.empty()) continue;
      K3_ASSIGN_OR_RETURN(outputs_[i],
                          env_->Open(TempPathFor(s.final_path),
                                     keep[i] ? OpenMode::kReadWrite : OpenMode::kCreate));
    }
    return Status::Ok();
  }

  Status StartJournal(const std::string& path, const std::string& initial) {
    journal_path_ = path;
    K3_RETURN_IF_ERROR(WriteFileAtomic(env_, path, initial));
    K3_ASSIGN_OR_RETURN(journal_, env_->Open(path, OpenMode::kReadWrite));
    journal_size_ = initial.size();
    return Status::Ok();
  }

  Status Run(const std::vector<Window>& windows, Progress* progress) {
    progress_ = progress;
    windows_ = &windows;
    StartSyncer();
    Status s = o_.jobs <= 1 ? RunSerial() : RunOverlapped();
    StopSyncer();
    if (!s.ok()) {
      // Keep what is finished for --resume; the original error is what the user needs.
      (void)FlushJournal(/*best_effort=*/true);
      return s;
    }
    return FlushJournal();
  }

  ~Packer() { StopSyncer(); }

  // Truncates each temporary output to its planned size, fsyncs and closes it.
  Status FinishOutputs() {
    if (!early_sync_status_.ok()) return early_sync_status_;
    for (size_t i = 0; i < outputs_.size(); ++i) {
      if (!outputs_[i]) continue;
      K3_RETURN_IF_ERROR(outputs_[i]->Truncate(plan_->streams[i].size));
      K3_RETURN_IF_ERROR(outputs_[i]->Sync());
      K3_RETURN_IF_ERROR(outputs_[i]->Close());
      outputs_[i].reset();
    }
    if (journal_) {
      Status s = journal_->Close();
      journal_.reset();
      return s;
    }
    return Status::Ok();
  }

  const std::string& backend() const { return backend_; }

 private:
  static constexpr size_t kBuffers = 3;
  static constexpr uint64_t kBlock = 4096;
  // Reading a gap this small costs less than splitting one large read into two.
  static constexpr uint64_t kBridgeBytes = 256 << 10;

  // Reads a window's source bytes. Pieces are small (a 26 KB expert, a norm vector) and sit
  // at arbitrary offsets, so reading each one with O_DIRECT would mean many small bounced
  // reads. Instead the source ranges are coalesced per shard (bridging gaps up to kBridgeBytes),
  // widened to whole 4 KiB blocks, read in one batch into a staging buffer (large aligned
  // reads, straight into memory) and copied into place.
  // A batch is consecutive windows (of one or several streams) laid out back to back in one
  // buffer: small expert files (one per layer) would otherwise each cost a read round trip.
  Status Fill(const Batch& batch, uint8_t* buf, BatchReader* reader) {
    struct Want {
      uint32_t src;
      uint64_t off, len;
      uint8_t* dst;
    };
    std::vector<Want> wants;
    uint8_t* base = buf;
    for (size_t k = batch.first; k < batch.first + batch.count; ++k) {
      const Window& w = (*windows_)[k];
      const Stream& s = plan_->streams[w.stream];
      for (const Seg& seg : w.segs) {
        uint8_t* dst = base + (seg.dst - w.begin);
        if (seg.piece < 0) {
          std::memset(dst, 0, seg.len);
          continue;
        }
        const Piece& p = s.pieces[static_cast<size_t>(seg.piece)];
        wants.push_back(Want{p.src, p.src_off + (seg.dst - p.dst), seg.len, dst});
      }
      base += w.end - w.begin;
    }
    std::sort(wants.begin(), wants.end(), [](const Want& a, const Want& b) {
      return a.src != b.src ? a.src < b.src : a.off < b.off;
    });
    struct Range {
      uint32_t src;
      uint64_t begin, end;  // block-aligned (end capped at the file size)
      uint64_t staged = 0;  // offset in staging_
    };
    std::vector<Range> ranges;
    std::vector<size_t> range_of(wants.size());
    for (size_t i = 0; i < wants.size(); ++i) {
      const Want& x = wants[i];
      const uint64_t b = x.off / kBlock * kBlock;
      const uint64_t e = std::min(AlignUp(x.off + x.len, kBlock), plan_->source_sizes[x.src]);
      if (!ranges.empty() && ranges.back().src == x.src && b <= ranges.back().end + kBridgeBytes) {
        ranges.back().end = std::max(ranges.back().end, e);
      } else {
        ranges.push_back(Range{x.src, b, e});
      }
      range_of[i] = ranges.size() - 1;
    }
    uint64_t total = 0;
    for (Range& r : ranges) {
      r.staged = total;
      total += AlignUp(r.end - r.begin, kBlock);
    }
    if (staging_.size() < total) {
      K3_ASSIGN_OR_RETURN(staging_, AlignedBuffer::Allocate(total + (1 << 20), kBlock));
    }
    std::vector<ReadRequest> reqs(ranges.size());
    for (size_t i = 0; i < ranges.size(); ++i) {
      reqs[i].file = sources_[ranges[i].src].get();
      reqs[i].offset = ranges[i].begin;
      reqs[i].length = ranges[i].end - ranges[i].begin;
      reqs[i].dst = staging_.data() + ranges[i].staged;
    }
    K3_RETURN_IF_ERROR(reader->ReadAll(reqs));
    for (size_t i = 0; i < wants.size(); ++i) {
      const Range& r = ranges[range_of[i]];
      std::memcpy(wants[i].dst, staging_.data() + r.staged + (wants[i].off - r.begin),
                  wants[i].len);
    }
    return Status::Ok();
  }

  Status Consume(const Window& w, const uint8_t* buf) {
    Stream& s = plan_->streams[w.stream];
    std::vector<size_t> finished;  // units that end in this window: journaled once written
    for (const Seg& seg : w.segs) {
      const uint8_t* data = buf + (seg.dst - w.begin);
      // The unit this segment belongs to (segments never cross unit ends).
      while (plan_->units[s.units[unit_cursor_[w.stream]]].end <= seg.dst) ++unit_cursor_[w.stream];
      const size_t unit_id = s.units[unit_cursor_[w.stream]];
      Unit& unit = plan_->units[unit_id];
      if (unit_id != cur_unit_) {
        cur_unit_ = unit_id;
        unit_hash_ = std::make_unique<Xxh3_128Stream>();
        if (unit.layer >= 0) {
          progress_->SetStatus(s.label + " layer " + std::to_string(unit.layer) + "/" +
                               std::to_string(plan_->config.n_layers - 1));
        } else {
          progress_->SetStatus(s.label);
        }
      }
      unit_hash_->Update(data, seg.len);
      if (seg.piece >= 0) {
        const Piece& p = s.pieces[static_cast<size_t>(seg.piece)];
        stats_->bytes_read += seg.len;
        if (p.region >= 0) {
          Region& r = plan_->regions[static_cast<size_t>(p.region)];
          if (p.region != cur_region_) {
            cur_region_ = p.region;
            region_hash_ = std::make_unique<Xxh3_128Stream>();
            region_left_ = r.length;
          }
          region_hash_->Update(data, seg.len);
          region_left_ -= seg.len;
          if (region_left_ == 0) r.xxh3_128 = region_hash_->Digest();
        }
        if (p.expert >= 0) {
          const size_t e = static_cast<size_t>(p.expert);
          if (p.expert != cur_expert_) {
            cur_expert_ = p.expert;
            expert_hash_ = std::make_unique<Xxh3_64Stream>();
            expert_left_ = plan_->expert_bytes;
          }
          expert_hash_->Update(data, seg.len);
          expert_left_ -= seg.len;
          if (expert_left_ == 0) {
            plan_->records[e].xxh3_64 = expert_hash_->Digest();
            plan_->expert_hashed[e] = true;
          }
        }
      }
      if (seg.dst + seg.len == unit.end) {
        unit.span = unit_hash_->Digest();
        if (!s.final_path.empty()) finished.push_back(unit_id);
      }
    }
    if (File* out = outputs_[w.stream].get()) {
      K3_RETURN_IF_ERROR(out->WriteExact(w.begin, buf, w.end - w.begin));
      stats_->bytes_written += w.end - w.begin;
      unflushed_ += w.end - w.begin;
      dirty_[w.stream] = true;
      pending_.insert(pending_.end(), finished.begin(), finished.end());
      if (w.end == s.size) QueueSync(w.stream);
    }
    progress_->Add(w.end - w.begin);
    if (unflushed_ >= o_.journal_flush_bytes) {
      K3_RETURN_IF_ERROR(FlushJournal());
    }
    return Status::Ok();
  }

  // Makes finished units durable: fsync the outputs they live in, then append their lines.
  // best_effort (after a failure): an output whose fsync fails loses its pending lines (those
  // units are redone by --resume) instead of failing the flush.
  Status FlushJournal(bool best_effort = false) {
    unflushed_ = 0;
    if (pending_.empty() || !journal_) return Status::Ok();
    std::map<size_t, bool> synced;
    for (auto& [stream, dirty] : dirty_) {
      if (dirty) {
        Status s;
        {
          std::lock_guard<std::mutex> lock(sync_mu_);
          s = outputs_[stream]->Sync();
        }
        {
          // A failed early fsync is reported once; a later fsync may then "succeed".
          std::lock_guard<std::mutex> lock(queue_mu_);
          if (s.ok() && early_sync_failed_.count(stream)) s = early_sync_status_;
        }
        if (!s.ok() && !best_effort) return s;
        synced[stream] = s.ok();
      }
      dirty = false;
    }
    std::string text;
    for (size_t u : pending_) {
      // Every pending unit's stream is dirty (written since the last flush), so it is in
      // `synced`; only units whose bytes reached the disk get a line.
      auto it = synced.find(plan_->units[u].stream);
      if (it != synced.end() && it->second) text += JournalLine(*plan_, u);
    }
    pending_.clear();
    K3_RETURN_IF_ERROR(journal_->WriteExact(journal_size_, text.data(), text.size()));
    journal_size_ += text.size();
    return journal_->Sync();
  }

  // Consumes every window of a filled batch, in order.
  Status ConsumeBatch(const Batch& batch, const uint8_t* buf) {
    for (size_t k = batch.first; k < batch.first + batch.count; ++k) {
      const Window& w = (*windows_)[k];
      K3_RETURN_IF_ERROR(Consume(w, buf));
      buf += w.end - w.begin;
    }
    return Status::Ok();
  }

  // Consecutive windows grouped up to window_bytes per buffer.
  std::vector<Batch> MakeBatches() const {
    std::vector<Batch> out;
    uint64_t bytes = 0;
    for (size_t k = 0; k < windows_->size(); ++k) {
      const uint64_t n = (*windows_)[k].end - (*windows_)[k].begin;
      if (out.empty() || bytes + n > o_.window_bytes) {
        out.push_back(Batch{k, 0});
        bytes = 0;
      }
      ++out.back().count;
      bytes += n;
    }
    return out;
  }

  Status RunSerial() {
    std::unique_ptr<BatchReader> reader =
        BatchReader::Create(BatchReader::kDefaultQueueDepth, o_.force_pread);
    backend_ = std::string(reader->backend());
    K3_ASSIGN_OR_RETURN(AlignedBuffer buf, AlignedBuffer::Allocate(o_.window_bytes, 4096));
    InitCursors();
    for (const Batch& b : MakeBatches()) {
      K3_RETURN_IF_ERROR(Fill(b, buf.data(), reader.get()));
      K3_RETURN_IF_ERROR(ConsumeBatch(b, buf.data()));
    }
    return Status::Ok();
  }

  // The reader thread runs up to kBuffers batches ahead of the consumer (this thread).
  Status RunOverlapped() {
    std::unique_ptr<BatchReader> reader =
        BatchReader::Create(BatchReader::kDefaultQueueDepth, o_.force_pread);
    backend_ = std::string(reader->backend());
    std::vector<AlignedBuffer> bufs;
    for (size_t i = 0; i < kBuffers; ++i) {
      K3_ASSIGN_OR_RETURN(AlignedBuffer b, AlignedBuffer::Allocate(o_.window_bytes, 4096));
      bufs.push_back(std::move(b));
    }
    InitCursors();
    const std::vector<Batch> batches = MakeBatches();
    std::mutex mu;
    std::condition_variable cv;
    size_t filled = 0, consumed = 0;
    bool stop = false;
    std::vector<Status> fill_status(kBuffers);
    std::thread thread([&] {
      for (size_t i = 0; i < batches.size(); ++i) {
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return stop || filled - consumed < kBuffers; });
          if (stop) return;
        }
        Status s = Fill(batches[i], bufs[i % kBuffers].data(), reader.get());
        const bool failed = !s.ok();
        {
          std::lock_guard<std::mutex> lock(mu);
          fill_status[i % kBuffers] = std::move(s);
          ++filled;
        }
        cv.notify_all();
        if (failed) return;
      }
    });
    Status result;
    for (size_t i = 0; i < batches.size(); ++i) {
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return filled > i; });
        result = fill_status[i % kBuffers];
      }
      if (result.ok()) result = ConsumeBatch(batches[i], bufs[i % kBuffers].data());
      {
        std::lock_guard<std::mutex> lock(mu);
        ++consumed;
        if (!result.ok()) stop = true;
      }
      cv.notify_all();
      if (!result.ok()) break;
    }
    thread.join();
    return result;
  }

  // Finished output files are fsynced by a background thread while the pipeline goes on, so
  // the final fsyncs find little left to write. All File::Sync calls hold sync_mu_ (Env: Sync
  // must not race with other calls on the same File; no other call touches a finished file).
  void StartSyncer() {
    syncer_ = std::thread([this] {
      for (;;) {
        size_t i = 0;
        {
          std::unique_lock<std::mutex> lock(queue_mu_);
          queue_cv_.wait(lock, [&] { return queue_done_ || !sync_queue_.empty(); });
          if (sync_queue_.empty()) return;
          i = sync_queue_.front();
          sync_queue_.pop_front();
        }
        Status s;
        {
          std::lock_guard<std::mutex> lock(sync_mu_);
          s = outputs_[i]->Sync();
        }
        if (!s.ok()) {
          std::lock_guard<std::mutex> lock(queue_mu_);
          early_sync_failed_.insert(i);
          if (early_sync_status_.ok()) early_sync_status_ = s;
        }
      }
    });
  }

  void QueueSync(size_t stream) {
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      sync_queue_.push_back(stream);
    }
    queue_cv_.notify_all();
  }

  // Waits for queued fsyncs (their failures surface in FinishOutputs).
  void StopSyncer() {
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      queue_done_ = true;
    }
    queue_cv_.notify_all();
    if (syncer_.joinable()) syncer_.join();
  }

  void InitCursors() {
    unit_cursor_.assign(plan_->streams.size(), 0);
  }

  Env* env_;
  Plan* plan_;
  const PackOptions& o_;
  PackStats* stats_;
  Progress* progress_ = nullptr;
  std::string backend_;
  const std::vector<Window>* windows_ = nullptr;
  std::vector<std::unique_ptr<File>> sources_;
  AlignedBuffer staging_;  // used by Fill only (one reader thread)
  std::vector<std::unique_ptr<File>> outputs_;
  std::unique_ptr<File> journal_;
  std::string journal_path_;
  uint64_t journal_size_ = 0;
  std::vector<size_t> pending_;
  std::map<size_t, bool> dirty_;
  uint64_t unflushed_ = 0;
  std::vector<size_t> unit_cursor_;
  size_t cur_unit_ = SIZE_MAX;
  int32_t cur_region_ = -1, cur_expert_ = -1;
  uint64_t region_left_ = 0, expert_left_ = 0;
  std::unique_ptr<Xxh3_128Stream> unit_hash_, region_hash_;
  std::unique_ptr<Xxh3_64Stream> expert_hash_;
  std::mutex sync_mu_;
  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<size_t> sync_queue_;
  bool queue_done_ = false;
  std::set<size_t> early_sync_failed_;
  Status early_sync_status_;
  std::thread syncer_;
};

// ---------------------------------------------------------------------------------------------
// Resume: re-verify journaled units against their temporary files.

Result<Hash128> HashSpan(Env* env, const std::string& path, uint64_t begin, uint64_t end,
                         std::vector<uint8_t>* buf) {
  K3_ASSIGN_OR_RETURN(std::unique_ptr<File> f, env->Open(path, OpenMode::kRead));
  Xxh3_128Stream h;
  for (uint64_t pos = begin; pos < end;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(end - pos, buf->size()));
    K3_RETURN_IF_ERROR(f->ReadExact(pos, n, buf->data()));
    h.Update(buf->data(), n);
    pos += n;
  }
  return h.Digest();
}

// Marks matching units reused and returns the journal text to continue from.
std::string ReverifyJournal(Env* env, const std::string& journal_path, const Hash128& identity,
                            Plan* plan, PackStats* stats, uint64_t window_bytes) {
  const std::string header = JournalHeader(identity);
  if (!env->Exists(journal_path)) return header;
  Result<std::string> text = ReadFileToString(env, journal_path);
  if (!text.ok()) {
    LogWarn("resume: cannot read " + journal_path + " (" + text.status().message() +
            "); redoing everything");
    return header;
  }
  bool identity_ok = false;
  std::map<size_t, JournalEntry> entries =
      ParseJournal(*text, identity, plan->units.size(), &identity_ok);
  if (!identity_ok) {
    LogWarn("resume: " + journal_path +
            " belongs to a different checkpoint, mode or output plan; redoing everything");
    return header;
  }
  std::string out = header;
  std::vector<uint8_t> buf(static_cast<size_t>(std::min<uint64_t>(window_bytes, 8 << 20)));
  for (auto& [index, e] : entries) {
    Unit& u = plan->units[index];
    const Stream& s = plan->streams[u.stream];
    if (s.final_path.empty() || e.hashes.size() != u.regions.size() + u.experts.size()) continue;
    std::vector<Hash128> rh(u.regions.size());
    std::vector<uint64_t> eh(u.experts.size());
    bool parsed = true;
    for (size_t i = 0; i < rh.size(); ++i) parsed = parsed && Hash128::FromHex(e.hashes[i], &rh[i]);
    for (size_t i = 0; i < eh.size(); ++i) {
      parsed = parsed && ParseHex64(e.hashes[rh.size() + i], &eh[i]);
    }
    if (!parsed) continue;
    const std::string tmp = TempPathFor(s.final_path);
    if (!env->Exists(tmp)) continue;
    Result<Hash128> got = HashSpan(env, tmp, u.begin, u.end, &buf);
    stats->bytes_reverified += u.end - u.begin;
    if (!got.ok() || *got != e.span) continue;  // short, unreadable or changed: redo it
    u.reused = true;
    u.span = e.span;
    for (size_t i = 0; i < rh.size(); ++i) {
      plan->regions[static_cast<size_t>(u.regions[i])].xxh3_128 = rh[i];
    }
    for (size_t i = 0; i < eh.size(); ++i) {
      const size_t rec = static_cast<size_t>(u.experts[i]);
      plan->records[rec].xxh3_64 = eh[i];
      plan->expert_hashed[rec] = true;
    }
    ++stats->units_reused;
    stats->regions_reused += u.regions.size();
    stats->experts_reused += u.experts.size();
    out += JournalLine(*plan, index);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Output directory state, free space, and the finish.

struct OutputFile {
  std::string final_path;
  uint64_t size = 0;
};

// Every file a pack would leave under a final name, with its expected size (k3.json and k3.sum
// have estimated sizes: they are checked for existence only).
std::vector<OutputFile> FinalOutputs(const Plan& plan, const std::string& out,
                                     const std::vector<uint64_t>& tokenizer_sizes) {
  std::vector<OutputFile> files;
  for (const Stream& s : plan.streams) {
    if (!s.final_path.empty()) files.push_back(OutputFile{s.final_path, s.size});
  }
  for (size_t i = 0; i < plan.tokenizer_files.size(); ++i) {
    files.push_back(OutputFile{
        JoinPath(JoinPath(out, std::string(kTokenizerDir)), plan.tokenizer_files[i]),
        tokenizer_sizes[i]});
  }
  uint64_t table = 0;
  for (const FileEntry& f : plan.expert_files) table += 4 + f.path.size();
  const uint64_t idx = kExpertsIndexHeaderSize + AlignUp(table, kPathTableAlign) +
                       uint64_t{kExpertRecordSize} * plan.records.size();
  files.push_back(OutputFile{JoinPath(out, std::string(kExpertsIndexFile)), idx});
  // The manifest: ~300 bytes per region plus the config and file lists.
  files.push_back(OutputFile{JoinPath(out, std::string(kManifestFile)),
                             (uint64_t{64} << 10) + 512 * plan.regions.size()});
  return files;
}

Status CheckOutputState(Env* env, const PackOptions& o, const std::vector<OutputFile>& files) {
  if (env->Exists(o.out) && !env->IsDirectory(o.out)) {
    return Status::Invalid(o.out + ": --out exists and is not a directory");
  }
  const std::string sum = JoinPath(o.out, std::string(kSumFile));
  if (env->Exists(sum)) {
    return Status::Invalid(o.out + ": already holds a complete prepared directory (" + sum +
                           " exists); check it with k3verify prepared, or delete it / choose "
                           "another --out to pack again");
  }
  if (o.resume) return Status::Ok();
  std::vector<std::string> candidates = {JoinPath(o.out, std::string(kPackJournalFile))};
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
  return Status::Ok();
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

// A crash during the rename phase can leave finished files under final names without k3.sum:
// --resume takes them back as temporaries (and drops a k3.json without its k3.sum).
Status AdoptFinalNames(Env* env, const std::vector<OutputFile>& files) {
  for (const OutputFile& f : files) {
    const std::string tmp = TempPathFor(f.final_path);
    if (!env->Exists(f.final_path)) continue;
    const std::string manifest = "/" + std::string(kManifestFile);
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

// Writes a small whole file under its temporary name (synced) and returns its region hash.
Status WriteSmallTemp(Env* env, const std::string& final_path, const std::string& data,
                      PackStats* stats) {
  K3_ASSIGN_OR_RETURN(std::unique_ptr<File> f, env->Open(TempPathFor(final_path), OpenMode::kCreate));
  K3_RETURN_IF_ERROR(f->WriteExact(0, data.data(), data.size()));
  K3_RETURN_IF_ERROR(f->Sync());
  K3_RETURN_IF_ERROR(f->Close());
  stats->bytes_written += data.size();
  return Status::Ok();
}

Region WholeFileRegion(const std::string& name, const std::string& data) {
  return Region{name, name, 0, data.size(), DType::kU8, {data.size()},
                Xxh3_128(data.data(), data.size())};
}

// Renames every temporary to its final name; on failure renames the finished ones back, so a
// failed finish leaves no final name behind (and --resume still finds the temporaries).
Status RenameAll(Env* env, const std::vector<std::string>& finals) {
  for (size_t i = 0; i < finals.size(); ++i) {
    Status s = env->Rename(TempPathFor(finals[i]), finals[i]);
    if (!s.ok()) {
      for (size_t k = i; k-- > 0;) (void)env->Rename(finals[k], TempPathFor(finals[k]));
      return s.WithContext("finishing the pack (nothing was left under a final name; re-run "
                           "with --resume)");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<PackResult> RunPack(Env* env, const PackOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  PackOptions o = opts;
  if (o.model_dir.empty()) return Status::Invalid("MODEL_DIR: required");
  if (o.out.empty()) return Status::Invalid("--out: required");
  if (o.jobs < 1) return Status::Invalid("--jobs " + std::to_string(o.jobs) + ": must be >= 1");
  if (!o.stripe_dirs.empty() && o.experts != ExpertsMode::kCopy) {
    return Status::Invalid("--stripe: spreads copied experts over disks, so it needs "
                           "--experts copy");
  }
  o.window_bytes = AlignUp(std::max<uint64_t>(o.window_bytes, kRunAlign), kRunAlign);
  std::vector<std::string> stripe_abs;
  for (const std::string& d : o.stripe_dirs) {
    if (d.empty()) return Status::Invalid("--stripe: empty directory name");
    K3_ASSIGN_OR_RETURN(std::string abs, AbsoluteDir(env, d));
    if (std::find(stripe_abs.begin(), stripe_abs.end(), abs) != stripe_abs.end()) {
      return Status::Invalid("--stripe: directory " + abs + " is listed twice");
    }
    stripe_abs.push_back(std::move(abs));
  }

  K3_ASSIGN_OR_RETURN(Plan plan, MakePlan(env, o, stripe_abs));
  std::vector<uint64_t> tokenizer_sizes;
  for (const std::string& name : plan.tokenizer_files) {
    K3_ASSIGN_OR_RETURN(uint64_t size, env->FileSize(JoinPath(o.model_dir, name)));
    tokenizer_sizes.push_back(size);
  }
  const std::vector<OutputFile> files = FinalOutputs(plan, o.out, tokenizer_sizes);
  K3_RETURN_IF_ERROR(CheckOutputState(env, o, files));
  K3_RETURN_IF_ERROR(CheckFreeSpace(env, o, files, stripe_abs, plan.units.size()));

  // From here on the pack writes (temporary names only until the finish).
  K3_RETURN_IF_ERROR(env->MakeDirs(o.out));
  if (o.experts == ExpertsMode::kCopy && stripe_abs.empty()) {
    K3_RETURN_IF_ERROR(env->MakeDirs(JoinPath(o.out, std::string(kExpertsDir))));
  }
  if (!plan.tokenizer_files.empty()) {
    K3_RETURN_IF_ERROR(env->MakeDirs(JoinPath(o.out, std::string(kTokenizerDir))));
  }
  for (const std::string& d : stripe_abs) K3_RETURN_IF_ERROR(env->MakeDirs(d));

  PackResult result;
  PackStats& stats = result.stats;
  const Hash128 identity = PlanIdentity(plan, o.experts);
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

  // Small files: tokenizer copies and experts.idx (all under temporary names).
  Manifest& m = result.manifest;
  std::vector<std::string> finals;
  for (const Stream& s : plan.streams) {
    if (!s.final_path.empty()) finals.push_back(s.final_path);
  }
  std::vector<Region> small_regions;
  std::vector<FileEntry> small_files;
  {
    ExpertsIndex idx;
    idx.n_layers = static_cast<uint32_t>(plan.config.n_layers);
    idx.first_moe_layer = static_cast<uint32_t>(plan.config.first_dense);
    idx.n_experts = static_cast<uint32_t>(plan.config.n_experts);
    for (const FileEntry& f : plan.expert_files) idx.files.push_back(f.path);
    idx.records = plan.records;
    const std::string bytes = EncodeExpertsIndex(idx);
    const std::string path = JoinPath(o.out, std::string(kExpertsIndexFile));
    K3_RETURN_IF_ERROR(WriteSmallTemp(env, path, bytes, &stats));
    finals.push_back(path);
    small_regions.push_back(WholeFileRegion(std::string(kExpertsIndexFile), bytes));
    small_files.push_back(FileEntry{std::string(kExpertsIndexFile), bytes.size()});
  }
  for (const std::string& name : plan.tokenizer_files) {
    K3_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(env, JoinPath(o.model_dir, name)));
    const std::string rel = std::string(kTokenizerDir) + "/" + name;
    const std::string path = JoinPath(o.out, rel);
    K3_RETURN_IF_ERROR(WriteSmallTemp(env, path, bytes, &stats));
    finals.push_back(path);
    small_regions.push_back(WholeFileRegion(rel, bytes));
    small_files.push_back(FileEntry{rel, bytes.size()});
  }

  m.config = plan.config;
  m.source = plan.source;
  m.experts_mode = o.experts;
  m.files = {FileEntry{std::string(kTrunkFile), plan.layout.trunk_bytes},
             FileEntry{std::string(kResidentFile), plan.layout.resident_bytes}};
  m.files.insert(m.files.end(), small_files.begin(), small_files.end());
  m.expert_files = plan.expert_files;
  m.runs = plan.layout.runs;
  m.regions = plan.regions;
  m.regions.insert(m.regions.end(), small_regions.begin(), small_regions.end());
  for (size_t e = 0; e < plan.expert_hashed.size(); ++e) {
    if (!plan.expert_hashed[e]) {
      return Status::Io("internal: expert record " + std::to_string(e) +
                        " was never hashed (please report)");
    }
  }
  K3_RETURN_IF_ERROR(ValidateManifest(m, "k3.json being written"));

  K3_RETURN_IF_ERROR(RenameAll(env, finals));
  Status s = WriteManifestAndSum(env, o.out, m);
  if (!s.ok()) {
    const std::string json_path = JoinPath(o.out, std::string(kManifestFile));
    if (env->Exists(json_path) && !env->Exists(JoinPath(o.out, std::string(kSumFile)))) {
      (void)env->Remove(json_path);
    }
    for (size_t k = finals.size(); k-- > 0;) (void)env->Rename(finals[k], TempPathFor(finals[k]));
    return s.WithContext("writing k3.json/k3.sum (nothing was left under a final name; re-run "
                         "with --resume)");
  }
  K3_RETURN_IF_ERROR(env->SyncDir(o.out));
  if (o.experts == ExpertsMode::kCopy && stripe_abs.empty()) {
    K3_RETURN_IF_ERROR(env->SyncDir(JoinPath(o.out, std::string(kExpertsDir))));
  }
  if (!plan.tokenizer_files.empty()) {
    K3_RETURN_IF_ERROR(env->SyncDir(JoinPath(o.out, std::string(kTokenizerDir))));
  }
  for (const std::string& d : stripe_abs) K3_RETURN_IF_ERROR(env->SyncDir(d));
  K3_RETURN_IF_ERROR(env->Remove(journal_path));
  stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace k3::prep
