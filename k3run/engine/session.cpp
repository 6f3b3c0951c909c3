// The Session API (see session.h): opening, planning, sequences and passes.
#include "k3run/engine/session.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "common/hash.h"
#include "common/reserved_floats.h"
#include "common/sysinfo.h"
#include "k3run/kernels/matmul.h"

namespace k3::run {

// ---- Sequence ----

Sequence::Sequence(State state, int64_t capacity, Sampler sampler)
    : state_(std::move(state)), capacity_(capacity), sampler_(std::move(sampler)) {}

void Sequence::Reset() {
  state_.Reset();
  tokens_.clear();
  pending_ids_.clear();
  pending_ = 0;
  pending_tentative_ = false;
  constraint_.reset();
}

// ---- Opening ----

namespace {

// Reads a tokenizer file that k3.json lists as a region and checks its XXH3-128 first; these
// bytes are the ones parsed.
Result<std::optional<std::string>> ReadCheckedRegion(Env* env, const prepared::PreparedDir& p,
                                                     const std::string& name) {
  const prepared::Region* r = p.manifest.FindRegion(name);
  if (r == nullptr) return std::optional<std::string>();
  const std::string path = JoinPath(p.dir, r->file);
  K3_ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, path));
  if (text.size() != r->length) {
    return Status::Invalid(path + ": " + std::to_string(text.size()) + " bytes, k3.json says " +
                           std::to_string(r->length));
  }
  const Hash128 got = Xxh3_128(text.data(), text.size());
  if (!(got == r->xxh3_128)) {
    return Status::Integrity(path + ": XXH3-128 " + got.Hex() + " differs from k3.json's " +
                             r->xxh3_128.Hex() + " (the file was altered; re-run k3prep pack)");
  }
  return std::optional<std::string>(std::move(text));
}

}  // namespace

Result<std::optional<tok::Tokenizer>> LoadPreparedTokenizer(Env* env,
                                                            const prepared::PreparedDir& p) {
  const std::string model_name = "tokenizer/tiktoken.model";
  const std::string config_name = "tokenizer/tokenizer_config.json";
  K3_ASSIGN_OR_RETURN(std::optional<std::string> model, ReadCheckedRegion(env, p, model_name));
  K3_ASSIGN_OR_RETURN(std::optional<std::string> config, ReadCheckedRegion(env, p, config_name));
  if (!model || !config) return std::optional<tok::Tokenizer>();
  const std::string model_path = JoinPath(p.dir, model_name);
  const std::string config_path = JoinPath(p.dir, config_name);
  K3_ASSIGN_OR_RETURN(tiktoken::Vocab vocab, tiktoken::ParseTiktokenModel(*model, model_path));
  K3_ASSIGN_OR_RETURN(tiktoken::TokenizerConfig parsed,
                      tiktoken::ParseTokenizerConfig(*config, config_path));
  K3_ASSIGN_OR_RETURN(tok::Tokenizer t,
                      tok::Tokenizer::FromParts(std::move(vocab), std::move(parsed),
                                                p.manifest.config.vocab,
                                                model_path + " + " + config_path));
  return std::optional<tok::Tokenizer>(std::move(t));
}

Result<std::unique_ptr<Engine>> Engine::Open(Env* env, const std::string& dir,
                                             const std::string& model_dir) {
  prepared::OpenOptions open;
  open.model_dir = model_dir;
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(env, dir, open);
  if (!p.ok() && p.status().code() == Code::kIntegrity) {
    // A manifest that fails its sum is untrusted input (DESIGN.md §5): exit 2.
    return Status::Invalid("untrusted manifest: " + p.status().message() +
                           " (run k3verify prepared, or re-run k3prep pack)");
  }
  K3_RETURN_IF_ERROR(p.status());
  std::unique_ptr<Engine> e(new Engine());
  e->env_ = env;
  e->prepared_ = std::make_unique<prepared::PreparedDir>(std::move(p).value());
  e->config_ = e->prepared_->manifest.config;
  e->layers_ = e->config_.n_layers;
  K3_ASSIGN_OR_RETURN(e->tokenizer_, LoadPreparedTokenizer(env, *e->prepared_));
  return e;
}

