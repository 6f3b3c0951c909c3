// The multi-sequence scheduler (see scheduler.h): a FIFO queue, max_seqs slots, one pass per
// RunPass carrying a decode row of every generating slot and prompt rows of prefilling ones.
//
// Invariants (engine thread): a busy slot's sequence holds exactly its request's prompt[0, fed)
// followed by every generated token but the last (`next`, fed by the slot's next decode row);
// nothing is pending between passes. A slot's `draft` is empty outside PlanPass → RunOnePass.
// A request id is in `running` from its admission until its on_done; ids are never reused, so a
// stale cancel mark never hits another request.
#include "k3run/engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <optional>
#include <set>
#include <utility>

#include "k3run/engine/generate.h"
#include "k3run/engine/prompt_cache.h"
#include "k3run/engine/token_choice.h"

namespace k3::run {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kLength: return "length";
    case FinishReason::kStopId: return "stop_id";
    case FinishReason::kStopped: return "stopped";
    case FinishReason::kContext: return "context";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "unknown";
}

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Request::media: inside the prompt, ascending, not overlapping, `hidden` floats a row.
Status CheckMedia(const std::vector<MediaSpan>& media, size_t prompt, int64_t hidden) {
  int64_t end = 0;
  for (const MediaSpan& m : media) {
    const std::string where = "request: image rows at prompt positions " +
                              std::to_string(m.first) + ".." + std::to_string(m.first + m.rows - 1);
    if (m.rows <= 0 || m.first < end || m.first + m.rows > static_cast<int64_t>(prompt)) {
      return Status::Invalid(where + ": not inside the prompt of " + std::to_string(prompt) +
                             " ids after the previous image");
    }
    if (m.data == nullptr ||
        m.data->size() != static_cast<size_t>(m.rows) * static_cast<size_t>(hidden)) {
      return Status::Invalid(where + ": rows are not " + std::to_string(m.rows) + " x " +
                             std::to_string(hidden) + " floats");
    }
    end = m.first + m.rows;
  }
  return Status::Ok();
}

Status RunInvalid(int64_t id) {
  return Status::Unreliable("RUN INVALID: request " + std::to_string(id) +
                            ": its rows were routed to an expert that could not be read; its "
                            "output is not the model's");
}

// The q-quantile of `v` (nearest rank; reorders v).
double Quantile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const auto k = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size()))) - 1;
  const size_t i = std::min(k, v.size() - 1);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
  return v[i];
}

struct Waiting {
  int64_t id = 0;
  Request req;
  Clock::time_point submitted;
};

// One sequence, allocated at the slot's first request and Reset between requests (its KDA
// states and latent caches are the large allocations).
struct Slot {
  std::unique_ptr<Sequence> seq;
  bool busy = false;
  int64_t id = 0;
  int64_t order = 0;          // admission order: prompt rows go to the oldest request first
  Request req;
  RequestResult result;
  Clock::time_point submitted;
  std::vector<int32_t> all;   // prompt + chosen tokens: what the sampler's penalties look at
  int64_t fed = 0;            // prompt ids the sequence holds (restored from the cache or fed)
  int32_t next = -1;          // the last chosen token, not yet fed
  int64_t rows = 0;           // rows in the pass being built
  std::optional<DraftPolicy> policy;  // a speculating request (greedy, no constraint)
  std::vector<int32_t> draft;         // this pass's draft, after `next` (rows = 1 + its size)
  int64_t prompt_len() const { return static_cast<int64_t>(req.prompt.size()); }
  bool generating() const { return fed == prompt_len(); }
};

}  // namespace

struct Scheduler::Impl {
  Impl(Engine* e, const SchedulerOptions& opt)
      : engine(e), o(opt), cache(opt.prompt_cache_bytes) {
    pass_rows = std::max<int64_t>(o.pass_rows > 0 ? o.pass_rows : engine->chunk(), 1);
    slots.resize(static_cast<size_t>(std::max<int64_t>(o.max_seqs, 1)));
    spec = std::clamp<int64_t>(o.spec, 0, engine->memory_plan().spec_rows);
    if (spec > 0) cost = PassCost::FromEngine(*engine);
  }

