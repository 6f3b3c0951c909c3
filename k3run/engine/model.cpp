// The forward pass in data-flow order (MODEL.md §3). Shapes: E hidden, V vocab, T rows.
#include "k3run/engine/model.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "k3run/engine/expert_waves.h"
#include "k3run/kernels/matmul.h"
#include "k3run/ops/glu.h"
#include "k3run/ops/layer.h"
#include "k3run/ops/norm.h"
#include "k3run/ops/router.h"

namespace k3::run {

State State::Make(const ModelConfig& c, int layers, int64_t capacity) {
  const ops::Dims d = DimsFromConfig(c);
  State s;
  s.kda.resize(static_cast<size_t>(c.n_layers));
  s.mla.resize(static_cast<size_t>(c.n_layers));
  for (int L = 0; L < layers; ++L) {
    if (c.is_mla(L)) {
      s.mla[static_cast<size_t>(L)] = ops::MlaCache::Make(d, capacity);
    } else {
      s.kda[static_cast<size_t>(L)] = ops::KdaState::Zero(d);
    }
  }
  return s;
}

void State::Reset() {
  for (ops::KdaState& k : kda) k.Reset();
  for (ops::MlaCache& m : mla) {  // rows past len are never read; their memory goes back
    m.len = 0;
    m.data.Release();
  }
  pos = 0;
  invalid = false;
  media.clear();
}

bool SameMediaPrefix(const std::vector<MediaSpan>& a, const std::vector<MediaSpan>& b,
                     int64_t length) {
  const auto in_prefix = [length](const std::vector<MediaSpan>& v) {
    std::vector<const MediaSpan*> out;
    for (const MediaSpan& s : v) {
      if (s.first < length) out.push_back(&s);
    }
    return out;
  };
  const std::vector<const MediaSpan*> x = in_prefix(a), y = in_prefix(b);
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i]->first != y[i]->first || x[i]->rows != y[i]->rows || !(x[i]->id == y[i]->id)) {
      return false;
    }
  }
  return true;
}

PassTimes& PassTimes::operator+=(const PassTimes& o) {
  attention += o.attention;
  experts += o.experts;
  waits += o.waits;
  trunk += o.trunk;
  mla += o.mla;
  return *this;
}

PassTimes PassTimes::operator-(const PassTimes& o) const {
  return PassTimes{attention - o.attention, experts - o.experts, waits - o.waits,
                   trunk - o.trunk, mla - o.mla};
}

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Replaces the embedding of every pad fed inside one of the segment's image spans by the
// image's row (media.h). `h` holds the segment's rows, the first at position state->pos.
void PlaceMediaRows(const Segment& seg, int32_t pad, int64_t E, float* h) {
  if (seg.state->media.empty() || pad < 0) return;
  for (int64_t i = 0; i < seg.n; ++i) {
    if (seg.ids[i] != pad) continue;
    const int64_t p = seg.state->pos + i;
    for (const MediaSpan& s : seg.state->media) {
      if (p < s.first || p >= s.first + s.rows) continue;
      const float* row = s.data->data() + (p - s.first) * E;
      std::copy(row, row + E, h + i * E);
      break;
    }
  }
}

}  // namespace

Model::Model(const ModelConfig& c, WeightSource* weights, int layers)
    : config_(c), dims_(DimsFromConfig(c)), weights_(weights), layers_(layers) {}

Status Model::Forward(const int32_t* ids, int64_t T, State* state, bool all_rows,
                      float* logits) {
  const Segment one{ids, T, state, all_rows ? Logits::kAll : Logits::kLast};
  return Pass(std::span<const Segment>(&one, 1), logits);
}

Status Model::Pass(std::span<const Segment> segments, float* logits) {
  // The split of this pass: attention, experts and waits are timed where they happen; trunk is
  // the rest of the pass's wall time.
  const auto start = Clock::now();
  const PassTimes before = times_;
  const Status s = RunPass(segments, logits);
  const PassTimes in_pass = times_ - before;
  times_.trunk += std::max(0.0, Since(start) - in_pass.attention - in_pass.experts - in_pass.waits);
  return s;
}