std::unique_ptr<Engine> Engine::ForPrepared(prepared::PreparedDir prepared) {
  std::unique_ptr<Engine> e(new Engine());
  e->env_ = Env::Default();
  e->prepared_ = std::make_unique<prepared::PreparedDir>(std::move(prepared));
  e->config_ = e->prepared_->manifest.config;
  e->layers_ = e->config_.n_layers;
  return e;
}

std::unique_ptr<Engine> Engine::WithSource(const ModelConfig& c, WeightSource* source,
                                           int layers, int64_t positions) {
  std::unique_ptr<Engine> e(new Engine());
  e->config_ = c;
  e->layers_ = layers == 0 ? c.n_layers : layers;
  e->options_.positions = positions;
  e->plan_.positions = positions;
  e->plan_.chunk = std::max<int64_t>(positions, 1);  // no plan: any input in one pass
  e->max_tentative_rows_ = std::max<int64_t>(positions, 1);
  e->source_ = source;
  e->model_ = std::make_unique<Model>(c, source, e->layers_);
  e->model_->SetInterruptFlag(&e->interrupted_);
  return e;
}

// ---- The memory plan and the weights ----

namespace {

// The rows per pass: --chunk as given, else the largest whose scratch fits `room`, never more
// than the caller feeds at once nor kDefaultMaxChunk.
int64_t ChooseChunk(const ModelConfig& c, const PlanOptions& o, uint64_t room, int threads) {
  const int64_t cap = std::max<int64_t>(o.pass_rows, 1);
  if (o.chunk > 0) return std::min(o.chunk, cap);
  // Not even one row fitting is left to CheckMemory, whose refusal names every number.
  return std::max<int64_t>(
      1, LargestChunk(c, room, o.positions, threads, std::min(cap, kDefaultMaxChunk)));
}

std::string ReservedWhat(const MemoryPlan& fixed, int64_t chunk, int64_t sequences = 1) {
  return "latent caches for " + std::to_string(fixed.positions) + " positions + KDA states" +
         (sequences > 1 ? " of " + std::to_string(sequences) + " sequences" : std::string()) +
         (fixed.record_bytes > 0 ? " + speculation records" : std::string()) + " + scratch for " +
         std::to_string(chunk) + "-row passes";
}

}  // namespace