  Engine* engine;
  SchedulerOptions o;
  int64_t pass_rows = 1;
  int64_t spec = 0;  // o.spec within the plan's records
  PassCost cost;     // DraftPolicy's prior

  // Guarded by mu. Callbacks never run with mu held (they may Submit or Cancel).
  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<Waiting> queue;
  std::vector<Waiting> cancelled_waiting;  // Cancel()ed before admission: on_done next RunPass
  std::set<int64_t> running;               // admitted, on_done not yet called
  std::set<int64_t> cancel_running;        // running ids to end at the next RunPass
  bool woken = false;
  int64_t next_id = 1;
  SchedulerStats stats;
  std::vector<double> idle_window;  // the last kIdleWindow gaps, a ring from idle_next
  size_t idle_next = 0;

  // Engine thread only.
  std::vector<Slot> slots;
  PromptCache cache;
  int64_t admitted = 0;
  size_t decode_cursor = 0;  // round robin when decode rows outnumber the pass (see PlanPass)
  // The end of the last pass while work remained; reset when a RunPass finds nothing to run or
  // WaitForWork blocks (waiting for a request is not idle time between passes).
  std::optional<Clock::time_point> last_pass_end;

  void RecordIdle(double seconds);
  bool FinishCancelled();
  void Admit();
  void Start(Slot* slot, Waiting w);
  Status AttachFrom(Slot* slot, size_t restored);
  std::vector<Slot*> PlanPass();
  void Draft(Slot* slot, int64_t space);
  void RunOnePass(const std::vector<Slot*>& carried);
  void Choose(Slot* slot, const float* logits);
  void Verify(Slot* slot, const float* logits);
  std::optional<FinishReason> Take(Slot* slot, int32_t token, const float* logits, int64_t held);
  void Finish(Slot* slot, FinishReason reason, Status status);
  void EndAll();
};

// ---- Ending requests ----

void Scheduler::Impl::Finish(Slot* slot, FinishReason reason, Status status) {
  RequestResult r = std::move(slot->result);
  r.reason = reason;
  r.status = std::move(status);
  r.seconds = Since(slot->submitted);
  Sequence* seq = slot->seq.get();
  // Only a sequence that is exactly the model's tokens is worth continuing from: never after an
  // error, a cancellation (rows may be missing) or an unreadable expert.
  if (cache.budget() > 0 && (reason == FinishReason::kLength || reason == FinishReason::kStopId ||
                             reason == FinishReason::kStopped || reason == FinishReason::kContext) &&
      !seq->invalid() && seq->pending() == 0 && seq->length() > 0) {
    cache.Insert(engine->Snapshot(*seq));
  }
  seq->Reset();
  Request req = std::move(slot->req);
  slot->busy = false;
  slot->req = Request();
  slot->all.clear();
  slot->draft.clear();
  slot->policy.reset();
  {
    std::lock_guard<std::mutex> l(mu);
    running.erase(r.id);
    ++stats.finished;
    stats.prompt_cache_bytes = cache.bytes();
  }
  if (req.on_done) req.on_done(r);
}

bool Scheduler::Impl::FinishCancelled() {
  std::vector<Waiting> waiting;
  std::set<int64_t> ids;
  {
    std::lock_guard<std::mutex> l(mu);
    waiting.swap(cancelled_waiting);
    ids.swap(cancel_running);
    stats.finished += static_cast<int64_t>(waiting.size());
  }
  for (Waiting& w : waiting) {
    RequestResult r;
    r.id = w.id;
    r.reason = FinishReason::kCancelled;
    r.prompt_tokens = static_cast<int64_t>(w.req.prompt.size());
    r.queued_seconds = r.seconds = Since(w.submitted);
    if (w.req.on_done) w.req.on_done(r);
  }
  bool ended = !waiting.empty();
  for (Slot& s : slots) {
    if (s.busy && ids.count(s.id) > 0) {
      Finish(&s, FinishReason::kCancelled, Status::Ok());
      ended = true;
    }
  }
  return ended;
}

