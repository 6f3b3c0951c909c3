// StreamingWeights: pinned layers + ring, expert arena, chunked lm_head (see streaming_weights.h).
#include "k3run/streaming_weights.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "formats/prepared_layout.h"
#include "k3run/kernels/matmul.h"
#include "k3run/kernels/thread_pool.h"

namespace k3::run {

struct StreamingWeights::Held {
  AlignedBuffer run;
  LayerView view;
};

StreamingWeights::StreamingWeights(Env* env, const prep::PreparedDir* prepared,
                                   const StreamingPlan& plan, const StreamingOptions& options)
    : env_(env), prepared_(prepared), plan_(plan), options_(options),
      dims_(DimsFromConfig(prepared->manifest.config)), cache_(plan.expert_slots, plan.policy) {}

StreamingWeights::~StreamingWeights() {
  // The ring and the batch reader write into buffers owned here: stop them first.
  ring_.reset();
  batch_.reset();
}

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
  const std::string trunk_path = JoinPath(prepared_->dir, std::string(prep::kTrunkFile));
  const std::string resident_path = JoinPath(prepared_->dir, std::string(prep::kResidentFile));
  K3_ASSIGN_OR_RETURN(trunk_, env_->Open(trunk_path, OpenMode::kReadDirect));
  K3_ASSIGN_OR_RETURN(resident_, env_->Open(resident_path, OpenMode::kRead));
  expert_files_.resize(prepared_->expert_paths.size());
  pinned_.resize(static_cast<size_t>(c.n_layers));
  batch_ = std::make_unique<AsyncBatch>(&io_clock_, options_.force_pread);
  batch_index_.assign(static_cast<size_t>(std::max(c.n_experts, 0)), -1);
  reader_ = BatchReader::Create(BatchReader::kDefaultQueueDepth, options_.force_pread);
  // Pinned layers are read at start-up, never on first touch.
  Progress pin_progress("pinned trunk layers", plan_.pinned_bytes,
                        plan_.pinned.empty() ? ProgressMode::kNone : options_.progress);
  for (int layer : plan_.pinned) {
    K3_ASSIGN_OR_RETURN(const prep::TrunkRun* run, FindTrunkRun(*prepared_, layer));
    auto h = std::make_unique<Held>();
    K3_ASSIGN_OR_RETURN(h->run, AlignedBuffer::Allocate(run->length, prep::kRunAlign));
    K3_RETURN_IF_ERROR(ReadRun(*run, h->run.data()));
    K3_RETURN_IF_ERROR(BindLayer(*prepared_, dims_, layer, *run, h->run.data(), &h->view));
    pinned_[static_cast<size_t>(layer)] = std::move(h);
    pin_progress.Add(run->length);
  }
  pin_progress.Finish();
  if (plan_.expert_slots > 0) {
    // Huge pages for a large arena: each first touch of a slot otherwise faults in (and zeroes)
    // 4 KiB pages one by one, and O_DIRECT pins every page of every read.
    const uint64_t arena = uint64_t(plan_.expert_slots) * plan_.expert_slot_bytes;
    K3_ASSIGN_OR_RETURN(arena_, AlignedBuffer::AllocateLarge(arena));
    // Touched now, not slot by slot during generation: a slot's first use would otherwise pay
    // the kernel's page zeroing inside a token (measured: 0.317 s/token at a 4 GB budget with
    // 15 % hits against 0.275 s at 1.5 GB with none). The plan already counts these bytes.
    // --preload writes every slot at start-up anyway.
    if (!options_.preload_experts) {
      constexpr uint64_t kTouch = uint64_t{64} << 20;
      uint8_t* base = arena_.data();
      kernels::ParallelChunks(kernels::Threads(), int64_t((arena + kTouch - 1) / kTouch),
                              [&](int64_t ch) {
                                const uint64_t b = uint64_t(ch) * kTouch;
                                std::memset(base + b, 0, std::min(arena - b, kTouch));
                              });
    }
  }
  slot_views_.resize(static_cast<size_t>(plan_.expert_slots));
  K3_ASSIGN_OR_RETURN(lm_region_, LmHeadRegion(*prepared_, dims_));
  K3_ASSIGN_OR_RETURN(kernels::WeightType t, LmHeadType(*lm_region_));
  lm_head_matrix_ = kernels::Matrix{t, plan_.lm_head_held ? c.vocab : plan_.lm_head_chunk_rows,
                                    dims_.hidden, nullptr, nullptr};
  if (plan_.lm_head_held) {
    K3_ASSIGN_OR_RETURN(lm_head_, AlignedBuffer::Allocate(lm_region_->length,
                                                          prep::kResidentAlign));
    lm_head_matrix_.data = lm_head_.data();
    IoScope io(&io_clock_);
    Status s = resident_->ReadExact(lm_region_->offset, lm_region_->length, lm_head_.data());
    if (!s.ok()) {
      return s.WithContext(resident_path + ": " + std::string(prep::kLmHeadName) +
                           " at byte offset " + std::to_string(lm_region_->offset));
    }
    counters_.lm_head += lm_region_->length;
    K3_RETURN_IF_ERROR(kernels::ValidateMatrix(lm_head_matrix_, prep::kLmHeadName));
  }
  if (options_.preload_experts) K3_RETURN_IF_ERROR(PreloadExperts());
  return StartRing();
}

