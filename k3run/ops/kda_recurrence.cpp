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

// Scratch for v − u: u lives in o, which step 4 overwrites while the residual is still needed.
// One per thread (heads run on the compute threads), grown once.
std::vector<float>& Residual(int64_t D) {
  thread_local std::vector<float> r;
  if (r.size() < static_cast<size_t>(D)) r.resize(static_cast<size_t>(D));
  return r;
}

}  // namespace

K3_ELEMENTWISE_CLONES void KdaRecurrenceStep(float* S, const float* q_scaled, const float* k, const float* v,
                       const float* alpha, float beta, int64_t D, float* o) {
  float* u = o;  // o doubles as the scratch for u = Sᵀk (no allocation per head and token)
  for (int64_t j = 0; j < D; ++j) u[j] = 0.0f;
  // 1. decay rows, 2. read u = Sᵀk (i ascending); fused per row i, same order per element.
  for (int64_t i = 0; i < D; ++i) {
    float* row = S + i * D;
    const float a = alpha[i];
    const float ki = k[i];
    for (int64_t j = 0; j < D; ++j) row[j] = a * row[j];
    for (int64_t j = 0; j < D; ++j) u[j] += ki * row[j];
  }
  // 3. delta write, the residual v − u formed once per j; 4. output from the UPDATED state,
  // fused per row i: row i is final once written, and o[j] still sums rows in ascending i, so
  // the bits are those of two separate passes, with one pass less over the state.
  std::vector<float>& r = Residual(D);
  for (int64_t j = 0; j < D; ++j) r[static_cast<size_t>(j)] = v[j] - u[j];
  for (int64_t j = 0; j < D; ++j) o[j] = 0.0f;
  for (int64_t i = 0; i < D; ++i) {
    float* row = S + i * D;
    const float kb = k[i] * beta;
    const float qi = q_scaled[i];
    for (int64_t j = 0; j < D; ++j) row[j] = row[j] + kb * r[static_cast<size_t>(j)];
    for (int64_t j = 0; j < D; ++j) o[j] += qi * row[j];
  }
}

}  // namespace k3::ops