void Scheduler::Impl::EndAll() {
  {
    std::lock_guard<std::mutex> l(mu);
    for (Waiting& w : queue) cancelled_waiting.push_back(std::move(w));
    queue.clear();
    cancel_running = running;
  }
  FinishCancelled();
}

// ---- Admission ----

void Scheduler::Impl::Start(Slot* slot, Waiting w) {
  slot->busy = true;
  slot->id = w.id;
  slot->order = admitted++;
  slot->submitted = w.submitted;
  slot->req = std::move(w.req);
  slot->result = RequestResult();
  slot->result.id = slot->id;
  slot->result.prompt_tokens = slot->prompt_len();
  slot->result.queued_seconds = Since(slot->submitted);
  // The sampler as Generate's sequence would have it: this request's options and seed, turn 0.
  if (!slot->seq) {
    slot->seq = engine->NewSequence(slot->req.sampling, slot->req.seed, 0);
  } else {
    slot->seq->Reset();
    slot->seq->sampler() = Sampler(slot->req.sampling, slot->req.seed, 0);
  }
  slot->seq->constraint() = slot->req.constraint;  // it starts at the first generated token
  slot->all = slot->req.prompt;
  slot->fed = 0;
  slot->next = -1;
  slot->draft.clear();
  slot->policy.reset();
  // Speculation for the requests Generate speculates for: greedy (penalties allowed: still an
  // argmax) and unconstrained. The others decode a row per pass, exactly as without --spec.
  if (spec > 0 && !slot->req.sampling.sampling() && slot->req.constraint == nullptr) {
    slot->policy.emplace(spec, cost, !o.spec_fixed);
  }
  if (slot->req.encode_media) {
    const MediaLookup held = [this](const Hash128& input) { return cache.FindMedia(input); };
    Result<std::vector<MediaSpan>> spans = slot->req.encode_media(held);
    Status s = spans.status();
    if (s.ok()) {
      slot->req.media = std::move(spans).value();
      s = CheckMedia(slot->req.media, slot->req.prompt.size(), engine->config().hidden);
    }
    if (!s.ok()) return Finish(slot, FinishReason::kError, s);
  }
  const SequenceSnapshot* snap =
      cache.budget() > 0 ? cache.Longest(slot->req.prompt, slot->req.media) : nullptr;
  if (snap != nullptr) {
    if (engine->Restore(*snap, slot->seq.get()).ok() && AttachFrom(slot, snap->tokens.size()).ok()) {
      slot->fed = static_cast<int64_t>(snap->tokens.size());
      std::lock_guard<std::mutex> l(mu);
      ++stats.prompt_cache_hits;
      stats.prompt_cache_tokens += slot->fed;
      return;
    }
    slot->seq->Reset();  // a cold start gives the same bits
    slot->seq->constraint() = slot->req.constraint;
  }
  // Submit checked the spans, so only an engine refusal lands here, before anything is fed.
  if (Status s = AttachFrom(slot, 0); !s.ok()) Finish(slot, FinishReason::kError, s);
}

// Binds the request's image spans at or past `restored` (a restored snapshot holds the ones
// before it: the cache compared them).
Status Scheduler::Impl::AttachFrom(Slot* slot, size_t restored) {
  std::vector<MediaSpan> rest;
  for (const MediaSpan& m : slot->req.media) {
    if (m.first >= static_cast<int64_t>(restored)) rest.push_back(m);
  }
  if (rest.empty()) return Status::Ok();
  return engine->AttachMedia(slot->seq.get(), std::move(rest));
}