// Every expert through the normal path (waves, batch reads, publication), layer by layer.
Status StreamingWeights::PreloadExperts() {
  const ModelConfig& c = prepared_->manifest.config;
  if (prepared_->experts.records.empty()) return Status::Ok();
  K3_RETURN_IF_ERROR(CheckPreloadFits(plan_, *prepared_));
  const int64_t wave = ExpertWaveSize();
  uint64_t total = 0;
  for (const prep::ExpertRecord& r : prepared_->experts.records) total += r.length;
  Progress progress("preloading experts", total, options_.progress);
  std::vector<int32_t> ids;
  for (int layer = c.first_dense; layer < c.n_layers; ++layer) {
    for (int32_t e0 = 0; e0 < c.n_experts; e0 += static_cast<int32_t>(wave)) {
      ids.clear();
      for (int32_t e = e0; e < std::min<int64_t>(c.n_experts, e0 + wave); ++e) ids.push_back(e);
      const uint64_t before = counters_.experts;
      WillUse(layer, ids);
      ReleaseExperts(layer);
      progress.Add(counters_.experts - before);
    }
  }
  progress.Finish();
  if (!failures_.empty()) {
    return Status::Io("--preload: " + std::to_string(failures_.size()) +
                      " expert(s) could not be read, first: layer " +
                      std::to_string(failures_[0].layer) + " expert " +
                      std::to_string(failures_[0].expert) + ": " + failures_[0].reason);
  }
  return Status::Ok();
}

