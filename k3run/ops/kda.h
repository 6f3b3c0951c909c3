// Kimi Delta Attention (MODEL.md §3.4): decay, the delta-rule recurrence and the whole layer.
//
// Precision: fp32 throughout, the orders of MODEL.md §3.4; the recurrence loops over the value
// index j innermost, so a compiler (or a future SIMD body) may vectorise over j only and each
// output element still sees the same sequence of operations (DESIGN.md §7).
// State: KdaState is the per-layer carried state of MODEL.md §7 (S and three conv histories).
// Feeding T rows in one call and T single-row calls with the same state gives identical bits.
// Thread safety: none; one state per sequence and layer.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "k3run/ops/weights.h"

namespace k3::ops {

struct KdaState {
  int64_t heads = 0, head_dim = 0, conv_k = 0;
  std::vector<float> S;       // [H][D][D], row i = key channel, column j = value channel
  std::vector<float> hist_q;  // [P][K−1] raw pre-conv q inputs, oldest first
  std::vector<float> hist_k;  // [P][K−1]
  std::vector<float> hist_v;  // [P][K−1]

  static KdaState Zero(const Dims& d);  // sized for d, all zeros (start of a sequence)
  void Reset();                         // back to zeros, keeping sizes
  // The state's buffers in the one order every copy, reset and file section uses:
  // S ‖ hist_q ‖ hist_k ‖ hist_v. A buffer added to the state is added here.
  std::array<std::vector<float>*, 4> Buffers() { return {&S, &hist_q, &hist_k, &hist_v}; }
  std::array<const std::vector<float>*, 4> Buffers() const {
    return {&S, &hist_q, &hist_k, &hist_v};
  }
  size_t Floats() const;  // Σ over Buffers()
};

// One token's decay: for channel i = h·D + d, u = exp(A_log[h])·(z_i + dt_bias_i),
// g_i = lb·σ(u), α_i = exp(g_i). z [H·D] is f_b(f_a(x)) before dt_bias. α = 1 exactly is legal.
void KdaDecay(const float* z, const float* A_log, const float* dt_bias, int64_t H, int64_t D,
              float lb, float* g, float* alpha);

// One head, one token of the delta rule on S [D][D]:
//   S[i][:] ← α_i·S[i][:];  u = Sᵀk;  S[i][j] ← S[i][j] + (k_i·β)·(v_j − u_j);  o = Sᵀq̃
// with q̃ ALREADY scaled by fp32(1/sqrtf(D)) by the caller; sums over i ascending in fp32.
// o [D] must not overlap the inputs.
void KdaRecurrenceStep(float* S, const float* q_scaled, const float* k, const float* v,
                       const float* alpha, float beta, int64_t D, float* o);
// n tokens of one head in order, with one pass over S per token (the step makes two): the bits
// of n KdaRecurrenceStep calls. q_scaled, k, v and o hold token t at t·stride (D floats each),
// alpha at t·alpha_stride, beta at t·beta_stride; o may not overlap the inputs.
void KdaRecurrenceRun(float* S, const float* q_scaled, const float* k, const float* v,
                      int64_t stride, const float* alpha, int64_t alpha_stride, const float* beta,
                      int64_t beta_stride, int64_t n, int64_t D, float* o);

// What the recurrence and the conv histories consume, row by row, for rows that may be discarded
// (speculative drafts, DESIGN.md §11.4). With these, keeping the first r rows is a replay of r
// recurrence steps on the state, with no weight read: the projections, norms and decay are not
// recomputed, and each step sees exactly the inputs it saw in the pass, so the state's bits
// equal those of feeding the r rows without drafts.
struct KdaRecords {
  int64_t rows = 0;               // rows recorded by the last KdaLayer call
  std::vector<float> q, k, v;     // [rows][P]: q normed and scaled, k normed, v after the conv
  std::vector<float> alpha;       // [rows][P]: the decay
  std::vector<float> beta;        // [rows][H]
  std::vector<float> raw_q, raw_k, raw_v;  // [rows][P]: pre-conv inputs (the conv histories)

  // Floats one row's records hold: 7·P + H.
  static int64_t FloatsPerRow(const Dims& d);
};

// The KDA attention in three phases, so that the rows of several sequences in one pass share
// every weight read: KdaProject (step 1, every row of the pass) → KdaAttend (steps 2–8, one
// sequence's rows in order, with that sequence's state) → KdaOutput (step 9, every row).
// Steps 1 and 9 work row by row, so grouping rows never changes a bit.
struct KdaRows {
  int64_t T = 0;
  std::vector<float> q, k, v, gate, z;  // [T][P] projections (q, k, v: conv'd in place by Attend)
  std::vector<float> b;                 // [T][H] β logits
  std::vector<float> o;                 // [T][P] steps 2–8's output, o_proj's input
};

// Step 1 for x [T][E] (the input-layernormed rows): every weight read once for the T rows.
void KdaProject(const KdaWeights& w, const Dims& d, const float* x, int64_t T, KdaRows* r);

// Steps 2–8 for rows [first, first + n) of r, which belong to one sequence, in order. Updates st
// (sized for d) in place; with `records`, st is left as it was (the rows run on a scratch copy)
// and the rows' records are written instead.
void KdaAttend(const KdaWeights& w, const Dims& d, int64_t first, int64_t n, KdaState* st,
               KdaRows* r, KdaRecords* records = nullptr);

// One sequence's rows of a pass for KdaAttendMany: KdaAttend's first, n, st and records.
struct KdaSegment {
  int64_t first = 0, n = 0;
  KdaState* state = nullptr;
  KdaRecords* records = nullptr;
};

// KdaAttend for several sequences' disjoint rows, with one fork/join for all of them: the same
// bits as one KdaAttend per segment.
void KdaAttendMany(const KdaWeights& w, const Dims& d, std::span<const KdaSegment> segments,
                   KdaRows* r);

// Step 9: out [T][E] = o_proj · r.o.
void KdaOutput(const KdaWeights& w, const KdaRows& r, float* out);

// The whole KDA attention over T rows of one sequence: x [T][E] (the input-layernormed row
// a_in), out [T][E]; the three phases above. State and records as KdaAttend.
void KdaLayer(const KdaWeights& w, const Dims& d, const float* x, int64_t T, KdaState* st,
              float* out, KdaRecords* records = nullptr);

// Applies the first `rows` recorded rows to st: the recurrence steps (heads on the compute
// threads) and the conv histories. The bits equal KdaLayer over those rows without records.
void KdaReplay(const KdaRecords& records, int64_t rows, const Dims& d, KdaState* st);

}  // namespace k3::ops