void Scheduler::Impl::Admit() {
  for (Slot& s : slots) {
    if (s.busy) continue;
    Waiting w;
    {
      std::lock_guard<std::mutex> l(mu);
      if (queue.empty()) return;
      w = std::move(queue.front());
      queue.pop_front();
      running.insert(w.id);
    }
    Start(&s, std::move(w));
  }
}

// ---- Passes ----

// Decode rows first (one per generating slot), then prompt rows, oldest request first, up to
// pass_rows. When generating slots alone would fill the pass and a prompt waits, decode rows
// leave it one row (prefill always advances) and are taken round robin (no slot starves).
std::vector<Slot*> Scheduler::Impl::PlanPass() {
  std::vector<Slot*> prefilling;
  int64_t generating = 0;
  for (Slot& s : slots) {
    s.rows = 0;
    s.draft.clear();
    if (!s.busy) continue;
    if (s.generating()) {
      ++generating;
    } else {
      prefilling.push_back(&s);
    }
  }
  std::sort(prefilling.begin(), prefilling.end(),
            [](const Slot* a, const Slot* b) { return a->order < b->order; });
  const int64_t decode_cap = prefilling.empty() ? pass_rows : pass_rows - 1;
  std::vector<Slot*> carried;
  int64_t rows = 0;
  const size_t n = slots.size();
  const size_t start = generating > decode_cap ? decode_cursor % n : 0;
  for (size_t i = 0; i < n && rows < decode_cap; ++i) {
    Slot& s = slots[(start + i) % n];
    if (!s.busy || !s.generating()) continue;
    s.rows = 1;
    ++rows;
    carried.push_back(&s);
    decode_cursor = (start + i + 1) % n;
  }
  // Drafts take what the decode rows leave of their share, slot by slot.
  for (Slot* s : carried) {
    if (!s->policy) continue;
    Draft(s, decode_cap - rows);
    rows += static_cast<int64_t>(s->draft.size());
    s->rows += static_cast<int64_t>(s->draft.size());
  }
  for (Slot* s : prefilling) {
    const int64_t take = std::min(s->prompt_len() - s->fed, pass_rows - rows);
    if (take <= 0) break;
    s->rows = take;
    rows += take;
    carried.push_back(s);
  }
  return carried;
}

// A speculating slot's draft for the next pass, as Generate's decode step drafts: never past
// the tokens asked for, the sequence's positions, or the `space` left in the pass.
void Scheduler::Impl::Draft(Slot* slot, int64_t space) {
  const auto generated = static_cast<int64_t>(slot->result.generated.size());
  const int64_t left = slot->req.max_tokens - generated;
  const int64_t room = slot->seq->capacity() - slot->seq->length() - 1;
  const int64_t want = std::min({slot->policy->Length(), left - 1, room, space});
  if (want <= 0) return;
  slot->draft = slot->req.drafter ? slot->req.drafter(slot->all, generated, want)
                                  : PromptLookupDraft(slot->all, want);
  if (static_cast<int64_t>(slot->draft.size()) > want) slot->draft.resize(static_cast<size_t>(want));
}

// Greedy() or the request's sampler over everything so far, exactly as Generate chooses.
void Scheduler::Impl::Choose(Slot* slot, const float* logits) {
  const int64_t V = engine->config().vocab;
  Result<int32_t> chosen = ChooseToken(slot->seq.get(), logits, V, slot->all);
  if (!chosen.ok()) {
    Finish(slot, FinishReason::kError, chosen.status());
    return;
  }
  const int32_t token = chosen.value();
  if (std::optional<FinishReason> end = Take(slot, token, logits, slot->seq->length())) {
    Finish(slot, *end, Status::Ok());
  } else {
    slot->next = token;
  }
}

