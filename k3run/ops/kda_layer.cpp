// The KDA layer, step by step as MODEL.md §3.4 (step numbers in the comments).
#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "k3run/kernels/thread_pool.h"
#include "k3run/ops/conv.h"
#include "k3run/ops/kda.h"
#include "k3run/ops/math.h"
#include "k3run/ops/norm.h"

namespace k3::ops {

int64_t KdaRecords::FloatsPerRow(const Dims& d) {
  return 7 * d.kda_width() + d.kda_heads;
}

namespace {

// Sizes the records for T rows and keeps the pre-conv inputs (the histories' replay).
void BeginRecords(const float* q, const float* k, const float* v, int64_t T, const Dims& d,
                  KdaRecords* r) {
  const auto n = static_cast<size_t>(T * d.kda_width());
  r->rows = T;
  for (auto* b : {&r->q, &r->k, &r->v, &r->alpha, &r->raw_q, &r->raw_k, &r->raw_v}) b->resize(n);
  r->beta.resize(static_cast<size_t>(T * d.kda_heads));
  std::copy(q, q + n, r->raw_q.begin());
  std::copy(k, k + n, r->raw_k.begin());
  std::copy(v, v + n, r->raw_v.begin());
}

// One head's recurrence inputs of row t, as the recurrence is about to consume them.
void RecordHead(KdaRecords* r, int64_t t, int64_t h, int64_t D, int64_t P, const float* q,
                const float* k, const float* v, const float* alpha, float beta) {
  const int64_t at = t * P + h * D;
  std::copy(q, q + D, r->q.begin() + at);
  std::copy(k, k + D, r->k.begin() + at);
  std::copy(v, v + D, r->v.begin() + at);
  std::copy(alpha, alpha + D, r->alpha.begin() + at);
  r->beta[static_cast<size_t>(t * (P / D) + h)] = beta;
}

}  // namespace

void KdaProject(const KdaWeights& w, const Dims& d, const float* x, int64_t T, KdaRows* r) {
  const int64_t H = d.kda_heads, D = d.kda_head_dim, P = H * D;
  const auto rows = [T](int64_t width) { return static_cast<size_t>(T * width); };
  r->T = T;
  for (std::vector<float>* b : {&r->q, &r->k, &r->v, &r->gate, &r->z, &r->o}) b->resize(rows(P));
  r->b.resize(rows(H));
  std::vector<float> fa(rows(D));
  // 1. projections (every weight read once for the T rows)
  kernels::MatMul(w.q_proj, x, T, r->q.data());
  kernels::MatMul(w.k_proj, x, T, r->k.data());
  kernels::MatMul(w.v_proj, x, T, r->v.data());
  kernels::MatMul(w.b_proj, x, T, r->b.data());
  kernels::MatMul(w.f_a_proj, x, T, fa.data());
  kernels::MatMul(w.f_b_proj, fa.data(), T, r->z.data());
  kernels::MatMul(w.g_proj, x, T, r->gate.data());
}

void KdaAttend(const KdaWeights& w, const Dims& d, int64_t first, int64_t n, KdaState* st,
               KdaRows* r, KdaRecords* records) {
  const KdaSegment one{first, n, st, records};
  KdaAttendMany(w, d, std::span<const KdaSegment>(&one, 1), r);
}

void KdaAttendMany(const KdaWeights& w, const Dims& d, std::span<const KdaSegment> segments,
                   KdaRows* r) {
  const int64_t H = d.kda_heads, D = d.kda_head_dim, P = H * D, K = d.conv_k;
  // Rows that may be discarded run on a scratch copy of the state (one per such segment, kept
  // by this thread and reused), so the live state is untouched until Commit replays the rows
  // it keeps.
  thread_local std::vector<KdaState> scratch;
  size_t copies = 0;
  for (const KdaSegment& g : segments) copies += g.records != nullptr && g.n > 0;
  if (scratch.size() < copies) scratch.resize(copies);  // before any pointer into it is taken
  std::vector<KdaState*> states(segments.size());
  copies = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const KdaSegment& g = segments[i];
    states[i] = g.state;
    if (g.n <= 0) continue;
    float* q = r->q.data() + g.first * P;
    float* k = r->k.data() + g.first * P;
    float* v = r->v.data() + g.first * P;
    if (g.records != nullptr) {
      BeginRecords(q, k, v, g.n, d, g.records);
      scratch[copies] = *g.state;
      states[i] = &scratch[copies++];
    }
  }
  // 2. short causal conv with SiLU, each stream with its own taps and carried history; channels
  // are independent, so (sequence, stream, block of channels) units run on the compute threads.
  constexpr int64_t kConvBlocks = 4;
  const int64_t block = (P + kConvBlocks - 1) / kConvBlocks;
  const int64_t units = static_cast<int64_t>(segments.size()) * 3 * kConvBlocks;
  kernels::ParallelChunks(kernels::Threads(), units, [&](int64_t u) {
    const size_t i = static_cast<size_t>(u / (3 * kConvBlocks));
    const int64_t stream = u / kConvBlocks % 3, c0 = u % kConvBlocks * block;
    const int64_t c1 = c0 + block < P ? c0 + block : P;
    const KdaSegment& g = segments[i];
    if (g.n <= 0) return;
    std::vector<float>* rows[3] = {&r->q, &r->k, &r->v};
    const Vec* taps[3] = {&w.q_conv, &w.k_conv, &w.v_conv};
    std::vector<float>* hist[3] = {&states[i]->hist_q, &states[i]->hist_k, &states[i]->hist_v};
    float* x = rows[stream]->data() + g.first * P;
    ShortConvChannels(x, g.n, P, K, taps[stream]->data(), hist[stream]->data(), x, c0, c1);
  });

