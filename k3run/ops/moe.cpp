// LatentMoE, step by step as MODEL.md §3.6 (step numbers in the comments).
#include "k3run/ops/moe.h"

#include <algorithm>

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
  for (int64_t t = 0; t < T; ++t) {  // 1.–4.
    RouteToken(w.gate, w.score_bias.data(), d, x + t * d.hidden, r.idx.data() + t * d.topk,
               r.weight.data() + t * d.topk);
  }
  return r;
}

void MoeApply(const MoeWeights& w, const Routing& r, const ExpertLookup& experts, const Dims& d,
              const float* x, int64_t T, float* out, MoeStats* stats,
              const ExpertWaves* waves, const float* pre_norm) {
  if (T <= 0) return;
  const int64_t E = d.hidden, Lt = d.latent, k = d.topk, I = d.moe_inter;
  auto buf = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n)); };

  // The experts this pass visits, ascending; wave 0's reads are issued before anything else so
  // that they load while the latent projection and the shared expert compute (DESIGN.md §7
  // "Overlap"). The order of independent computations never changes a bit.
  std::vector<int32_t> chosen(r.idx.begin(), r.idx.end());
  std::sort(chosen.begin(), chosen.end());
  chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
  const size_t wave_size =
      waves != nullptr && waves->max_experts > 0 ? static_cast<size_t>(waves->max_experts)
                                                 : std::max<size_t>(chosen.size(), 1);
  auto begin_wave = [&](size_t wave_begin) {
    const size_t wave_end = std::min(chosen.size(), wave_begin + wave_size);
    if (waves != nullptr && waves->begin && wave_begin < wave_end) {
      waves->begin(std::span<const int32_t>(chosen.data() + wave_begin, wave_end - wave_begin));
    }
  };
  begin_wave(0);
  if (waves != nullptr && waves->routed) waves->routed(pre_norm != nullptr ? pre_norm : x, T);

  // 5. latent down-projection
  std::vector<float> z = buf(T * Lt);
  kernels::MatMul(w.down, x, T, z.data());
  // 9. shared experts on the ORIGINAL x (added in step 10)
  std::vector<float> shared = buf(T * E);
  GluMlp(w.shared, d.situ_b1, d.situ_b2, x, T, shared.data());

  // 6a. each selected expert once, over all the rows that chose it; outputs into their slots.
  // A wave is computed in rounds: the first expert not yet computed is looked up (on this
  // thread: the source may wait for its read there), then every other one that is ready
  // (waves->ready), and the round's experts compute in parallel, one expert per chunk on one
  // thread (a routed expert's matrices are too small for a fork/join each) while the wave's
  // remaining reads load. An expert writes only its own rows of `work` and its own slots,
  // computed the same way on any thread in any round, so neither split changes a bit.
  std::vector<float> slots = buf(T * k * Lt);
  std::vector<char> have(static_cast<size_t>(T * k), 0);
  struct Job {
    int32_t expert;
    int64_t first, n;  // its rows in `rows` (flat t·k + j, ascending)
    const GluWeights* w = nullptr;
    bool done = false;
  };
  std::vector<Job> jobs;
  std::vector<const Job*> round;
  std::vector<int64_t> rows;
  std::vector<float> work;  // per gathered row: zin (then y) [Lt], g [I], u [I]
  const int64_t per_row = Lt + 2 * I;
  auto run_job = [&](const Job& job) {
    const int64_t n = job.n;
    const int64_t* job_rows = rows.data() + job.first;
    float* zin = work.data() + job.first * per_row;  // [n][Lt]; later y [n][Lt]
    float* g = zin + n * Lt;                          // [n][I]
    float* u = g + n * I;                             // [n][I]
    for (int64_t q = 0; q < n; ++q) {
      std::copy_n(z.data() + job_rows[q] / k * Lt, Lt, zin + q * Lt);
    }
    kernels::MatMulOnThisThread(job.w->gate, zin, n, g);
    kernels::MatMulOnThisThread(job.w->up, zin, n, u);
    SituGlu(g, u, n * I, d.situ_b1, d.situ_b2, g);
    float* y = zin;  // zin is dead once gate and up have read it
    kernels::MatMulOnThisThread(job.w->down, g, n, y);
    for (int64_t q = 0; q < n; ++q) {
      std::copy_n(y + q * Lt, Lt, slots.data() + job_rows[q] * Lt);
      have[static_cast<size_t>(job_rows[q])] = 1;
    }
  };
  for (size_t wave_begin = 0; wave_begin < chosen.size(); wave_begin += wave_size) {
    const size_t wave_end = std::min(chosen.size(), wave_begin + wave_size);
    if (wave_begin > 0) begin_wave(wave_begin);
    jobs.clear();
    rows.clear();
    for (size_t ci = wave_begin; ci < wave_end; ++ci) {
      const int64_t first = static_cast<int64_t>(rows.size());
      for (int64_t s = 0; s < T * k; ++s)
        if (r.idx[static_cast<size_t>(s)] == chosen[ci]) rows.push_back(s);
      jobs.push_back(Job{chosen[ci], first, static_cast<int64_t>(rows.size()) - first});
    }
    work.resize(rows.size() * static_cast<size_t>(per_row));
    for (size_t next = 0; next < jobs.size();) {
      round.clear();
      for (size_t ji = next; ji < jobs.size(); ++ji) {
        Job& job = jobs[ji];
        if (job.done) continue;
        if (ji != next && waves != nullptr && waves->ready && !waves->ready(job.expert)) continue;
        job.done = true;
        job.w = experts(job.expert);
        if (job.w == nullptr) {
          if (stats) {
            stats->experts_skipped += job.n;
            stats->missing.push_back(job.expert);
          }
          continue;
        }
        round.push_back(&job);
      }
      while (next < jobs.size() && jobs[next].done) ++next;
      kernels::ParallelChunks(kernels::Threads(), static_cast<int64_t>(round.size()),
                              [&](int64_t i) { run_job(*round[static_cast<size_t>(i)]); });
    }
    if (waves != nullptr && waves->end) waves->end();
  }

  // 6b. acc = Σ_j w_j·y_j in top-k order (fp32, acc starts at 0); 7. aggregate RMSNorm
  std::vector<float> acc = buf(T * Lt);
  for (int64_t t = 0; t < T; ++t) {
    float* a = acc.data() + t * Lt;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t s = t * k + j;
      if (!have[static_cast<size_t>(s)]) continue;
      const float wj = r.weight[static_cast<size_t>(s)];
      const float* ys = slots.data() + s * Lt;
      for (int64_t i = 0; i < Lt; ++i) a[i] = a[i] + wj * ys[i];
    }
    if (d.latent_norm) RmsNorm(a, w.norm.data(), Lt, d.rms_eps, a);
  }

  // 8. latent up-projection; 10. unweighted sum with the shared experts (step 9, above)
  kernels::MatMul(w.up, acc.data(), T, out);
  for (int64_t i = 0; i < T * E; ++i) out[i] = out[i] + shared[static_cast<size_t>(i)];
}

void MoeBlock(const MoeWeights& w, const ExpertLookup& experts, const Dims& d, const float* x,
              int64_t T, float* out, MoeStats* stats, const ExpertWaves* waves,
              const float* pre_norm) {
  const Routing r = Route(w, d, x, T);
  MoeApply(w, r, experts, d, x, T, out, stats, waves, pre_norm);
}

}  // namespace k3::ops