// A decode row that carried a draft (its logits [1 + draft][vocab]): row i's token is chosen as
// plain decoding would choose it, and verification goes on while it equals draft[i] (Generate's
// rule); Commit keeps the rows whose tokens were taken and drops the rest of this sequence's.
void Scheduler::Impl::Verify(Slot* slot, const float* logits) {
  const int64_t V = engine->config().vocab;
  const auto k = static_cast<int64_t>(slot->draft.size());
  const int64_t held = slot->seq->length();  // committed before this pass
  int64_t taken = 0;
  int32_t token = -1;
  std::optional<FinishReason> end;
  for (int64_t i = 0;; ++i) {
    Result<int32_t> chosen = ChooseToken(slot->seq.get(), logits + i * V, V, slot->all);
    if (!chosen.ok()) {
      Finish(slot, FinishReason::kError, chosen.status());  // Reset drops the pending rows
      return;
    }
    token = chosen.value();
    ++taken;
    end = Take(slot, token, logits + i * V, held + taken);
    if (end || i == k || token != slot->draft[static_cast<size_t>(i)]) break;
  }
  const int64_t accepted = taken - 1;
  slot->policy->Record(k, accepted);
  slot->result.spec.drafted += k;
  slot->result.spec.accepted += accepted;
  {
    std::lock_guard<std::mutex> l(mu);
    ++stats.spec_verifications;
    stats.spec_drafted += k;
    stats.spec_accepted += accepted;
  }
  if (Status c = engine->Commit(slot->seq.get(), taken); !c.ok()) {
    Finish(slot, FinishReason::kError, c);
  } else if (end) {
    Finish(slot, *end, Status::Ok());
  } else {
    slot->next = token;
  }
}

// Records a chosen token and runs the request's callback; why the request ends here, if it does.
// `held`: the positions the sequence holds once this token's row is kept.
std::optional<FinishReason> Scheduler::Impl::Take(Slot* slot, int32_t token, const float* logits,
                                                  int64_t held) {
  slot->all.push_back(token);
  slot->result.generated.push_back(token);
  if (slot->result.generated.size() == 1) slot->result.first_token_seconds = Since(slot->submitted);
  {
    std::lock_guard<std::mutex> l(mu);
    ++stats.generated;
  }
  const bool go_on = slot->req.on_token ? slot->req.on_token(token, logits) : true;
  const std::vector<int64_t>& stops = slot->req.stop_ids;
  if (std::find(stops.begin(), stops.end(), token) != stops.end()) return FinishReason::kStopId;
  if (!go_on) return FinishReason::kStopped;
  if (static_cast<int64_t>(slot->result.generated.size()) >= slot->req.max_tokens) {
    return FinishReason::kLength;
  }
  if (held >= slot->seq->capacity()) return FinishReason::kContext;  // no position left to feed it
  return std::nullopt;
}