// The walk: unpinned layers of a forward pass in order, then lm_head's chunks when it is not held.
Status StreamingWeights::StartRing() {
  const ModelConfig& c = prepared_->manifest.config;
  const int walk_layers = options_.walk_layers > 0 ? options_.walk_layers : c.n_layers;
  std::vector<RingItem> walk;
  ring_pos_.assign(static_cast<size_t>(c.n_layers), -1);
  for (int layer = 0; layer < walk_layers; ++layer) {
    if (pinned_[static_cast<size_t>(layer)]) continue;
    K3_ASSIGN_OR_RETURN(const prep::TrunkRun* run, FindTrunkRun(*prepared_, layer));
    ring_pos_[static_cast<size_t>(layer)] = static_cast<int>(walk.size());
    walk.push_back(RingItem{trunk_.get(), run->offset, run->length,
                            "layer " + std::to_string(layer) + "'s trunk run"});
  }
  if (!plan_.lm_head_held) {
    K3_ASSIGN_OR_RETURN(resident_direct_,
                        env_->Open(JoinPath(prepared_->dir, std::string(prep::kResidentFile)),
                                   OpenMode::kReadDirect));
    const uint64_t row = lm_region_->length / uint64_t(c.vocab);
    lm_first_pos_ = static_cast<int64_t>(walk.size());
    for (int64_t b = 0; b < c.vocab; b += plan_.lm_head_chunk_rows) {
      const int64_t n = std::min<int64_t>(plan_.lm_head_chunk_rows, c.vocab - b);
      walk.push_back(RingItem{resident_direct_.get(), lm_region_->offset + uint64_t(b) * row,
                              uint64_t(n) * row,
                              std::string(prep::kLmHeadName) + " rows [" + std::to_string(b) +
                                  ", " + std::to_string(b + n) + ")"});
    }
  }
  if (walk.empty()) return Status::Ok();
  if (plan_.ring_slots < 2) {
    return Status::Invalid("streaming plan: " + std::to_string(walk.size()) +
                           " trunk items to stream but no ring (internal: plan/source mismatch)");
  }
  ring_views_.resize(static_cast<size_t>(plan_.ring_slots));
  K3_ASSIGN_OR_RETURN(ring_, TrunkRing::Start(std::move(walk), plan_.ring_slots,
                                              plan_.ring_slot_bytes, &io_clock_,
                                              options_.force_pread));
  return Status::Ok();
}

Status StreamingWeights::ReadRun(const prep::TrunkRun& run, uint8_t* dst) {
  ReadRequest req;
  req.file = trunk_.get();
  req.offset = run.offset;
  req.length = run.length;
  req.dst = dst;
  IoScope io(&io_clock_);
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
  const int pos = ring_pos_[static_cast<size_t>(layer)];
  if (ring_ == nullptr || pos < 0) {
    return Status::Invalid("layer " + std::to_string(layer) +
                           " is neither pinned nor in the ring's walk (--layers beyond the plan)");
  }
  K3_ASSIGN_OR_RETURN(TrunkRing::Acquired a, ring_->Acquire(static_cast<size_t>(pos), &io_wait_));
  K3_ASSIGN_OR_RETURN(const prep::TrunkRun* run, FindTrunkRun(*prepared_, layer));
  LayerView& view = ring_views_[static_cast<size_t>(a.slot)];
  if (Status s = BindLayer(*prepared_, dims_, layer, *run, a.data, &view); !s.ok()) {
    ring_->Release(static_cast<size_t>(pos));
    return s;
  }
  counters_.trunk += run->length;
  return &view.w;
}

void StreamingWeights::ReleaseLayer(int layer) {
  if (ring_ == nullptr || layer < 0 || layer >= static_cast<int>(ring_pos_.size())) return;
  const int pos = ring_pos_[static_cast<size_t>(layer)];
  if (pos >= 0) ring_->Release(static_cast<size_t>(pos));
}

