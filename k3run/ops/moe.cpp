// LatentMoE, step by step as MODEL.md §3.6 (step numbers in the comments).
#include "k3run/ops/moe.h"

#include <algorithm>
#include <limits>

#include "k3run/kernels/router_dot.h"
#include "k3run/kernels/thread_pool.h"
#include "k3run/ops/activation.h"
#include "k3run/ops/glu.h"
#include "k3run/ops/norm.h"
#include "k3run/ops/router.h"

namespace k3::ops {

Routing Route(const MoeWeights& w, const Dims& d, const float* x, int64_t T) {
  Routing r;
  r.T = T;
  r.topk = d.topk;
  r.idx.resize(static_cast<size_t>(T * d.topk));
  r.weight.resize(static_cast<size_t>(T * d.topk));
  // 1. every row's logits in one pass over the gate (row t's bits are RouteToken's), 2.–4. each
  // row's selection
  // Every element is written by RouterLogitsRows: a buffer kept by the calling thread, grown
  // once, instead of a cleared one per layer (1.8 MB at 256 rows of the bench preset, zeroed on
  // the engine thread alone).
  thread_local std::vector<double> buffer;
  if (buffer.size() < static_cast<size_t>(T * d.n_experts)) {
    buffer.resize(static_cast<size_t>(T * d.n_experts));
  }
  // The lambda below runs on other threads too: it must see this thread's buffer, by pointer.
  double* const logits = buffer.data();
  kernels::RouterLogitsRows(w.gate, x, T, logits);
  kernels::ParallelChunks(kernels::Threads(), T, [&](int64_t t) {
    SelectExperts(logits + t * d.n_experts, w.score_bias.data(), d,
                  r.idx.data() + t * d.topk, r.weight.data() + t * d.topk);
  });
  return r;
}

std::vector<int32_t> SelectedExperts(const Routing& r) {
  std::vector<int32_t> chosen(r.idx.begin(), r.idx.end());
  std::sort(chosen.begin(), chosen.end());
  chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
  return chosen;
}

void RowsOf(const Routing& r, int32_t expert, std::vector<int64_t>* rows) {
  for (int64_t s = 0; s < r.T * r.topk; ++s)
    if (r.idx[static_cast<size_t>(s)] == expert) rows->push_back(s);
}

SlotsByExpert::SlotsByExpert(const Routing& r) {
  by_expert_.reserve(r.idx.size());
  for (size_t s = 0; s < r.idx.size(); ++s) by_expert_.emplace_back(r.idx[s], static_cast<int64_t>(s));
  std::sort(by_expert_.begin(), by_expert_.end());
}

void SlotsByExpert::AppendRowsOf(int32_t expert, std::vector<int64_t>* rows) const {
  auto it = std::lower_bound(by_expert_.begin(), by_expert_.end(),
                             std::pair<int32_t, int64_t>{expert, std::numeric_limits<int64_t>::min()});
  for (; it != by_expert_.end() && it->first == expert; ++it) rows->push_back(it->second);
}

void MoeBegin(const MoeWeights& w, const Dims& d, const float* x, int64_t T, MoeScratch* s) {
  s->T = T;
  // 5. latent down-projection
  s->z.assign(static_cast<size_t>(T * d.latent), 0.0f);
  kernels::MatMul(w.down, x, T, s->z.data());
  // 9. shared experts on the ORIGINAL x (added in step 10)
  s->shared.assign(static_cast<size_t>(T * d.hidden), 0.0f);
  GluMlp(w.shared, d.situ_b1, d.situ_b2, x, T, s->shared.data());
  // Not cleared (8 MB a layer at 256 rows of the bench preset, on one thread): a slot is read
  // only where `have` says it was written in this layer.
  s->slots.resize(static_cast<size_t>(T * d.topk * d.latent));
  s->have.assign(static_cast<size_t>(T * d.topk), 0);
}

int64_t ExpertWorkFloats(const Dims& d, int64_t n) { return n * (d.latent + 2 * d.moe_inter); }

// 6a. One expert over the rows that chose it. A routed expert's matrices are too small for a
// fork/join each, so it runs on the calling thread (callers run several experts in parallel).
void ExpertForward(const GluWeights& e, const Dims& d, const int64_t* rows, int64_t n,
                   float* work, MoeScratch* s) {
  const int64_t Lt = d.latent, k = d.topk, I = d.moe_inter;
  float* zin = work;         // [n][Lt]; later y [n][Lt]
  float* g = zin + n * Lt;   // [n][I]
  float* u = g + n * I;      // [n][I]
  for (int64_t q = 0; q < n; ++q) std::copy_n(s->z.data() + rows[q] / k * Lt, Lt, zin + q * Lt);
  kernels::MatMulOnThisThread(e.gate, zin, n, g);
  kernels::MatMulOnThisThread(e.up, zin, n, u);
  SituGlu(g, u, n * I, d.situ_b1, d.situ_b2, g);
  float* y = zin;  // zin is dead once gate and up have read it
  kernels::MatMulOnThisThread(e.down, g, n, y);
  for (int64_t q = 0; q < n; ++q) {
    std::copy_n(y + q * Lt, Lt, s->slots.data() + rows[q] * Lt);
    s->have[static_cast<size_t>(rows[q])] = 1;
  }
}

void MoeCombine(const MoeWeights& w, const Dims& d, const Routing& r, const MoeScratch& s,
                float* out) {
  const int64_t T = s.T, E = d.hidden, Lt = d.latent, k = d.topk;
  // 6b. acc = Σ_j w_j·y_j in top-k order (fp32, acc starts at 0); 7. aggregate RMSNorm
  // Rows are independent: on the compute threads.
  std::vector<float> acc(static_cast<size_t>(T * Lt), 0.0f);
  kernels::ParallelChunks(kernels::Threads(), T, [&](int64_t t) {
    float* a = acc.data() + t * Lt;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t slot = t * k + j;
      if (!s.have[static_cast<size_t>(slot)]) continue;
      const float wj = r.weight[static_cast<size_t>(slot)];
      const float* ys = s.slots.data() + slot * Lt;
      for (int64_t i = 0; i < Lt; ++i) a[i] = a[i] + wj * ys[i];
    }
    if (d.latent_norm) RmsNorm(a, w.norm.data(), Lt, d.rms_eps, a);
  });
  // 8. latent up-projection; 10. unweighted sum with the shared experts (step 9)
  kernels::MatMul(w.up, acc.data(), T, out);
  kernels::ParallelChunks(kernels::Threads(), T, [&](int64_t t) {
    for (int64_t i = t * E; i < (t + 1) * E; ++i) out[i] = out[i] + s.shared[static_cast<size_t>(i)];
  });
}