Status Engine::Plan(const PlanOptions& o) {
  const ModelConfig& c = config_;
  layers_ = o.layers == 0 ? c.n_layers : o.layers;
  if (layers_ < 1 || layers_ > c.n_layers) {
    return Status::Invalid("--layers " + std::to_string(o.layers) + ": must be in [1, " +
                           std::to_string(c.n_layers) + "] (the model has " +
                           std::to_string(c.n_layers) + " layers)");
  }
  if (o.chunk < 0) return Status::Invalid("--chunk " + std::to_string(o.chunk) + ": must be >= 1");
  options_ = o;
  K3_ASSIGN_OR_RETURN(uint64_t avail, o.mem_available ? o.mem_available() : MemAvailableBytes());
  mem_available_ = avail;
  const int threads = kernels::Threads();
  if (o.sequences < 0 || o.spec_rows < 0) {
    return Status::Invalid("--max-seqs and --spec must be >= 0");
  }
  // Caches, states and records first: they do not depend on the weights or the chunk. With
  // sequences = 0, one sequence's share decides how many fit once the weights' minimum is known.
  int64_t seqs = std::max<int64_t>(o.sequences, 1);
  const MemoryPlan one = PlanMemory(c, layers_, o.positions, 0, 1, threads, 1, o.spec_rows);
  const uint64_t per_seq = one.kv_cache_bytes + one.state_bytes + one.record_bytes;
  auto held_for = [&](int64_t n) {
    const MemoryPlan f = PlanMemory(c, layers_, o.positions, 0, 1, threads, n, o.spec_rows);
    return f.kv_cache_bytes + f.state_bytes + f.record_bytes;
  };
  auto fitting = [&](uint64_t limit, uint64_t weights_min) {
    const uint64_t fixed1 = weights_min + ScratchBytes(c, 1, o.positions, threads);
    const uint64_t room = limit > fixed1 ? limit - fixed1 : 0;
    const uint64_t n = per_seq > 0 ? room / per_seq : uint64_t(kDefaultMaxSeqs);
    return std::clamp<int64_t>(static_cast<int64_t>(std::min<uint64_t>(n, kDefaultMaxSeqs)), 1,
                               kDefaultMaxSeqs);
  };
  uint64_t held = held_for(seqs) + o.vision_bytes;
  uint64_t weights_bytes = 0;
  int64_t chunk = 1;
  if (o.budget.any()) {
    // A first plan with one-row scratch gives the weights' minimum; the chunk takes the room a
    // total budget leaves above it (or, with weight budgets only, MemAvailable's), and the
    // final plan gives the weights what the chunk leaves.
    BudgetRequest req = o.budget;
    req.reserved = held + ScratchBytes(c, 1, o.positions, threads);
    req.reserved_what = ReservedWhat(one, 1);
    K3_ASSIGN_OR_RETURN(StreamingPlan first, PlanStreaming(*prepared_, req, avail));
    const uint64_t limit = first.total > 0 ? first.total : avail;
    const uint64_t weights_min = first.total > 0 ? first.trunk_min + first.cache_min : first.bytes();
    if (o.sequences == 0) {
      seqs = fitting(limit, weights_min + o.vision_bytes);
      held = held_for(seqs) + o.vision_bytes;
    }
    const uint64_t room = limit > weights_min + held ? limit - weights_min - held : 0;
    chunk = ChooseChunk(c, o, room, threads);
    req.reserved = held + ScratchBytes(c, chunk, o.positions, threads);
    req.reserved_what = ReservedWhat(one, chunk, seqs);
    K3_ASSIGN_OR_RETURN(StreamingPlan sp, PlanStreaming(*prepared_, req, avail));
    streaming_plan_ = std::move(sp);
    weights_bytes = streaming_plan_->bytes();
  }
  // --preload is refused before any weight is loaded, probed or allocated.
  if (o.preload && !streaming_plan_) {
    return Status::Invalid("--preload needs a memory budget that holds every expert (e.g. "
                           "--preset max or --budget-gb): without one experts load on first use");
  }
  if (o.preload) K3_RETURN_IF_ERROR(CheckPreloadFits(*streaming_plan_, *prepared_));
  if (!streaming_plan_) {
    RamWeightsOptions wopt;
    wopt.verify_reads = o.verify_reads;
    K3_ASSIGN_OR_RETURN(std::unique_ptr<RamWeights> ram,
                        RamWeights::Open(env_, prepared_.get(), wopt));
    weights_bytes = ram->PlannedResidentBytes();
    owned_source_ = std::move(ram);
    if (o.sequences == 0) {
      seqs = fitting(avail, weights_bytes + o.vision_bytes);
      held = held_for(seqs) + o.vision_bytes;
    }
    const uint64_t room = avail > weights_bytes + held ? avail - weights_bytes - held : 0;
    chunk = ChooseChunk(c, o, room, threads);
  }
  plan_ = PlanMemory(c, layers_, o.positions, weights_bytes, chunk, threads, seqs, o.spec_rows);
  plan_.vision_bytes = o.vision_bytes;
  max_tentative_rows_ = o.spec_rows + 1;
  if (streaming_plan_) plan_.budget = streaming_plan_->total;
  if (streaming_plan_ && events_) {
    events_(EngineEvent{EngineEvent::Kind::kStreamingPlan, streaming_plan_->Describe(), nullptr});
  }
  if (Status s = CheckMemory(plan_, avail); !s.ok()) {
    if (!streaming_plan_) return s;
    return Status::Invalid(s.message() + "; or lower --budget-gb / --preset");
  }
  return Status::Ok();
}