void Scheduler::Impl::RunOnePass(const std::vector<Slot*>& carried) {
  std::vector<StepInput> batch;
  int64_t rows = 0, prompt_rows = 0;
  for (Slot* s : carried) {
    StepInput in;
    in.seq = s->seq.get();
    if (s->generating()) {
      in.ids = {s->next};
      if (!s->draft.empty()) {
        in.ids.insert(in.ids.end(), s->draft.begin(), s->draft.end());
        in.logits = Logits::kAll;
        in.tentative = true;
      }
    } else {
      const auto from = s->req.prompt.begin() + s->fed;
      in.ids.assign(from, from + s->rows);
      in.logits = s->fed + s->rows == s->prompt_len() ? Logits::kLast : Logits::kNone;
      prompt_rows += s->rows;
    }
    rows += s->rows;
    batch.push_back(std::move(in));
  }
  if (last_pass_end) RecordIdle(Since(*last_pass_end));
  Result<StepResult> pass = engine->Step(batch);
  last_pass_end = Clock::now();
  if (!pass.ok()) {
    for (Slot* s : carried) {
      ++s->result.passes;
      Finish(s, FinishReason::kError, pass.status());
    }
    return;
  }
  int64_t generated_before = 0;
  {
    std::lock_guard<std::mutex> l(mu);
    ++stats.passes;
    stats.rows += rows;
    stats.prompt_rows += prompt_rows;
    stats.bytes_read += pass->bytes.total();
    stats.pass_seconds += pass->seconds;
    generated_before = stats.generated;
    if (prompt_rows == 0) {
      ++stats.decode_passes;
      stats.decode_rows += rows;
      stats.decode_bytes += pass->bytes.total();
      stats.decode_unused_bytes += pass->bytes.prefetch_unused;
      stats.decode_seconds += pass->seconds;
      stats.decode_io_busy_seconds += pass->source.io_busy_seconds;
      stats.decode_times += pass->times;
      stats.decode_experts_routed += pass->experts_routed;
    }
  }
  const int64_t V = engine->config().vocab;
  for (size_t k = 0; k < carried.size(); ++k) {
    Slot* s = carried[k];
    ++s->result.passes;
    if (s->policy && s->generating()) {
      ++s->result.spec.passes;
      // Only a pass of this sequence alone times what its rows cost (DraftPolicy::Observe).
      if (carried.size() == 1) s->policy->Observe(s->rows, pass->seconds);
    }
    if (!s->draft.empty()) {
      if (s->seq->invalid()) {
        Finish(s, FinishReason::kError, RunInvalid(s->id));
      } else {
        Verify(s, pass->LogitsOf(k, V));
      }
      continue;
    }
    if (Status c = engine->Commit(s->seq.get(), s->rows); !c.ok()) {
      Finish(s, FinishReason::kError, c);
      continue;
    }
    if (s->seq->invalid()) {
      Finish(s, FinishReason::kError, RunInvalid(s->id));
      continue;
    }
    if (!s->generating()) {
      s->fed += s->rows;
      s->result.prompt_fed += s->rows;
      if (s->req.on_prefill) s->req.on_prefill(s->fed, s->prompt_len());
      if (!s->generating()) continue;
      // The end of a prompt: a client re-sending it with more after it (a chat's next turn, the
      // reply re-encoded from text) feeds only the rest.
      if (cache.budget() > 0 && !s->seq->invalid()) cache.Insert(engine->Snapshot(*s->seq));
      if (s->req.max_tokens == 0) {  // prefill only, as Generate with gen 0
        Finish(s, FinishReason::kLength, Status::Ok());
        continue;
      }
    }
    Choose(s, pass->LogitsOf(k, V));
  }
  if (prompt_rows == 0) {
    std::lock_guard<std::mutex> l(mu);
    stats.decode_tokens += stats.generated - generated_before;
  }
}

void Scheduler::Impl::RecordIdle(double seconds) {
  std::lock_guard<std::mutex> l(mu);
  ++stats.idle_gaps;
  stats.idle_seconds += seconds;
  if (idle_window.size() < Scheduler::kIdleWindow) {
    idle_window.push_back(seconds);
  } else {
    idle_window[idle_next] = seconds;
    idle_next = (idle_next + 1) % idle_window.size();
  }
}

// ---- The public surface ----

Scheduler::Scheduler(Engine* engine, const SchedulerOptions& o)
    : impl_(std::make_unique<Impl>(engine, o)), options_(o) {}

Scheduler::~Scheduler() { impl_->EndAll(); }