uint64_t StreamingWeights::Key(int layer, int expert) const {
  return prepared_->experts.RecordIndex(static_cast<uint32_t>(layer),
                                        static_cast<uint32_t>(expert));
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
  Publish();  // a previous wave's batch (a caller that skipped Expert) is collected first
  ++stats_.waves;
  if (options_.trace != nullptr) options_.trace->Wave(step_, layer, experts);
  std::vector<int32_t> missing;
  for (int32_t e : experts) {
    if (!Valid(layer, e)) continue;
    const uint64_t key = Key(layer, e);
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

void StreamingWeights::Fail(int layer, int32_t expert, const std::string& why) {
  failed_.insert(Key(layer, expert));
  failures_.push_back(ExpertFailure{layer, expert, why});
}

// Reserve serially, then read in one batch in file-offset order on the batch thread; Publish()
// binds only what arrived intact.
void StreamingWeights::LoadExperts(int layer, const std::vector<int32_t>& missing) {
  std::vector<Pending> pending;
  for (int32_t e : missing) {
    const uint64_t key = Key(layer, e);
    const prep::ExpertRecord& rec = prepared_->experts.records[key];
    if (rec.length > plan_.expert_slot_bytes) {
      Fail(layer, e, "expert record of " + std::to_string(rec.length) +
                         " bytes exceeds the slot size");
      continue;
    }
    const int s = cache_.Reserve(key);
    if (s < 0) {
      Fail(layer, e, "no free expert slot (internal: the wave is larger than the cache allows)");
      continue;
    }
    pending.push_back(Pending{e, s, &rec});
  }
  std::sort(pending.begin(), pending.end(), [](const Pending& a, const Pending& b) {
    return a.rec->file_id != b.rec->file_id ? a.rec->file_id < b.rec->file_id
                                            : a.rec->offset < b.rec->offset;
  });
  std::vector<ReadRequest> reqs;
  batch_pending_.clear();
  for (const Pending& p : pending) {
    Result<File*> f = ExpertFile(p.rec->file_id);
    if (!f.ok()) {
      cache_.Drop(p.slot);
      Fail(layer, p.expert, f.status().ToString());
      continue;
    }
    ReadRequest r;
    r.file = *f;
    r.offset = p.rec->offset;
    r.length = p.rec->length;
    r.dst = arena_.data() + uint64_t(p.slot) * plan_.expert_slot_bytes;
    reqs.push_back(r);
    batch_index_[static_cast<size_t>(p.expert)] = static_cast<int>(batch_pending_.size());
    batch_pending_.push_back(p);
  }
  if (reqs.empty()) return;
  batch_layer_ = layer;
  batch_->Submit(std::move(reqs));
}

// Collects the whole batch in flight and binds what was not bound yet.
void StreamingWeights::Publish() {
  if (!batch_ || !batch_->pending()) return;
  std::vector<ReadRequest> reqs = batch_->Wait(&io_wait_);
  for (size_t i = 0; i < batch_pending_.size(); ++i) {
    if (!batch_pending_[i].bound) Bind(i, reqs[i].status);
  }
  for (const Pending& p : batch_pending_) batch_index_[static_cast<size_t>(p.expert)] = -1;
  batch_pending_.clear();
}

// Request i of the batch in flight is done (read_status is its read's): bind its view, or drop
// its slot and record why.
void StreamingWeights::Bind(size_t i, Status read_status) {
  Pending& p = batch_pending_[i];
  p.bound = true;
  const std::string& path = prepared_->expert_paths[p.rec->file_id];
  Status s = std::move(read_status);
  if (!s.ok()) {
    s = Status::Io(path + ": expert read at byte offset " + std::to_string(p.rec->offset) +
                   " (+" + std::to_string(p.rec->length) + " bytes) failed: " + s.ToString());
  } else {
    counters_.experts += p.rec->length;
    s = BindExpert(*prepared_, dims_, batch_layer_, p.expert,
                   arena_.data() + uint64_t(p.slot) * plan_.expert_slot_bytes,
                   options_.verify_reads, &slot_views_[static_cast<size_t>(p.slot)]);
  }
  if (!s.ok()) {
    cache_.Drop(p.slot);
    Fail(batch_layer_, p.expert, s.ToString());
    return;
  }
  ++stats_.expert_reads;
}

// The expert's index in the batch in flight while it is not bound yet, else −1.
int StreamingWeights::InFlight(int layer, int expert) const {
  if (!batch_ || !batch_->pending() || batch_layer_ != layer) return -1;
  const int i = batch_index_[static_cast<size_t>(expert)];
  return i >= 0 && !batch_pending_[static_cast<size_t>(i)].bound ? i : -1;
}

bool StreamingWeights::ExpertReady(int layer, int expert) {
  if (!Valid(layer, expert)) return true;
  const int i = InFlight(layer, expert);
  if (i < 0) return true;
  if (!batch_->Arrived(static_cast<size_t>(i))) return false;
  Bind(static_cast<size_t>(i), batch_->WaitFor(static_cast<size_t>(i), nullptr));
  return true;
}

const ops::GluWeights* StreamingWeights::Expert(int layer, int expert) {
  if (!Valid(layer, expert)) return nullptr;
  if (const int i = InFlight(layer, expert); i >= 0) {
    // Only this expert's read is waited for: the rest of the batch keeps loading while the
    // caller computes with it.
    Bind(static_cast<size_t>(i), batch_->WaitFor(static_cast<size_t>(i), &io_wait_));
  } else if (batch_layer_ != layer) {
    Publish();  // another layer's batch: collect it before touching the cache
  }
  const uint64_t key = Key(layer, expert);
  if (failed_.count(key)) return nullptr;
  int s = cache_.Find(key);
  if (s < 0) {
    // Not announced by WillUse (a caller without waves): read it alone, now.
    WillUse(layer, std::span<const int32_t>(&expert, 1));
    Publish();
    s = cache_.Find(key);
    if (s < 0) return nullptr;
  }
  cache_.Pin(s);
  return &slot_views_[static_cast<size_t>(s)];
}

void StreamingWeights::ReleaseExperts(int) {
  Publish();  // never unpin (or later reuse) slots a batch is still writing
  cache_.UnpinAll();
}

bool StreamingWeights::Resident(int layer, int expert) const {
  if (!Valid(layer, expert)) return false;
  return cache_.Find(Key(layer, expert)) >= 0;
}

StreamingStats StreamingWeights::stats() const {
  StreamingStats s = stats_;
  s.expert_evictions = cache_.evictions();
  if (ring_) {
    s.ring_loads = ring_->loads();
    s.ring_resyncs = ring_->resyncs();
  }
  return s;
}

SourceCounters StreamingWeights::Source() const {
  return SourceCounters{stats_.expert_requests, stats_.expert_hits, io_clock_.BusySeconds(),
                        io_wait_};
}

Status StreamingWeights::EmbeddingRows(const int32_t* ids, int64_t n, float* out) {
  const auto t0 = std::chrono::steady_clock::now();
  IoScope io(&io_clock_);
  Status s = ReadEmbeddingRows(resident_.get(), *prepared_, dims_, ids, n, out, &counters_.embedding);
  io_wait_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

int64_t StreamingWeights::LmHeadChunkRows() const {
  return plan_.lm_head_held ? prepared_->manifest.config.vocab : plan_.lm_head_chunk_rows;
}

Result<kernels::Matrix> StreamingWeights::LmHeadRows(int64_t begin, int64_t n) {
  const int64_t vocab = prepared_->manifest.config.vocab;
  const int64_t chunk = LmHeadChunkRows();
  if (begin < 0 || n <= 0 || begin + n > vocab || begin % chunk != 0 ||
      n != std::min(chunk, vocab - begin)) {
    return Status::Invalid("lm_head rows [" + std::to_string(begin) + ", +" + std::to_string(n) +
                           ") are not a chunk of " + std::to_string(chunk) + " rows of " +
                           std::to_string(vocab));
  }
  kernels::Matrix m = lm_head_matrix_;
  m.rows = n;
  if (plan_.lm_head_held) return m;
  LmHeadDone();
  const int64_t c = begin / chunk;
  const size_t pos = static_cast<size_t>(lm_first_pos_ + c);
  K3_ASSIGN_OR_RETURN(TrunkRing::Acquired a, ring_->Acquire(pos, &io_wait_));
  lm_held_chunk_ = c;
  counters_.lm_head += uint64_t(n) * (lm_region_->length / uint64_t(vocab));
  m.data = a.data;
  return m;
}

void StreamingWeights::LmHeadDone() {
  if (lm_held_chunk_ < 0) return;
  ring_->Release(static_cast<size_t>(lm_first_pos_ + lm_held_chunk_));
  lm_held_chunk_ = -1;
}

Result<const HeadWeights*> StreamingWeights::Head() {
  return head_.Get(resident_.get(), *prepared_, dims_, &counters_.head);
}

}  // namespace k3::run