Status Model::RunPass(std::span<const Segment> segments, float* logits) {
  int64_t T = 0;
  std::vector<int32_t> ids;
  for (const Segment& seg : segments) {
    if (seg.n <= 0) return Status::Invalid("Forward: no tokens to feed");
    ids.insert(ids.end(), seg.ids, seg.ids + seg.n);
    T += seg.n;
  }
  if (T <= 0) return Status::Invalid("Forward: no tokens to feed");
  const int64_t E = dims_.hidden;
  // h [T][E]: the embedding rows (bf16 widened, no scaling; §3.2).
  std::vector<float> h(static_cast<size_t>(T * E));
  K3_RETURN_IF_ERROR(weights_->EmbeddingRows(ids.data(), T, h.data()));
  const int32_t pad = static_cast<int32_t>(config_.media_placeholder_token_id);
  for (int64_t first = 0; const Segment& seg : segments) {
    PlaceMediaRows(seg, pad, E, h.data() + first * E);
    first += seg.n;
  }
  // Attention-residual snapshots of this pass only (never carried across passes, §7).
  ops::BlockStack blocks =
      ops::BlockStack::Make(T, E, config_.n_layers / config_.attn_res_block + 1);
  ops::LayerScratch scratch;
  // Decoder layers (§3.3–3.7).
  for (int L = 0; L < layers_; ++L) {
    if (interrupt_ != nullptr && interrupt_->load(std::memory_order_relaxed)) {
      return Status::Io("interrupted: the pass stopped before layer " + std::to_string(L) +
                        " of " + std::to_string(layers_) + " and was discarded");
    }
    const auto asked = Clock::now();
    Result<const ops::LayerWeights*> layer = weights_->Layer(L);
    times_.waits += Since(asked);
    K3_RETURN_IF_ERROR(layer.status());
    const ops::LayerWeights* w = *layer;
    const Status s = RunLayer(L, *w, segments, h.data(), T, &blocks, &scratch);
    weights_->ReleaseExperts(L);
    weights_->ReleaseLayer(L);
    K3_RETURN_IF_ERROR(s);
  }
  for (const Segment& seg : segments) seg.state->pos += seg.n;
  // Head (§3.8): AttnRes over [snapshots…, h], final RMSNorm, lm_head, for the rows asked for.
  K3_ASSIGN_OR_RETURN(const HeadWeights* head, weights_->Head());
  ops::FinalAttnRes(blocks, head->output_attn_res_norm.data(), head->output_attn_res_proj.data(),
                    dims_.rms_eps, h.data(), T);
  std::vector<float> x;
  int64_t first = 0, rows = 0;
  for (const Segment& seg : segments) {
    const int64_t from = seg.logits == Logits::kAll    ? first
                         : seg.logits == Logits::kLast ? first + seg.n - 1
                                                       : first + seg.n;
    for (int64_t t = from; t < first + seg.n; ++t, ++rows) {
      x.resize(static_cast<size_t>((rows + 1) * E));
      ops::RmsNorm(h.data() + t * E, head->norm.data(), E, dims_.rms_eps, x.data() + rows * E);
    }
    first += seg.n;
  }
  if (rows == 0) return Status::Ok();
  return Head(x.data(), rows, logits);
}

// One decoder layer for every segment's rows: the attention per sequence, with its own state;
// everything else over all rows at once (row by row, so the grouping never changes a bit).
Status Model::RunLayer(int L, const ops::LayerWeights& w, std::span<const Segment> segments,
                       float* h, int64_t T, ops::BlockStack* blocks, ops::LayerScratch* s) {
  auto state_of = [&](const Segment& seg) {
    ops::LayerState ls;
    if (w.is_mla) {
      ls.mla = &seg.state->mla[static_cast<size_t>(L)];
    } else {
      ls.kda = &seg.state->kda[static_cast<size_t>(L)];
      if (seg.tentative) ls.records = &seg.state->records[static_cast<size_t>(L)];
    }
    return ls;
  };
  // Every sequence's state is checked before the first phase changes anything.
  for (const Segment& seg : segments) {
    if (seg.tentative && seg.state->records.size() != seg.state->kda.size()) {
      seg.state->records.resize(seg.state->kda.size());
    }
    K3_RETURN_IF_ERROR(ops::CheckLayerState(L, w, seg.n, state_of(seg)));
  }
  K3_RETURN_IF_ERROR(ops::BeginLayer(L, w, dims_, h, T, blocks, s));
  // The attention: projections over every row (each weight read once for all sequences), the
  // recurrence or cache of every sequence in one fork/join, the output projection over every
  // row.
  const auto t0 = Clock::now();
  K3_RETURN_IF_ERROR(ops::BeginAttention(w, dims_, T, s));
  std::vector<ops::AttentionSegment> sequences;
  int64_t first = 0;
  for (const Segment& seg : segments) {
    sequences.push_back({first, seg.n, state_of(seg)});
    first += seg.n;
  }
  K3_RETURN_IF_ERROR(ops::LayerAttentionAll(L, w, dims_, sequences, s));
  ops::EndAttention(w, dims_, s);
  const double attention = Since(t0);
  times_.attention += attention;
  if (w.is_mla) times_.mla += attention;
  ops::MlpInput(w, dims_, *blocks, h, T, s);
  if (w.is_dense) {
    // The next (MoE) layer's likely experts can load while the dense FFN computes.
    GuessNextExperts(L, h, T);
    ops::GluMlp(w.dense, dims_.situ_b1, dims_.situ_b2, s->a.data(), T, s->out.data());
  } else {
    K3_RETURN_IF_ERROR(RunMoe(L, w, segments, h, T, s));
  }
  ops::EndLayer(dims_, T, *s, h);
  return Status::Ok();
}