void MoeBlock(const MoeWeights& w, ExpertTable experts, const Dims& d, const float* x,
              int64_t T, float* out, MoeStats* stats) {
  if (T <= 0) return;
  const Routing r = Route(w, d, x, T);
  MoeScratch s;
  MoeBegin(w, d, x, T, &s);
  struct Job {
    const GluWeights* w;
    int64_t first, n;  // its rows in `rows`
  };
  std::vector<Job> jobs;
  std::vector<int64_t> rows;
  const SlotsByExpert slots(r);
  for (int32_t e : SelectedExperts(r)) {
    const int64_t first = static_cast<int64_t>(rows.size());
    slots.AppendRowsOf(e, &rows);
    const int64_t n = static_cast<int64_t>(rows.size()) - first;
    const GluWeights* ew =
        e >= 0 && static_cast<size_t>(e) < experts.size() ? experts[static_cast<size_t>(e)]
                                                          : nullptr;
    if (ew == nullptr) {
      if (stats) {
        stats->experts_skipped += n;
        stats->missing.push_back(e);
      }
      continue;
    }
    jobs.push_back(Job{ew, first, n});
  }
  s.work.resize(static_cast<size_t>(ExpertWorkFloats(d, static_cast<int64_t>(rows.size()))));
  kernels::ParallelChunks(kernels::Threads(), static_cast<int64_t>(jobs.size()), [&](int64_t i) {
    const Job& j = jobs[static_cast<size_t>(i)];
    ExpertForward(*j.w, d, rows.data() + j.first, j.n,
                  s.work.data() + ExpertWorkFloats(d, j.first), &s);
  });
  MoeCombine(w, d, r, s, out);
}

}  // namespace k3::ops