Result<int64_t> Scheduler::Submit(Request r) {
  const ModelConfig& c = impl_->engine->config();
  if (r.prompt.empty()) return Status::Invalid("request: empty prompt (give at least one id)");
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    if (r.prompt[i] < 0 || r.prompt[i] >= c.vocab) {
      return Status::Invalid("request: prompt id " + std::to_string(r.prompt[i]) + " (item " +
                             std::to_string(i + 1) + ") is outside the vocabulary [0, " +
                             std::to_string(c.vocab) + ")");
    }
  }
  const int64_t capacity = std::max<int64_t>(impl_->engine->memory_plan().positions, 1);
  if (static_cast<int64_t>(r.prompt.size()) > capacity) {
    return Status::Invalid("request: a prompt of " + std::to_string(r.prompt.size()) +
                           " ids does not fit a sequence of " + std::to_string(capacity) +
                           " positions");
  }
  if (r.max_tokens < 0) return Status::Invalid("request: max_tokens must be >= 0");
  K3_RETURN_IF_ERROR(CheckMedia(r.media, r.prompt.size(), c.hidden));
  K3_RETURN_IF_ERROR(ValidateSamplerOptions(r.sampling));
  std::lock_guard<std::mutex> l(impl_->mu);
  // A request waits only for a slot: those submitted beyond the free slots are the queue.
  const auto waiting = static_cast<int64_t>(impl_->queue.size() + impl_->running.size()) -
                       std::max<int64_t>(impl_->o.max_seqs, 1);
  if (impl_->o.max_queue >= 0 && waiting >= impl_->o.max_queue) {
    return Status::Io("queue full: " + std::to_string(std::max<int64_t>(waiting, 0)) +
                      " requests already wait for a slot (max_queue " +
                      std::to_string(impl_->o.max_queue) + ")");
  }
  const int64_t id = impl_->next_id++;
  impl_->queue.push_back(Waiting{id, std::move(r), Clock::now()});
  impl_->cv.notify_all();
  return id;
}

void Scheduler::Cancel(int64_t id) {
  std::lock_guard<std::mutex> l(impl_->mu);
  auto& q = impl_->queue;
  auto it = std::find_if(q.begin(), q.end(), [id](const Waiting& w) { return w.id == id; });
  if (it != q.end()) {
    impl_->cancelled_waiting.push_back(std::move(*it));
    q.erase(it);
  } else if (impl_->running.count(id) > 0) {
    impl_->cancel_running.insert(id);
  }
  impl_->cv.notify_all();
}

void Scheduler::CancelAll() {
  std::lock_guard<std::mutex> l(impl_->mu);
  for (Waiting& w : impl_->queue) impl_->cancelled_waiting.push_back(std::move(w));
  impl_->queue.clear();
  impl_->cancel_running.insert(impl_->running.begin(), impl_->running.end());
  impl_->cv.notify_all();
}

Result<bool> Scheduler::RunPass() {
  Impl& s = *impl_;
  bool worked = s.FinishCancelled();
  s.Admit();
  const std::vector<Slot*> carried = s.PlanPass();
  if (carried.empty()) {
    s.last_pass_end.reset();
    return worked;
  }
  s.RunOnePass(carried);
  // Slots freed by this pass (and cancellations during it) take queued requests now, so the
  // next pass already carries their prompts.
  s.FinishCancelled();
  s.Admit();
  return true;
}

Status Scheduler::RunUntilIdle() {
  while (true) {
    K3_ASSIGN_OR_RETURN(bool worked, RunPass());
    if (!worked) return Status::Ok();
  }
}

void Scheduler::WaitForWork() {
  std::unique_lock<std::mutex> l(impl_->mu);
  const auto ready = [this] {
    const Impl& s = *impl_;
    return s.woken || !s.queue.empty() || !s.cancelled_waiting.empty() || !s.running.empty();
  };
  if (!ready()) {
    impl_->last_pass_end.reset();  // waiting for a client is not idle time between passes
    impl_->cv.wait(l, ready);
  }
  impl_->woken = false;
}

void Scheduler::Wake() {
  std::lock_guard<std::mutex> l(impl_->mu);
  impl_->woken = true;
  impl_->cv.notify_all();
}

bool Scheduler::Idle() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->queue.empty() && impl_->cancelled_waiting.empty() && impl_->running.empty();
}

SchedulerStats Scheduler::Stats() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  SchedulerStats st = impl_->stats;
  st.active = static_cast<int64_t>(impl_->running.size());
  st.queued = static_cast<int64_t>(impl_->queue.size());
  std::vector<double> window = impl_->idle_window;
  st.idle_median_seconds = Quantile(window, 0.5);
  st.idle_p99_seconds = Quantile(window, 0.99);
  st.idle_max_seconds = Quantile(window, 1.0);
  return st;
}

}  // namespace k3::run
