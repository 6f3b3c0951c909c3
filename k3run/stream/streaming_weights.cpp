// StreamingWeights: pinned layers + ring, expert arena, chunked lm_head (see k3run/stream/streaming_weights.h).
#include "k3run/stream/streaming_weights.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/align.h"
#include "formats/prepared_layout.h"
#include "k3run/kernels/matmul.h"
#include "k3run/kernels/thread_pool.h"

namespace k3::run {

namespace {

// A share's record of an expert another rank holds: never read, never cached. `layer` and
// `expert` are in range (the callers checked Valid).
bool Absent(const prepared::PreparedDir& p, int layer, int expert) {
  return p.experts.At(static_cast<uint32_t>(layer), static_cast<uint32_t>(expert)).absent();
}

std::string AbsentReason(const prepared::PreparedDir& p) {
  return prepared::AbsentExpertReason(p.manifest.share.value_or(prepared::ExpertShare{}));
}

}  // namespace

struct StreamingWeights::Held {
  LayerView view;  // over the layer's run in pinned_arena_
};

StreamingWeights::StreamingWeights(Env* env, const prepared::PreparedDir* prepared,
                                   const StreamingPlan& plan, const StreamingOptions& options)
    : env_(env), prepared_(prepared), plan_(plan), options_(options),
      dims_(DimsFromConfig(prepared->manifest.config)), cache_(plan.expert_slots, plan.policy) {}

StreamingWeights::~StreamingWeights() {
  // The ring and the batch reader write into buffers owned here: stop them first.
  ring_.reset();
  batch_.reset();
}

Result<std::unique_ptr<StreamingWeights>> StreamingWeights::Open(
    Env* env, const prepared::PreparedDir* prepared, const StreamingPlan& plan,
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
  const std::string trunk_path = JoinPath(prepared_->dir, std::string(prepared::kTrunkFile));
  const std::string resident_path = JoinPath(prepared_->dir, std::string(prepared::kResidentFile));
  K3_ASSIGN_OR_RETURN(trunk_, env_->Open(trunk_path, OpenMode::kReadDirect));
  K3_ASSIGN_OR_RETURN(resident_, env_->Open(resident_path, OpenMode::kRead));
  expert_files_.resize(prepared_->expert_paths.size());
  pinned_.resize(static_cast<size_t>(c.n_layers));
  batch_ = std::make_unique<AsyncBatch>(&io_clock_, options_.force_pread);
  // Guesses need slots of their own beside a whole top-k wave; a trace must see the cache as
  // routing alone drives it (the replay re-runs routing only); with every expert preloaded there
  // is nothing to read, and ranking the guesses would only cost a router product per layer.
  if (options_.trace == nullptr && !options_.preload_experts && options_.prefetch_experts > 0 &&
      plan_.expert_slots - 1 - options_.prefetch_experts >= c.topk) {
    prefetch_budget_ = options_.prefetch_experts;
  }
  reader_ = BatchReader::Create(BatchReader::kDefaultQueueDepth, options_.force_pread);
  // Pinned layers are read at start-up, never on first touch.
  Progress pin_progress("pinned trunk layers", plan_.pinned_bytes,
                        plan_.pinned.empty() ? ProgressMode::kNone : options_.progress);
  // The pinned runs share one buffer, so that all but its last partial 2 MiB can be huge pages:
  // with a buffer of 4 KiB pages per layer, the trunk's products at prefill widths waited on
  // their weights at the start of every row block (the hardware prefetcher stops at each 4 KiB
  // page), and bench-preset prefill took a third longer (median 4.99 s against 3.75 s,
  // docs/PERFORMANCE.md "Pinned trunk in huge pages").
  std::vector<const prepared::TrunkRun*> runs;
  uint64_t pinned_bytes = 0;
  for (int layer : plan_.pinned) {
    K3_ASSIGN_OR_RETURN(const prepared::TrunkRun* run, FindTrunkRun(*prepared_, layer));
    runs.push_back(run);
    pinned_bytes += AlignUp(run->length, prepared::kRunAlign);
  }
  K3_ASSIGN_OR_RETURN(pinned_arena_, AlignedBuffer::AllocateLarge(pinned_bytes));
  uint8_t* at = pinned_arena_.data();
  for (size_t i = 0; i < runs.size(); ++i) {
    const int layer = plan_.pinned[i];
    auto h = std::make_unique<Held>();
    K3_RETURN_IF_ERROR(ReadRun(*runs[i], at));
    K3_RETURN_IF_ERROR(BindLayer(*prepared_, dims_, layer, *runs[i], at, &h->view));
    pinned_[static_cast<size_t>(layer)] = std::move(h);
    pin_progress.Add(runs[i]->length);
    at += AlignUp(runs[i]->length, prepared::kRunAlign);
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
    // Shown: at a large budget this takes seconds (a virtual machine's first touch of its
    // memory ran at 0.4 GB/s here).
    if (!options_.preload_experts) {
      constexpr uint64_t kTouch = uint64_t{64} << 20;
      uint8_t* base = arena_.data();
      Progress touch_progress("expert cache memory", arena, options_.progress);
      kernels::ParallelChunks(kernels::Threads(), int64_t((arena + kTouch - 1) / kTouch),
                              [&](int64_t ch) {
                                const uint64_t b = uint64_t(ch) * kTouch;
                                const uint64_t n = std::min(arena - b, kTouch);
                                std::memset(base + b, 0, n);
                                touch_progress.Add(n);
                              });
      touch_progress.Finish();
    }
  }
  slot_views_.resize(static_cast<size_t>(plan_.expert_slots));
  K3_ASSIGN_OR_RETURN(lm_region_, LmHeadRegion(*prepared_, dims_));
  K3_ASSIGN_OR_RETURN(kernels::WeightType t, LmHeadType(*lm_region_));
  lm_head_matrix_ = kernels::Matrix{t, plan_.lm_head_held ? c.vocab : plan_.lm_head_chunk_rows,
                                    dims_.hidden, nullptr, nullptr};
  if (plan_.lm_head_held) {
    K3_ASSIGN_OR_RETURN(lm_head_, AlignedBuffer::AllocateLarge(lm_region_->length));
    lm_head_matrix_.data = lm_head_.data();
    IoScope io(&io_clock_);
    Status s = resident_->ReadExact(lm_region_->offset, lm_region_->length, lm_head_.data());
    if (!s.ok()) {
      return s.WithContext(resident_path + ": " + std::string(prepared::kLmHeadName) +
                           " at byte offset " + std::to_string(lm_region_->offset));
    }
    counters_.lm_head += lm_region_->length;
    K3_RETURN_IF_ERROR(kernels::ValidateMatrix(lm_head_matrix_, prepared::kLmHeadName));
  }
  if (options_.preload_experts) K3_RETURN_IF_ERROR(PreloadExperts());
  return StartRing();
}

// Every expert through the normal path (waves, batch reads, publication), layer by layer.
Status StreamingWeights::PreloadExperts() {
  const ModelConfig& c = prepared_->manifest.config;
  if (prepared_->experts.records.empty()) return Status::Ok();
  K3_RETURN_IF_ERROR(CheckPreloadFits(plan_, *prepared_));
  const size_t wave = static_cast<size_t>(ExpertWaveSize());
  uint64_t total = 0;  // absent records (another rank's share) have length 0
  for (const prepared::ExpertRecord& r : prepared_->experts.records) total += r.length;
  Progress progress("preloading experts", total, options_.progress);
  std::vector<int32_t> held, ids;
  for (int layer = c.first_dense; layer < c.n_layers; ++layer) {
    // Only what this directory holds: a share's absent experts are other ranks' to load.
    held.clear();
    for (int32_t e = 0; e < c.n_experts; ++e) {
      if (!Absent(*prepared_, layer, e)) held.push_back(e);
    }
    for (size_t k0 = 0; k0 < held.size(); k0 += wave) {
      ids.assign(held.begin() + static_cast<std::ptrdiff_t>(k0),
                 held.begin() + static_cast<std::ptrdiff_t>(std::min(held.size(), k0 + wave)));
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
  if (plan_.experts_only) return Status::Ok();  // a rank that computes experts only: no walk
  const int walk_layers = options_.walk_layers > 0 ? options_.walk_layers : c.n_layers;
  std::vector<RingItem> walk;
  ring_pos_.assign(static_cast<size_t>(c.n_layers), -1);
  for (int layer = 0; layer < walk_layers; ++layer) {
    if (pinned_[static_cast<size_t>(layer)]) continue;
    K3_ASSIGN_OR_RETURN(const prepared::TrunkRun* run, FindTrunkRun(*prepared_, layer));
    ring_pos_[static_cast<size_t>(layer)] = static_cast<int>(walk.size());
    walk.push_back(RingItem{trunk_.get(), run->offset, run->length,
                            "layer " + std::to_string(layer) + "'s trunk run"});
  }
  if (!plan_.lm_head_held) {
    K3_ASSIGN_OR_RETURN(resident_direct_,
                        env_->Open(JoinPath(prepared_->dir, std::string(prepared::kResidentFile)),
                                   OpenMode::kReadDirect));
    const uint64_t row = lm_region_->length / uint64_t(c.vocab);
    lm_first_pos_ = static_cast<int64_t>(walk.size());
    for (int64_t b = 0; b < c.vocab; b += plan_.lm_head_chunk_rows) {
      const int64_t n = std::min<int64_t>(plan_.lm_head_chunk_rows, c.vocab - b);
      walk.push_back(RingItem{resident_direct_.get(), lm_region_->offset + uint64_t(b) * row,
                              uint64_t(n) * row,
                              std::string(prepared::kLmHeadName) + " rows [" + std::to_string(b) +
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

Status StreamingWeights::ReadRun(const prepared::TrunkRun& run, uint8_t* dst) {
  ReadRequest req;
  req.file = trunk_.get();
  req.offset = run.offset;
  req.length = run.length;
  req.dst = dst;
  IoScope io(&io_clock_);
  Status s = reader_->ReadAll(std::span<ReadRequest>(&req, 1));
  if (!s.ok()) {
    return Status::Io(prepared_->dir + "/" + std::string(prepared::kTrunkFile) + ": reading layer " +
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
  K3_ASSIGN_OR_RETURN(const prepared::TrunkRun* run, FindTrunkRun(*prepared_, layer));
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
  return std::max<int64_t>(1, plan_.expert_slots - 1 - prefetch_budget_);
}

void StreamingWeights::WillUse(int layer, std::span<const int32_t> experts) {
  Reap();
  ++stats_.waves;
  if (options_.trace != nullptr) options_.trace->Wave(step_, layer, experts);
  const bool claims = guess_layer_ == layer;
  std::vector<int32_t> missing;
  for (int32_t e : experts) {
    if (!Valid(layer, e)) continue;
    const uint64_t key = Key(layer, e);
    if (failed_.count(key)) continue;
    if (Absent(*prepared_, layer, e)) {
      // Another rank's share holds it: a failure, recorded once like a failed read.
      Fail(layer, e, AbsentReason(*prepared_));
      continue;
    }
    ++stats_.expert_requests;
    if (auto it = in_flight_.find(key); it != in_flight_.end()) {
      // A guess still loading (its slot stays pinned until it is bound).
      if (it->second.kind == ReadKind::kGuess && claims && guessed_.erase(key)) {
        ++stats_.prefetch_used;
      } else if (it->second.kind == ReadKind::kUnused) {
        // A later wave of the same pass picks a guess settled as unused (in this pass, so this
        // step's count never goes below zero): its bytes move to the expert bytes, at bind.
        counters_.prefetch_unused -= it->second.rec->length;
      }
      it->second.kind = ReadKind::kRouted;
      continue;
    }
    const int s = cache_.Lookup(key);
    if (s < 0) {
      missing.push_back(e);
      continue;
    }
    cache_.Pin(s);
    if (claims && guessed_.erase(key)) {
      // Arrived on a guess for this very layer: a read the token needed, not a true hit.
      ++stats_.prefetch_used;
      counters_.experts += prepared_->experts.records[key].length;
    } else {
      ++stats_.expert_hits;
    }
  }
  if (claims) SettleGuesses();
  LoadExperts(layer, missing, ReadKind::kRouted);
}

// Counted now, whether or not the read has arrived: a step's bytes must not depend on when a
// read finishes (a guess still loading at the end of the run would never be counted).
void StreamingWeights::SettleGuesses() {
  for (uint64_t key : guessed_) {
    if (auto it = in_flight_.find(key); it != in_flight_.end()) it->second.kind = ReadKind::kUnused;
    counters_.prefetch_unused += prepared_->experts.records[key].length;
  }
  guessed_.clear();
  guess_layer_ = -1;
}

int64_t StreamingWeights::PrefetchBudget(int layer) {
  if (prefetch_budget_ == 0 || HeldLayer(layer) == nullptr) return 0;
  if (quiet_rounds_ >= kQuietRounds && ++quiet_asks_ % kProbeEvery != 0) return 0;
  return prefetch_budget_;
}

const ops::LayerWeights* StreamingWeights::HeldLayer(int layer) const {
  if (layer < 0 || layer >= static_cast<int>(pinned_.size())) return nullptr;
  const auto& h = pinned_[static_cast<size_t>(layer)];
  return h ? &h->view.w : nullptr;
}

void StreamingWeights::Prefetch(int layer, std::span<const int32_t> guesses) {
  if (prefetch_budget_ == 0) return;
  Reap();
  if (guess_layer_ >= 0) SettleGuesses();
  // Guesses still loading count against the budget: they hold pinned slots.
  int64_t room = prefetch_budget_;
  for (const auto& [key, r] : in_flight_) {
    if (r.kind != ReadKind::kRouted) --room;
  }
  std::vector<int32_t> read;
  for (int32_t e : guesses) {
    if (static_cast<int64_t>(read.size()) >= room) break;
    if (!Valid(layer, e) || Absent(*prepared_, layer, e)) continue;
    const uint64_t key = Key(layer, e);
    if (failed_.count(key) || in_flight_.count(key) || cache_.Find(key) >= 0) continue;
    if (std::find(read.begin(), read.end(), e) != read.end()) continue;
    read.push_back(e);
  }
  // Quiet: there was room and nothing to read. No room means the disk is behind: not quiet.
  quiet_rounds_ = read.empty() && room > 0 ? std::min(quiet_rounds_ + 1, kQuietRounds) : 0;
  guess_layer_ = layer;
  LoadExperts(layer, read, ReadKind::kGuess);
}

void StreamingWeights::Fail(int layer, int32_t expert, const std::string& why) {
  failed_.insert(Key(layer, expert));
  failures_.push_back(ExpertFailure{layer, expert, why});
}

// Reserve serially, then read in one batch in file-offset order on the batch thread; Bind()
// publishes only what arrived intact.
void StreamingWeights::LoadExperts(int layer, const std::vector<int32_t>& experts,
                                   ReadKind kind) {
  struct Planned {
    int32_t expert;
    int slot;
    const prepared::ExpertRecord* rec;
    File* file;
  };
  const bool guess = kind == ReadKind::kGuess;
  std::vector<Planned> planned;
  for (int32_t e : experts) {
    const uint64_t key = Key(layer, e);
    const prepared::ExpertRecord& rec = prepared_->experts.records[key];
    Result<File*> f = ExpertFile(rec.file_id);
    std::string why;
    if (rec.length > plan_.expert_slot_bytes) {
      why = "expert record of " + std::to_string(rec.length) + " bytes exceeds the slot size";
    } else if (!f.ok()) {
      why = f.status().ToString();
    }
    if (!why.empty()) {
      if (!guess) Fail(layer, e, why);  // a guess is only dropped: a miss reads it again
      continue;
    }
    const int s = cache_.Reserve(key);
    if (s < 0) {
      if (!guess) {
        Fail(layer, e, "no free expert slot (internal: the wave is larger than the cache allows)");
      }
      continue;
    }
    planned.push_back(Planned{e, s, &rec, *f});
  }
  std::sort(planned.begin(), planned.end(), [](const Planned& a, const Planned& b) {
    return a.rec->file_id != b.rec->file_id ? a.rec->file_id < b.rec->file_id
                                            : a.rec->offset < b.rec->offset;
  });
  if (planned.empty()) return;
  std::vector<ReadRequest> reqs;
  for (const Planned& p : planned) {
    ReadRequest r;
    r.file = p.file;
    r.offset = p.rec->offset;
    r.length = p.rec->length;
    r.dst = arena_.data() + uint64_t(p.slot) * plan_.expert_slot_bytes;
    reqs.push_back(r);
  }
  const uint64_t first = batch_->Submit(std::move(reqs));
  for (size_t i = 0; i < planned.size(); ++i) {
    const Planned& p = planned[i];
    const uint64_t key = Key(layer, p.expert);
    in_flight_.emplace(key, InFlightRead{layer, p.expert, p.slot, p.rec, first + i, kind});
    if (guess) {
      guessed_.insert(key);
      ++stats_.prefetches;
    }
  }
}

void StreamingWeights::Reap() {
  std::vector<uint64_t> arrived;
  for (const auto& [key, r] : in_flight_) {
    if (batch_->Arrived(r.ticket)) arrived.push_back(key);
  }
  for (uint64_t key : arrived) Bind(key, batch_->Take(in_flight_.at(key).ticket, nullptr));
}

// The read of `key` is done (read_status is its status): bind its view, or drop its slot and
// record why (a guess not claimed by routing is only dropped).
void StreamingWeights::Bind(uint64_t key, Status read_status) {
  const InFlightRead r = in_flight_.at(key);
  in_flight_.erase(key);
  const std::string& path = prepared_->expert_paths[r.rec->file_id];
  Status s = std::move(read_status);
  if (!s.ok()) {
    s = Status::Io(path + ": expert read at byte offset " + std::to_string(r.rec->offset) +
                   " (+" + std::to_string(r.rec->length) + " bytes) failed: " + s.ToString());
  } else {
    s = BindExpert(*prepared_, dims_, r.layer, r.expert,
                   arena_.data() + uint64_t(r.slot) * plan_.expert_slot_bytes,
                   options_.verify_reads, &slot_views_[static_cast<size_t>(r.slot)]);
  }
  if (!s.ok()) {
    cache_.Drop(r.slot);
    if (r.kind == ReadKind::kRouted) {
      Fail(r.layer, r.expert, s.ToString());
    } else if (r.kind == ReadKind::kGuess) {
      ++stats_.prefetch_failed;  // never claimed now: a miss reads it again
      guessed_.erase(key);
    }
    // kUnused: settled (and counted) already; nothing asked for it.
    return;
  }
  ++stats_.expert_reads;
  if (r.kind == ReadKind::kRouted) {
    counters_.experts += r.rec->length;
    return;  // stays pinned: the current wave uses it
  }
  // A guess nobody uses yet: an ordinary cache entry from now on. Its layer's routing pins it
  // again if it picks it; its bytes are counted then, or when the guess is settled.
  cache_.Unpin(r.slot);
}

bool StreamingWeights::ExpertReady(int layer, int expert) {
  if (!Valid(layer, expert)) return true;
  const uint64_t key = Key(layer, expert);
  const auto it = in_flight_.find(key);
  if (it == in_flight_.end()) return true;
  if (!batch_->Arrived(it->second.ticket)) return false;
  Bind(key, batch_->Take(it->second.ticket, nullptr));
  return true;
}

const ops::GluWeights* StreamingWeights::Expert(int layer, int expert) {
  if (!Valid(layer, expert)) return nullptr;
  if (Absent(*prepared_, layer, expert)) {
    if (!failed_.count(Key(layer, expert))) Fail(layer, expert, AbsentReason(*prepared_));
    return nullptr;
  }
  const uint64_t key = Key(layer, expert);
  if (const auto it = in_flight_.find(key); it != in_flight_.end()) {
    // Only this expert's read is waited for: the rest keep loading while the caller computes.
    Bind(key, batch_->Take(it->second.ticket, &io_wait_));
  }
  if (failed_.count(key)) return nullptr;
  int s = cache_.Find(key);
  if (s < 0) {
    // Not announced by WillUse (a caller without waves): read it alone, now.
    WillUse(layer, std::span<const int32_t>(&expert, 1));
    if (const auto it = in_flight_.find(key); it != in_flight_.end()) {
      Bind(key, batch_->Take(it->second.ticket, &io_wait_));
    }
    if (failed_.count(key)) return nullptr;
    s = cache_.Find(key);
    if (s < 0) return nullptr;
  }
  cache_.Pin(s);
  return &slot_views_[static_cast<size_t>(s)];
}

void StreamingWeights::ReleaseExperts(int) {
  // Never unpin (or later reuse) a slot a read is still writing: routed reads are collected;
  // guesses still loading stay pinned.
  std::vector<uint64_t> routed;
  for (const auto& [key, r] : in_flight_) {
    if (r.kind == ReadKind::kRouted) routed.push_back(key);
  }
  for (uint64_t key : routed) Bind(key, batch_->Take(in_flight_.at(key).ticket, &io_wait_));
  cache_.UnpinAll();
  for (const auto& [key, r] : in_flight_) cache_.Pin(r.slot);
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
                        io_wait_,       stats_.prefetches,  stats_.prefetch_used};
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