Status Engine::LoadWeights(CacheTraceWriter* trace) {
  if (streaming_plan_) {
    StreamingOptions sopt;
    sopt.verify_reads = options_.verify_reads;
    sopt.walk_layers = layers_;
    sopt.preload_experts = options_.preload;
    sopt.progress = options_.progress;
    sopt.trace = trace;
    sopt.prefetch_experts = options_.prefetch_experts;
    K3_ASSIGN_OR_RETURN(std::unique_ptr<StreamingWeights> sw,
                        StreamingWeights::Open(env_, prepared_.get(), *streaming_plan_, sopt));
    streaming_ = sw.get();
    owned_source_ = std::move(sw);
  }
  if (owned_source_ == nullptr) return Status::Invalid("LoadWeights before Plan");
  source_ = owned_source_.get();
  model_ = std::make_unique<Model>(config_, source_, layers_);
  model_->SetInterruptFlag(&interrupted_);
  model_->SetRemoteExperts(remote_);
  return Status::Ok();
}

void Engine::RestrictExperts(const std::function<bool(int layer, int expert)>& keep) {
  prepared::ExpertsIndex& idx = prepared_->experts;
  for (uint32_t L = idx.first_moe_layer; L < idx.n_layers; ++L) {
    for (uint32_t e = 0; e < idx.n_experts; ++e) {
      if (!keep(static_cast<int>(L), static_cast<int>(e))) {
        idx.records[idx.RecordIndex(L, e)] = prepared::MakeAbsentRecord();
      }
    }
  }
}

void Engine::SetRemoteExperts(RemoteExperts* remote) {
  remote_ = remote;
  if (model_) model_->SetRemoteExperts(remote);
}

std::vector<ExpertFailure> Engine::Failures() const {
  std::vector<ExpertFailure> all;
  if (source_ != nullptr) all = source_->Failures();
  if (remote_ != nullptr) {
    all.insert(all.end(), remote_->Failures().begin(), remote_->Failures().end());
  }
  return all;
}

// ---- Sequences and passes ----

std::unique_ptr<Sequence> Engine::NewSequence(const SamplerOptions& sampling, uint64_t seed,
                                              uint64_t stream) {
  const int64_t capacity = std::max<int64_t>(options_.positions, 1);
  return std::unique_ptr<Sequence>(new Sequence(State::Make(config_, layers_, capacity), capacity,
                                                Sampler(sampling, seed, stream)));
}

Result<StepResult> Engine::Step(std::span<StepInput> batch) {
  if (model_ == nullptr) return Status::Invalid("Step before LoadWeights");
  if (interrupted_.load(std::memory_order_relaxed)) {
    return Status::Io("interrupted: the engine is shutting down; no more passes");
  }
  std::vector<Segment> segments;
  for (const StepInput& in : batch) {
    if (in.seq == nullptr || in.ids.empty()) {
      return Status::Invalid("Step: every input needs a sequence and at least one id");
    }
    if (in.seq->pending_ > 0) {
      return Status::Invalid("Step: a sequence has " + std::to_string(in.seq->pending_) +
                             " rows of its last step not committed (Commit first)");
    }
    for (const Segment& s : segments) {
      if (s.state == &in.seq->state_) return Status::Invalid("Step: a sequence given twice");
    }
    if (in.tentative && static_cast<int64_t>(in.ids.size()) > max_tentative_rows_) {
      return Status::Invalid("Step: " + std::to_string(in.ids.size()) + " tentative rows; the "
                             "plan keeps records for " + std::to_string(max_tentative_rows_) +
                             " (--spec N verifies N + 1 rows)");
    }
    segments.push_back(Segment{in.ids.data(), static_cast<int64_t>(in.ids.size()),
                               &in.seq->state_, in.logits, in.tentative});
  }
  StepResult r;
  r.pass = passes_++;
  int64_t rows = 0;
  for (const StepInput& in : batch) {
    r.first_row.push_back(rows);
    const auto n = static_cast<int64_t>(in.ids.size());
    rows += in.logits == Logits::kAll ? n : in.logits == Logits::kLast ? 1 : 0;
  }
  r.logits.resize(static_cast<size_t>(rows * config_.vocab));
  source_->SetStep(r.pass);
  const ReadCounters before = source_->Counters();
  const SourceCounters source_before = source_->Source();
  const auto t0 = std::chrono::steady_clock::now();
  const PassTimes times0 = model_->times();
  const int64_t routed0 = model_->experts_routed();
  K3_RETURN_IF_ERROR(model_->Pass(segments, r.logits.data()));
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.times = model_->times() - times0;
  r.experts_routed = model_->experts_routed() - routed0;
  r.bytes = source_->Counters() - before;
  r.source = source_->Source() - source_before;
  for (StepInput& in : batch) {
    in.seq->pending_ids_ = in.ids;
    in.seq->pending_ = static_cast<int64_t>(in.ids.size());
    in.seq->pending_tentative_ = in.tentative;
  }
  if (events_) events_(EngineEvent{EngineEvent::Kind::kPass, "", &r});
  return r;
}

