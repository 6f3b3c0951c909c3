#include <algorithm>
#include <vector>

#include "k3run/ops/kda.h"
#include "k3run/ops/math.h"

namespace k3::ops {

KdaState KdaState::Zero(const Dims& d) {
  KdaState s;
  s.heads = d.kda_heads;
  s.head_dim = d.kda_head_dim;
  s.conv_k = d.conv_k;
  const int64_t P = d.kda_width();
  const int64_t hist = d.conv_k > 0 ? d.conv_k - 1 : 0;
  s.S.assign(static_cast<size_t>(d.kda_heads * d.kda_head_dim * d.kda_head_dim), 0.0f);
  s.hist_q.assign(static_cast<size_t>(P * hist), 0.0f);
  s.hist_k.assign(static_cast<size_t>(P * hist), 0.0f);
  s.hist_v.assign(static_cast<size_t>(P * hist), 0.0f);
  return s;
}

void KdaState::Reset() {
  for (std::vector<float>* v : Buffers()) std::fill(v->begin(), v->end(), 0.0f);
}

size_t KdaState::Floats() const {
  size_t n = 0;
  for (const std::vector<float>* v : Buffers()) n += v->size();
  return n;
}

K3_ELEMENTWISE_CLONES void KdaDecay(const float* z, const float* A_log, const float* dt_bias, int64_t H, int64_t D,
              float lb, float* g, float* alpha) {
  for (int64_t h = 0; h < H; ++h) {
    const float rate = Exp(A_log[h]);  // A_log is per HEAD (MODEL.md §3.4 step 5)
    for (int64_t c = 0; c < D; ++c) {
      const int64_t i = h * D + c;
      const float u = rate * (z[i] + dt_bias[i]);
      g[i] = lb * Sigmoid(u);
      alpha[i] = Exp(g[i]);
    }
  }
}

namespace {

// Scratch for u = Sᵀk of the token in flight and of the next one, and for the residual v − u.
// One set per thread (heads run on the compute threads), grown once.
struct RecurrenceScratch {
  std::vector<float> u, u_next, r;
};
RecurrenceScratch& Scratch(int64_t D) {
  thread_local RecurrenceScratch s;
  if (s.u.size() < static_cast<size_t>(D)) {
    s.u.resize(static_cast<size_t>(D));
    s.u_next.resize(static_cast<size_t>(D));
    s.r.resize(static_cast<size_t>(D));
  }
  return s;
}

}  // namespace

// One pass over S per token (S is 64 KiB per head at D = 128, past L1, so its passes are the
// cost): row i's update for token t and output sum, then its decay and u sum for token t + 1.
// Row i is final for t once updated, and decayed for t + 1 right after, so each element of S
// sees the same operations in the same order as the step-by-step recurrence, and every sum over
// i (o_t, u_{t+1}) still adds rows in ascending i: the bits of n KdaRecurrenceStep calls.
K3_ELEMENTWISE_CLONES void KdaRecurrenceRun(float* S, const float* q_scaled, const float* k,
                                            const float* v, int64_t stride, const float* alpha,
                                            int64_t alpha_stride, const float* beta,
                                            int64_t beta_stride, int64_t n, int64_t D,
                                            float* o) {
  if (n <= 0) return;
  RecurrenceScratch& sc = Scratch(D);
  float* u = sc.u.data();
  float* u_next = sc.u_next.data();
  float* r = sc.r.data();
  // Token 0's decay and u = Sᵀk (i ascending).
  for (int64_t j = 0; j < D; ++j) u[j] = 0.0f;
  for (int64_t i = 0; i < D; ++i) {
    float* row = S + i * D;
    const float a = alpha[i];
    const float ki = k[i];
    for (int64_t j = 0; j < D; ++j) row[j] = a * row[j];
    for (int64_t j = 0; j < D; ++j) u[j] += ki * row[j];
  }
  for (int64_t t = 0; t < n; ++t) {
    const float* qt = q_scaled + t * stride;
    const float* kt = k + t * stride;
    const float* vt = v + t * stride;
    float* ot = o + t * stride;
    const float bt = beta[t * beta_stride];
    for (int64_t j = 0; j < D; ++j) r[j] = vt[j] - u[j];  // the residual, formed once per j
    for (int64_t j = 0; j < D; ++j) ot[j] = 0.0f;
    if (t + 1 < n) {
      const float* an = alpha + (t + 1) * alpha_stride;
      const float* kn = k + (t + 1) * stride;
      for (int64_t j = 0; j < D; ++j) u_next[j] = 0.0f;
      for (int64_t i = 0; i < D; ++i) {
        float* row = S + i * D;
        const float kb = kt[i] * bt;
        const float qi = qt[i];
        const float a = an[i];
        const float ki = kn[i];
        for (int64_t j = 0; j < D; ++j) {
          const float updated = row[j] + kb * r[j];  // delta write for t
          ot[j] += qi * updated;                     // o_t from the updated state
          const float decayed = a * updated;         // t + 1's decay
          row[j] = decayed;
          u_next[j] += ki * decayed;  // t + 1's u
        }
      }
      float* swap = u;
      u = u_next;
      u_next = swap;
    } else {
      for (int64_t i = 0; i < D; ++i) {
        float* row = S + i * D;
        const float kb = kt[i] * bt;
        const float qi = qt[i];
        for (int64_t j = 0; j < D; ++j) {
          row[j] = row[j] + kb * r[j];
          ot[j] += qi * row[j];
        }
      }
    }
  }
}

void KdaRecurrenceStep(float* S, const float* q_scaled, const float* k, const float* v,
                       const float* alpha, float beta, int64_t D, float* o) {
  KdaRecurrenceRun(S, q_scaled, k, v, D, alpha, D, &beta, 1, 1, D, o);
}

}  // namespace k3::ops