  const float q_scale = 1.0f / std::sqrt(static_cast<float>(D));  // fp32(1/sqrtf(D))
  // Heads are independent from step 3 on (own slices of q, k, v, decay, state and output), and
  // so are sequences: each compute thread takes whole (sequence, head) pairs through all the
  // sequence's rows, one fork/join for every sequence of the pass (a decode pass of 16
  // sequences forked 16 times per layer before). Each head's arithmetic, row by row in order,
  // is the same on any thread.
  const int64_t pairs = static_cast<int64_t>(segments.size()) * H;
  kernels::ParallelChunks(kernels::Threads(), pairs, [&](int64_t pair) {
    const KdaSegment& g = segments[static_cast<size_t>(pair / H)];
    KdaState* st = states[static_cast<size_t>(pair / H)];
    const int64_t h = pair % H, c0 = h * D;
    float* q = r->q.data() + g.first * P;
    float* k = r->k.data() + g.first * P;
    const float* v = r->v.data() + g.first * P;
    const float* z = r->z.data() + g.first * P;
    const float* gate = r->gate.data() + g.first * P;
    const float* b = r->b.data() + g.first * H;
    float* o = r->o.data() + g.first * P;
    // Steps 3–5 for every row first, then the recurrence over the rows in one run (one pass over
    // the head's state per row), then steps 7–8: each row's arithmetic is unchanged.
    std::vector<float> gd(static_cast<size_t>(D)), alpha(static_cast<size_t>(g.n * D)),
        beta(static_cast<size_t>(g.n));
    for (int64_t t = 0; t < g.n; ++t) {
      float* qt = q + t * P;
      float* kt = k + t * P;
      float* at = alpha.data() + t * D;
      // 3. per-head L2 norm of q and k; q pre-scaled for the recurrence
      L2Norm(qt + c0, D);
      L2Norm(kt + c0, D);
      for (int64_t i = c0; i < c0 + D; ++i) qt[i] = qt[i] * q_scale;
      // 5. decay for this token and head
      KdaDecay(z + t * P + c0, w.A_log.data() + h, w.dt_bias.data() + c0, 1, D, d.gate_lb,
               gd.data(), at);
      beta[static_cast<size_t>(t)] = Sigmoid(b[t * H + h]);  // 4. β per head
      if (g.records != nullptr) {
        RecordHead(g.records, t, h, D, P, qt + c0, kt + c0, v + t * P + c0, at,
                   beta[static_cast<size_t>(t)]);
      }
    }
    // 6. recurrence, sequential over t
    KdaRecurrenceRun(st->S.data() + h * D * D, q + c0, k + c0, v + c0, P, alpha.data(), D,
                     beta.data(), 1, g.n, D, o + c0);
    for (int64_t t = 0; t < g.n; ++t) {
      // 7. head-wise RMSNorm, then 8. sigmoid gate (norm FIRST)
      float* oh = o + t * P + c0;
      RmsNorm(oh, w.o_norm.data(), D, d.rms_eps, oh);
      const float* gh = gate + t * P + c0;
      for (int64_t j = 0; j < D; ++j) oh[j] = oh[j] * Sigmoid(gh[j]);
    }
  });
}

void KdaOutput(const KdaWeights& w, const KdaRows& r, float* out) {
  // 9. output projection
  kernels::MatMul(w.o_proj, r.o.data(), r.T, out);
}

void KdaLayer(const KdaWeights& w, const Dims& d, const float* x, int64_t T, KdaState* st,
              float* out, KdaRecords* records) {
  if (T <= 0) return;
  KdaRows r;
  KdaProject(w, d, x, T, &r);
  KdaAttend(w, d, 0, T, st, &r, records);
  KdaOutput(w, r, out);
}

void KdaReplay(const KdaRecords& r, int64_t rows, const Dims& d, KdaState* st) {
  if (rows <= 0) return;
  const int64_t H = d.kda_heads, D = d.kda_head_dim, P = H * D, K = d.conv_k;
  ShortConvPush(r.raw_q.data(), rows, P, K, st->hist_q.data());
  ShortConvPush(r.raw_k.data(), rows, P, K, st->hist_k.data());
  ShortConvPush(r.raw_v.data(), rows, P, K, st->hist_v.data());
  // Per head, the rows in order: the same steps on the same inputs as the pass made.
  std::vector<float> o(static_cast<size_t>(rows * P));  // the outputs: written, not used
  kernels::ParallelChunks(kernels::Threads(), H, [&](int64_t h) {
    const int64_t c0 = h * D;
    KdaRecurrenceRun(st->S.data() + h * D * D, r.q.data() + c0, r.k.data() + c0,
                     r.v.data() + c0, P, r.alpha.data() + c0, P, r.beta.data() + h, H, rows, D,
                     o.data() + c0);
  });
}

}  // namespace k3::ops