Result<StepResult> Engine::Feed(Sequence* seq, std::span<const int32_t> ids, Logits logits) {
  if (ids.empty()) return Status::Invalid("Feed: no ids to feed");
  if (logits == Logits::kAll) return Status::Invalid("Feed: kAll logits are Step's job");
  const auto total = static_cast<int64_t>(ids.size());
  if (total > seq->capacity_ - seq->length()) {
    return Status::Invalid("the sequence holds " + std::to_string(seq->length()) + " of its " +
                           std::to_string(seq->capacity_) + " positions; " +
                           std::to_string(total) + " more do not fit (reserve more with --ctx, "
                           "or start a new sequence)");
  }
  const int64_t chunk = std::max<int64_t>(plan_.chunk, 1);
  const auto t0 = std::chrono::steady_clock::now();
  StepResult sum;
  for (int64_t done = 0; done < total;) {
    const int64_t n = std::min(chunk, total - done);
    const bool last = done + n == total;
    StepInput in{seq, std::vector<int32_t>(ids.begin() + done, ids.begin() + done + n),
                 last ? logits : Logits::kNone};
    K3_ASSIGN_OR_RETURN(StepResult r, Step(std::span<StepInput>(&in, 1)));
    K3_RETURN_IF_ERROR(Commit(seq, n));
    done += n;
    r.seconds += sum.seconds;
    r.times += sum.times;
    r.experts_routed += sum.experts_routed;
    r.bytes += sum.bytes;
    r.source += sum.source;
    sum = std::move(r);
    if (events_) {
      EngineEvent e{EngineEvent::Kind::kPrefill, "", nullptr};
      e.done = done;
      e.total = total;
      e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      events_(e);
    }
  }
  return sum;
}

Status Engine::Commit(Sequence* seq, int64_t rows) {
  if (rows < 0 || rows > seq->pending_) {
    return Status::Invalid("Commit: " + std::to_string(rows) + " rows, the last step appended " +
                           std::to_string(seq->pending_));
  }
  if (seq->pending_tentative_) {
    model_->Keep(&seq->state_, seq->pending_, rows);
  } else if (rows < seq->pending_) {
    return Status::Invalid("Commit: " + std::to_string(rows) + " of " +
                           std::to_string(seq->pending_) + " rows: only rows stepped as "
                           "tentative can be discarded (they alone keep the KDA records)");
  }
  seq->tokens_.insert(seq->tokens_.end(), seq->pending_ids_.begin(),
                      seq->pending_ids_.begin() + rows);
  seq->pending_ids_.clear();
  seq->pending_ = 0;
  seq->pending_tentative_ = false;
  return Status::Ok();
}

// ---- Snapshots (the prompt cache) ----

