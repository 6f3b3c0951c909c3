// StreamingWeights: pinned layers + ring, expert arena, chunked lm_head (see streaming_weights.h).
#include "k3run/streaming_weights.h"

#include <algorithm>
#include <string>
#include <utility>

#include "formats/prepared_layout.h"

namespace k3::run {

struct StreamingWeights::Held {
  AlignedBuffer run;
  LayerView view;
};

struct StreamingWeights::RingSlot {
  int layer = -1;  // the layer bound in `view`, -1 when empty
  bool in_use = false;
  uint64_t loaded_at = 0;
  AlignedBuffer run;
  LayerView view;
};

StreamingWeights::StreamingWeights(Env* env, const prep::PreparedDir* prepared,
                                   const StreamingPlan& plan, const StreamingOptions& options)
    : env_(env), prepared_(prepared), plan_(plan), options_(options),
      dims_(DimsFromConfig(prepared->manifest.config)), cache_(plan.expert_slots, plan.policy) {}

StreamingWeights::~StreamingWeights() = default;

Result<std::unique_ptr<StreamingWeights>> StreamingWeights::Open(
    Env* env, const prep::PreparedDir* prepared, const StreamingPlan& plan,
    const StreamingOptions& options) {
  std::unique_ptr<StreamingWeights> w(new StreamingWeights(env, prepared, plan, options));
  K3_RETURN_IF_ERROR(w->Init());
  return w;
}

Status StreamingWeights::Init() {
  K3_RETURN_IF_ERROR(ops::ValidateDims(dims_));
  const ModelConfig& c = prepared_->manifest.config;
  if (!prepared_->experts.records.empty() && plan_.expert_slots < c.topk + 1) {
    return Status::Invalid("streaming plan: " + std::to_string(plan_.expert_slots) +
                           " expert slots; at least top-k + 1 = " + std::to_string(c.topk + 1) +
                           " are needed (raise --cache-gb)");
  }
  reader_ = BatchReader::Create(BatchReader::kDefaultQueueDepth, options_.force_pread);
  const std::string trunk_path = JoinPath(prepared_->dir, std::string(prep::kTrunkFile));
  K3_ASSIGN_OR_RETURN(trunk_, env_->Open(trunk_path, OpenMode::kReadDirect));
  K3_ASSIGN_OR_RETURN(resident_,
                      env_->Open(JoinPath(prepared_->dir, std::string(prep::kResidentFile)),
                                 OpenMode::kRead));
  expert_files_.resize(prepared_->expert_paths.size());
  pinned_.resize(static_cast<size_t>(c.n_layers));
  // Pinned layers are read at start-up, never on first touch.
  for (int layer : plan_.pinned) {
    K3_ASSIGN_OR_RETURN(const prep::TrunkRun* run, FindTrunkRun(*prepared_, layer));
    auto h = std::make_unique<Held>();
    K3_ASSIGN_OR_RETURN(h->run, AlignedBuffer::Allocate(run->length, prep::kRunAlign));
    K3_RETURN_IF_ERROR(ReadRun(*run, h->run.data()));
    K3_RETURN_IF_ERROR(BindLayer(*prepared_, dims_, layer, *run, h->run.data(), &h->view));
    pinned_[static_cast<size_t>(layer)] = std::move(h);
  }
  for (int i = 0; i < plan_.ring_slots; ++i) {
    auto s = std::make_unique<RingSlot>();
    K3_ASSIGN_OR_RETURN(s->run, AlignedBuffer::Allocate(plan_.ring_slot_bytes, prep::kRunAlign));
    ring_.push_back(std::move(s));
  }
  if (plan_.expert_slots > 0) {
    K3_ASSIGN_OR_RETURN(arena_, AlignedBuffer::Allocate(uint64_t(plan_.expert_slots) *
                                                            plan_.expert_slot_bytes,
                                                        4096));
  }
  slot_views_.resize(static_cast<size_t>(plan_.expert_slots));
  K3_ASSIGN_OR_RETURN(lm_region_, LmHeadRegion(*prepared_, dims_));
  K3_ASSIGN_OR_RETURN(kernels::WeightType t, LmHeadType(*lm_region_));
  const int64_t rows = plan_.lm_head_held ? c.vocab : plan_.lm_head_chunk_rows;
  const uint64_t bytes = plan_.lm_head_held ? lm_region_->length
                                            : uint64_t(rows) * (lm_region_->length / uint64_t(c.vocab));
  K3_ASSIGN_OR_RETURN(lm_head_, AlignedBuffer::Allocate(bytes, prep::kResidentAlign));
  lm_head_matrix_ = kernels::Matrix{t, rows, dims_.hidden, lm_head_.data(), nullptr};
  if (plan_.lm_head_held) {
    Status s = resident_->ReadExact(lm_region_->offset, lm_region_->length, lm_head_.data());
    if (!s.ok()) {
      return s.WithContext(prepared_->dir + "/" + std::string(prep::kResidentFile) + ": " +
                           std::string(prep::kLmHeadName) + " at byte offset " +
                           std::to_string(lm_region_->offset));
    }
    counters_.lm_head += lm_region_->length;
    K3_RETURN_IF_ERROR(kernels::ValidateMatrix(lm_head_matrix_, prep::kLmHeadName));
  }
  return Status::Ok();
}

Status StreamingWeights::ReadRun(const prep::TrunkRun& run, uint8_t* dst) {
  ReadRequest req;
  req.file = trunk_.get();
  req.offset = run.offset;
  req.length = run.length;
  req.dst = dst;
  Status s = reader_->ReadAll(std::span<ReadRequest>(&req, 1));
  if (!s.ok()) {
    return Status::Io(prepared_->dir + "/" + std::string(prep::kTrunkFile) + ": reading layer " +
                      std::to_string(run.layer) + "'s trunk run at byte offset " +
                      std::to_string(run.offset) + " (+" + std::to_string(run.length) +
                      " bytes) failed: " + s.ToString() +
                      "; check the disk (k3verify prepared) or re-run k3prep pack");
  }
  counters_.trunk += run.length;
  return Status::Ok();
}

Result<const ops::LayerWeights*> StreamingWeights::Layer(int layer) {
  const ModelConfig& c = prepared_->manifest.config;
  if (layer < 0 || layer >= c.n_layers) {
    return Status::Invalid("layer " + std::to_string(layer) + " out of range");
  }
  if (const auto& h = pinned_[static_cast<size_t>(layer)]) return &h->view.w;
  RingSlot* pick = nullptr;
  for (auto& s : ring_) {
    if (s->layer == layer) {
      s->in_use = true;
      return &s->view.w;
    }
    if (!s->in_use && (pick == nullptr || s->loaded_at < pick->loaded_at)) pick = s.get();
  }
  if (pick == nullptr) {
    return Status::Invalid("layer " + std::to_string(layer) +
                           ": every trunk ring slot is in use (internal: a layer was not released)");
  }
  K3_ASSIGN_OR_RETURN(const prep::TrunkRun* run, FindTrunkRun(*prepared_, layer));
  if (run->length > pick->run.size()) {
    return Status::Invalid("layer " + std::to_string(layer) + "'s trunk run (" +
                           std::to_string(run->length) + " bytes) exceeds the ring slot (" +
                           std::to_string(pick->run.size()) + "): the plan does not match " +
                           prepared_->dir);
  }
  pick->layer = -1;  // a failed read leaves the slot empty, never half-bound
  K3_RETURN_IF_ERROR(ReadRun(*run, pick->run.data()));
  K3_RETURN_IF_ERROR(BindLayer(*prepared_, dims_, layer, *run, pick->run.data(), &pick->view));
  pick->layer = layer;
  pick->in_use = true;
  pick->loaded_at = ++ring_clock_;
  ++stats_.ring_loads;
  return &pick->view.w;
}

void StreamingWeights::ReleaseLayer(int layer) {
  for (auto& s : ring_) {
    if (s->layer == layer) s->in_use = false;
  }
}

bool StreamingWeights::Valid(int layer, int expert) const {
  const ModelConfig& c = prepared_->manifest.config;
  return layer >= c.first_dense && layer < c.n_layers && expert >= 0 && expert < c.n_experts;
}

Result<File*> StreamingWeights::ExpertFile(uint32_t file_id) {
  auto& f = expert_files_[file_id];
  if (!f) {
    K3_ASSIGN_OR_RETURN(f, env_->Open(prepared_->expert_paths[file_id], OpenMode::kReadDirect));
  }
  return f.get();
}

int64_t StreamingWeights::ExpertWaveSize() const {
  return std::max<int64_t>(1, plan_.expert_slots - 1);
}

void StreamingWeights::WillUse(int layer, std::span<const int32_t> experts) {
  ++stats_.waves;
  std::vector<int32_t> missing;
  for (int32_t e : experts) {
    if (!Valid(layer, e)) continue;
    const uint64_t key = prepared_->experts.RecordIndex(static_cast<uint32_t>(layer),
                                                        static_cast<uint32_t>(e));
    if (failed_.count(key)) continue;
    ++stats_.expert_requests;
    const int s = cache_.Lookup(key);
    if (s >= 0) {
      ++stats_.expert_hits;
      cache_.Pin(s);
    } else {
      missing.push_back(e);
    }
  }
  LoadExperts(layer, missing);
}

// Reserve serially, read in one batch in file-offset order, publish only what arrived intact.
void StreamingWeights::LoadExperts(int layer, const std::vector<int32_t>& missing) {
  struct Pending {
    int32_t expert;
    int slot;
    const prep::ExpertRecord* rec;
  };
  std::vector<Pending> pending;
  auto fail = [&](int32_t e, const std::string& why) {
    failed_.insert(prepared_->experts.RecordIndex(static_cast<uint32_t>(layer),
                                                  static_cast<uint32_t>(e)));
    failures_.push_back(ExpertFailure{layer, e, why});
  };
  for (int32_t e : missing) {
    const uint64_t key = prepared_->experts.RecordIndex(static_cast<uint32_t>(layer),
                                                        static_cast<uint32_t>(e));
    const prep::ExpertRecord& rec = prepared_->experts.records[key];
    if (rec.length > plan_.expert_slot_bytes) {
      fail(e, "expert record of " + std::to_string(rec.length) + " bytes exceeds the slot size");
      continue;
    }
    const int s = cache_.Reserve(key);
    if (s < 0) {
      fail(e, "no free expert slot (internal: the wave is larger than the cache allows)");
      continue;
    }
    pending.push_back(Pending{e, s, &rec});
  }
  std::sort(pending.begin(), pending.end(), [](const Pending& a, const Pending& b) {
    return a.rec->file_id != b.rec->file_id ? a.rec->file_id < b.rec->file_id
                                            : a.rec->offset < b.rec->offset;
  });
  std::vector<ReadRequest> reqs;
  std::vector<Pending> issued;
  for (const Pending& p : pending) {
    Result<File*> f = ExpertFile(p.rec->file_id);
    if (!f.ok()) {
      cache_.Drop(p.slot);
      fail(p.expert, f.status().ToString());
      continue;
    }
    ReadRequest r;
    r.file = *f;
    r.offset = p.rec->offset;
    r.length = p.rec->length;
    r.dst = arena_.data() + uint64_t(p.slot) * plan_.expert_slot_bytes;
    reqs.push_back(r);
    issued.push_back(p);
  }
  if (!reqs.empty()) (void)reader_->ReadAll(reqs);  // per-request statuses are checked below
  for (size_t i = 0; i < issued.size(); ++i) {
    const Pending& p = issued[i];
    const std::string& path = prepared_->expert_paths[p.rec->file_id];
    Status s = reqs[i].status;
    if (!s.ok()) {
      s = Status::Io(path + ": expert read at byte offset " + std::to_string(p.rec->offset) +
                     " (+" + std::to_string(p.rec->length) + " bytes) failed: " + s.ToString());
    } else {
      counters_.experts += p.rec->length;
      s = BindExpert(*prepared_, dims_, layer, p.expert,
                     arena_.data() + uint64_t(p.slot) * plan_.expert_slot_bytes,
                     options_.verify_reads, &slot_views_[static_cast<size_t>(p.slot)]);
    }
    if (!s.ok()) {
      cache_.Drop(p.slot);
      fail(p.expert, s.ToString());
      continue;
    }
    ++stats_.expert_reads;
  }
}

const ops::GluWeights* StreamingWeights::Expert(int layer, int expert) {
  if (!Valid(layer, expert)) return nullptr;
  const uint64_t key = prepared_->experts.RecordIndex(static_cast<uint32_t>(layer),
                                                      static_cast<uint32_t>(expert));
  if (failed_.count(key)) return nullptr;
  int s = cache_.Find(key);
  if (s < 0) {
    // Not announced by WillUse (a caller without waves): read it alone, now.
    WillUse(layer, std::span<const int32_t>(&expert, 1));
    s = cache_.Find(key);
    if (s < 0) return nullptr;
  }
  cache_.Pin(s);
  return &slot_views_[static_cast<size_t>(s)];
}

void StreamingWeights::ReleaseExperts(int) { cache_.UnpinAll(); }

bool StreamingWeights::Resident(int layer, int expert) const {
  if (!Valid(layer, expert)) return false;
  return cache_.Find(prepared_->experts.RecordIndex(static_cast<uint32_t>(layer),
                                                    static_cast<uint32_t>(expert))) >= 0;
}

StreamingStats StreamingWeights::stats() const {
  StreamingStats s = stats_;
  s.expert_evictions = cache_.evictions();
  return s;
}

Status StreamingWeights::EmbeddingRows(const int32_t* ids, int64_t n, float* out) {
  return ReadEmbeddingRows(resident_.get(), *prepared_, dims_, ids, n, out, &counters_.embedding);
}

int64_t StreamingWeights::LmHeadChunkRows() const {
  return plan_.lm_head_held ? prepared_->manifest.config.vocab : plan_.lm_head_chunk_rows;
}

Result<kernels::Matrix> StreamingWeights::LmHeadRows(int64_t begin, int64_t n) {
  const int64_t vocab = prepared_->manifest.config.vocab;
  if (begin < 0 || n < 0 || begin + n > vocab || (!plan_.lm_head_held && n > lm_head_matrix_.rows)) {
    return Status::Invalid("lm_head rows [" + std::to_string(begin) + ", +" + std::to_string(n) +
                           ") outside " + std::to_string(vocab) + " rows or the chunk of " +
                           std::to_string(lm_head_matrix_.rows));
  }
  kernels::Matrix m = lm_head_matrix_;
  const uint64_t row = lm_region_->length / uint64_t(vocab);
  if (plan_.lm_head_held) {
    m.data = static_cast<const uint8_t*>(m.data) + uint64_t(begin) * row;
  } else {
    const uint64_t off = lm_region_->offset + uint64_t(begin) * row;
    Status s = resident_->ReadExact(off, uint64_t(n) * row, lm_head_.data());
    if (!s.ok()) {
      return s.WithContext(prepared_->dir + "/" + std::string(prep::kResidentFile) + ": " +
                           std::string(prep::kLmHeadName) + " rows at byte offset " +
                           std::to_string(off));
    }
    counters_.lm_head += uint64_t(n) * row;
  }
  m.rows = n;
  return m;
}

Result<const HeadWeights*> StreamingWeights::Head() {
  return head_.Get(resident_.get(), *prepared_, dims_, &counters_.head);
}

}  // namespace k3::run
