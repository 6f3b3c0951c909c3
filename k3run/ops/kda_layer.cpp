// The KDA layer, step by step as MODEL.md §3.4 (step numbers in the comments).
#include <cmath>
#include <vector>

#include "k3run/ops/conv.h"
#include "k3run/ops/kda.h"
#include "k3run/ops/math.h"
#include "k3run/ops/norm.h"

namespace k3::ops {

void KdaLayer(const KdaWeights& w, const Dims& d, const float* x, int64_t T, KdaState* st,
              float* out) {
  if (T <= 0) return;
  const int64_t H = d.kda_heads, D = d.kda_head_dim, P = H * D, K = d.conv_k;
  auto buf = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n)); };
  std::vector<float> q = buf(T * P), k = buf(T * P), v = buf(T * P), gate = buf(T * P);
  std::vector<float> b = buf(T * H), fa = buf(T * D), z = buf(T * P);

  // 1. projections (every weight read once for the T rows)
  kernels::MatMul(w.q_proj, x, T, q.data());
  kernels::MatMul(w.k_proj, x, T, k.data());
  kernels::MatMul(w.v_proj, x, T, v.data());
  kernels::MatMul(w.b_proj, x, T, b.data());
  kernels::MatMul(w.f_a_proj, x, T, fa.data());
  kernels::MatMul(w.f_b_proj, fa.data(), T, z.data());
  kernels::MatMul(w.g_proj, x, T, gate.data());

  // 2. short causal conv with SiLU, each stream with its own taps and carried history
  ShortConv(q.data(), T, P, K, w.q_conv.data(), st->hist_q.data(), q.data());
  ShortConv(k.data(), T, P, K, w.k_conv.data(), st->hist_k.data(), k.data());
  ShortConv(v.data(), T, P, K, w.v_conv.data(), st->hist_v.data(), v.data());

  const float q_scale = 1.0f / std::sqrt(static_cast<float>(D));  // fp32(1/sqrtf(D))
  std::vector<float> g = buf(P), alpha = buf(P), o = buf(T * P);
  for (int64_t t = 0; t < T; ++t) {
    float* qt = q.data() + t * P;
    float* kt = k.data() + t * P;
    // 3. per-head L2 norm of q and k; q pre-scaled for the recurrence
    for (int64_t h = 0; h < H; ++h) {
      L2Norm(qt + h * D, D);
      L2Norm(kt + h * D, D);
    }
    for (int64_t i = 0; i < P; ++i) qt[i] = qt[i] * q_scale;
    // 5. decay for this token
    KdaDecay(z.data() + t * P, w.A_log.data(), w.dt_bias.data(), H, D, d.gate_lb, g.data(),
             alpha.data());
    for (int64_t h = 0; h < H; ++h) {
      const float beta = Sigmoid(b[static_cast<size_t>(t * H + h)]);  // 4. β per head
      // 6. recurrence, sequential over t
      KdaRecurrenceStep(st->S.data() + h * D * D, qt + h * D, kt + h * D,
                        v.data() + t * P + h * D, alpha.data() + h * D, beta, D,
                        o.data() + t * P + h * D);
      // 7. head-wise RMSNorm, then 8. sigmoid gate (norm FIRST)
      float* oh = o.data() + t * P + h * D;
      RmsNorm(oh, w.o_norm.data(), D, d.rms_eps, oh);
      const float* gh = gate.data() + t * P + h * D;
      for (int64_t j = 0; j < D; ++j) oh[j] = oh[j] * Sigmoid(gh[j]);
    }
  }
  // 9. output projection
  kernels::MatMul(w.o_proj, o.data(), T, out);
}

}  // namespace k3::ops