// The MoE block with its routed experts read through the source: wave 0's reads are issued as
// soon as routing is known, then the next layer's guess, then the work that needs no routed
// expert, then the experts as they arrive (ExpertWaves); h is the MLP input before its norm.
// Scale-out: the rows of remote experts leave right after the latent projection (MoeBegin) and
// compute on their ranks while this process computes its own; their outputs land in the same
// slots before the combine, so the sum is the one-process sum.
Status Model::RunMoe(int L, const ops::LayerWeights& w, std::span<const Segment> segments,
                     const float* h, int64_t T, ops::LayerScratch* s) {
  const ops::Routing routing = ops::Route(w.moe, dims_, s->a.data(), T);
  std::vector<int32_t> local = ops::SelectedExperts(routing), remote;
  experts_routed_ += static_cast<int64_t>(local.size());
  if (remote_ != nullptr) {
    std::vector<int32_t> mine;
    for (int32_t e : local) (remote_->IsLocal(L, e) ? mine : remote).push_back(e);
    local = std::move(mine);
  }
  ExpertWaves waves(weights_, L, dims_, routing, std::move(local));
  waves.Start();
  GuessNextExperts(L, h, T);
  ops::MoeScratch& moe = moe_scratch_;  // kept across layers and passes (ops/moe.h)
  ops::MoeBegin(w.moe, dims_, s->a.data(), T, &moe);
  if (!remote.empty()) K3_RETURN_IF_ERROR(remote_->Send(L, routing, remote, moe));
  const size_t missing_before = stats_.missing.size();
  const auto t0 = Clock::now();
  waves.Run(&moe, &stats_);
  times_.experts += Since(t0) - waves.waited();
  times_.waits += waves.waited();
  if (!remote.empty()) {
    const auto asked = Clock::now();
    const Status received = remote_->Receive(L, &moe, &stats_);
    times_.waits += Since(asked);
    K3_RETURN_IF_ERROR(received);
  }
  ops::MoeCombine(w.moe, dims_, routing, moe, s->out.data());
  MarkInvalid(routing, std::span<const int32_t>(stats_.missing).subspan(missing_before), segments);
  return Status::Ok();
}

// Every sequence with a row routed to an expert that could not be read is RUN INVALID; the
// others in the pass are not (their rows never touched it).
void Model::MarkInvalid(const ops::Routing& routing, std::span<const int32_t> missing,
                        std::span<const Segment> segments) {
  std::vector<int64_t> rows;
  for (int32_t e : missing) ops::RowsOf(routing, e, &rows);
  for (int64_t slot : rows) {
    const int64_t t = slot / routing.topk;  // RowsOf gives slot rows t·topk + j
    int64_t first = 0;
    for (const Segment& seg : segments) {
      if (t >= first && t < first + seg.n) seg.state->invalid = true;
      first += seg.n;
    }
  }
}

void Model::Keep(State* state, int64_t n, int64_t kept) const {
  const int64_t drop = n - kept;
  for (int L = 0; L < layers_; ++L) {
    const auto l = static_cast<size_t>(L);
    if (config_.is_mla(L)) {
      state->mla[l].len -= drop;
    } else {
      ops::KdaReplay(state->records[l], kept, dims_, &state->kda[l]);
    }
  }
  state->pos -= drop;
}

// While layer L's experts load, the most likely experts of L+1 (ops::GuessExperts on L's pre-norm
// MLP input h; bench preset: 85 % of a top-8 guess is picked, docs/STREAMING.md) go to the
// source, which reads them behind L's batch (or during the dense FFN when L is dense) while L
// finishes and L+1's attention computes. A guess only: what is read never changes a bit.
void Model::GuessNextExperts(int L, const float* h, int64_t T) {
  const int next = L + 1;
  if (next >= layers_) return;
  const int64_t budget = weights_->PrefetchBudget(next);
  if (budget <= 0) return;
  const ops::LayerWeights* w = weights_->HeldLayer(next);
  if (w == nullptr) return;
  std::vector<int32_t> guesses = ops::GuessExperts(*w, dims_, h, T, budget);
  if (remote_ != nullptr) {  // another rank's experts are never read here
    std::erase_if(guesses, [&](int32_t e) { return !remote_->IsLocal(next, e); });
  }
  weights_->Prefetch(next, guesses);
}

// logits [rows][V] = lm_head · x, chunk by chunk as the source serves it.
Status Model::Head(const float* x, int64_t rows, float* logits) {
  const int64_t V = config_.vocab;
  const int64_t chunk = std::max<int64_t>(1, weights_->LmHeadChunkRows());
  std::vector<float> part;
  for (int64_t begin = 0; begin < V; begin += chunk) {
    const int64_t n = std::min(chunk, V - begin);
    const auto asked = Clock::now();
    Result<kernels::Matrix> chunk_or = weights_->LmHeadRows(begin, n);
    times_.waits += Since(asked);
    if (!chunk_or.ok()) {
      weights_->LmHeadDone();
      return chunk_or.status();
    }
    const kernels::Matrix& m = *chunk_or;
    if (n == V) {
      kernels::MatMul(m, x, rows, logits);
      continue;
    }
    part.resize(static_cast<size_t>(rows * n));
    kernels::MatMul(m, x, rows, part.data());
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(part.data() + r * n, n, logits + r * V + begin);
    }
  }
  weights_->LmHeadDone();
  return Status::Ok();
}

}  // namespace k3::run