uint64_t SequenceSnapshot::bytes() const {
  uint64_t n = tokens.size() * sizeof(int32_t);
  for (const ops::KdaState& k : state.kda) {
    n += k.Floats() * sizeof(float);
  }
  for (const ops::MlaCache& m : state.mla) n += m.data.size() * sizeof(float);
  // Image rows (shared with the sequence and other snapshots: counted in full here, so the
  // prompt cache's budget is never exceeded).
  for (const MediaSpan& m : state.media) n += m.data ? m.data->size() * sizeof(float) : 0;
  return n;
}

SequenceSnapshot Engine::Snapshot(const Sequence& seq) const {
  SequenceSnapshot snap;
  snap.tokens = seq.tokens_;
  snap.state.kda = seq.state_.kda;
  snap.state.pos = seq.state_.pos;
  snap.state.invalid = seq.state_.invalid;
  snap.state.media = seq.state_.media;  // shared rows: the cache compares their ids
  snap.state.mla.resize(seq.state_.mla.size());
  for (size_t L = 0; L < seq.state_.mla.size(); ++L) {
    const ops::MlaCache& from = seq.state_.mla[L];
    ops::MlaCache& to = snap.state.mla[L];
    to.capacity = to.len = from.len;
    to.latent = from.latent;
    to.width = from.width;
    to.data = ReservedFloats(static_cast<size_t>(from.len * from.width));
    std::copy(from.data.begin(), from.data.begin() + from.len * from.width, to.data.data());
  }
  return snap;
}

Status Engine::Restore(const SequenceSnapshot& snap, Sequence* seq) const {
  const auto n = static_cast<int64_t>(snap.tokens.size());
  if (seq->length() != 0 || seq->pending_ != 0) {
    return Status::Invalid("Restore: the sequence is not empty");
  }
  if (n > seq->capacity_ || snap.state.mla.size() != seq->state_.mla.size() ||
      snap.state.kda.size() != seq->state_.kda.size()) {
    return Status::Invalid("Restore: the snapshot (" + std::to_string(n) +
                           " positions) does not fit this sequence");
  }
  for (size_t L = 0; L < snap.state.mla.size(); ++L) {
    const ops::MlaCache& from = snap.state.mla[L];
    ops::MlaCache& to = seq->state_.mla[L];
    std::copy(from.data.begin(), from.data.end(), to.data.data());
    to.len = from.len;
  }
  for (size_t L = 0; L < snap.state.kda.size(); ++L) {
    seq->state_.kda[L] = snap.state.kda[L];  // the same engine: the same sizes
  }
  seq->state_.pos = snap.state.pos;
  seq->state_.invalid = snap.state.invalid;
  seq->state_.media = snap.state.media;
  seq->tokens_ = snap.tokens;
  return Status::Ok();
}

Status Engine::AttachMedia(Sequence* seq, std::vector<MediaSpan> spans) const {
  const int32_t pad = static_cast<int32_t>(config_.media_placeholder_token_id);
  const auto E = static_cast<size_t>(config_.hidden);
  for (const MediaSpan& s : spans) {
    const std::string where = "image rows at positions " + std::to_string(s.first) + ".." +
                              std::to_string(s.first + s.rows - 1);
    if (pad < 0) return Status::Invalid(where + ": config.json has no media_placeholder_token_id");
    if (s.rows <= 0 || s.first < seq->length() || s.first + s.rows > seq->capacity_) {
      return Status::Invalid(where + ": not inside the positions still to feed (" +
                             std::to_string(seq->length()) + ".." +
                             std::to_string(seq->capacity_ - 1) + ")");
    }
    if (s.data == nullptr || s.data->size() != static_cast<size_t>(s.rows) * E) {
      return Status::Invalid(where + ": rows are not " + std::to_string(s.rows) + " x " +
                             std::to_string(E) + " floats");
    }
    if (!seq->state_.media.empty()) {
      const MediaSpan& last = seq->state_.media.back();
      if (s.first < last.first + last.rows) return Status::Invalid(where + ": overlaps an image");
    }
    seq->state_.media.push_back(s);
  }
  return Status::Ok();
}

}  // namespace k3::run
