// The KDA layer, step by step as MODEL.md §3.4 (step numbers in the comments).
#include <cmath>
#include <vector>

#include "k3run/kernels/thread_pool.h"
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
    // Heads are independent from step 3 on (own slices of q, k, v, decay, state and output), so
    // they run on the compute threads; each head's arithmetic is the same on any thread.
    kernels::ParallelChunks(kernels::Threads(), H, [&](int64_t h) {
      const int64_t c0 = h * D;
      // 3. per-head L2 norm of q and k; q pre-scaled for the recurrence
      L2Norm(qt + c0, D);
      L2Norm(kt + c0, D);
      for (int64_t i = c0; i < c0 + D; ++i) qt[i] = qt[i] * q_scale;
      // 5. decay for this token and head
      KdaDecay(z.data() + t * P + c0, w.A_log.data() + h, w.dt_bias.data() + c0, 1, D,
               d.gate_lb, g.data() + c0, alpha.data() + c0);
      const float beta = Sigmoid(b[static_cast<size_t>(t * H + h)]);  // 4. β per head
      // 6. recurrence, sequential over t
      float* oh = o.data() + t * P + c0;
      KdaRecurrenceStep(st->S.data() + h * D * D, qt + c0, kt + c0, v.data() + t * P + c0,
                        alpha.data() + c0, beta, D, oh);
      // 7. head-wise RMSNorm, then 8. sigmoid gate (norm FIRST)
      RmsNorm(oh, w.o_norm.data(), D, d.rms_eps, oh);
      const float* gh = gate.data() + t * P + c0;
      for (int64_t j = 0; j < D; ++j) oh[j] = oh[j] * Sigmoid(gh[j]);
    });
  }
  // 9. output projection
  kernels::MatMul(w.o_proj, o.data(), T, out);
}

}  // namespace k3::ops
