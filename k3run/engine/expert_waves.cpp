#include "k3run/engine/expert_waves.h"

#include <algorithm>
#include <chrono>
#include <span>
#include <utility>

#include "k3run/kernels/thread_pool.h"

namespace k3::run {

ExpertWaves::ExpertWaves(WeightSource* source, int layer, const ops::Dims& d,
                         const ops::Routing& routing)
    : ExpertWaves(source, layer, d, routing, ops::SelectedExperts(routing)) {}

ExpertWaves::ExpertWaves(WeightSource* source, int layer, const ops::Dims& d,
                         const ops::Routing& routing, std::vector<int32_t> chosen)
    : source_(source),
      layer_(layer),
      dims_(d),
      routing_(routing),
      chosen_(std::move(chosen)),
      slots_(routing) {
  const int64_t max_experts = source_->ExpertWaveSize();
  wave_size_ = max_experts > 0 ? static_cast<size_t>(max_experts)
                               : std::max<size_t>(chosen_.size(), 1);
}

void ExpertWaves::BeginWave(size_t wave_begin) {
  const size_t wave_end = std::min(chosen_.size(), wave_begin + wave_size_);
  if (wave_begin < wave_end) {
    source_->WillUse(layer_, std::span<const int32_t>(chosen_.data() + wave_begin,
                                                      wave_end - wave_begin));
  }
}

void ExpertWaves::Start() { BeginWave(0); }

void ExpertWaves::Run(ops::MoeScratch* s, ops::MoeStats* stats) {
  for (size_t wave_begin = 0; wave_begin < chosen_.size(); wave_begin += wave_size_) {
    if (wave_begin > 0) BeginWave(wave_begin);
    RunWave(wave_begin, s, stats);
    source_->ReleaseExperts(layer_);
  }
}

void ExpertWaves::RunWave(size_t wave_begin, ops::MoeScratch* s, ops::MoeStats* stats) {
  const size_t wave_end = std::min(chosen_.size(), wave_begin + wave_size_);
  jobs_.clear();
  rows_.clear();
  for (size_t ci = wave_begin; ci < wave_end; ++ci) {
    const int64_t first = static_cast<int64_t>(rows_.size());
    slots_.AppendRowsOf(chosen_[ci], &rows_);
    jobs_.push_back(Job{chosen_[ci], first, static_cast<int64_t>(rows_.size()) - first});
  }
  const auto need = static_cast<size_t>(ops::ExpertWorkFloats(dims_, static_cast<int64_t>(rows_.size())));
  if (s->work.size() < need) s->work.resize(need);
  for (size_t next = 0; next < jobs_.size();) {
    TakeRound(&next, stats);
    kernels::ParallelChunks(kernels::Threads(), static_cast<int64_t>(round_.size()),
                            [&](int64_t i) {
                              const Job& job = *round_[static_cast<size_t>(i)];
                              ops::ExpertForward(*job.w, dims_, rows_.data() + job.first, job.n,
                                                 s->work.data() +
                                                     ops::ExpertWorkFloats(dims_, job.first),
                                                 s);
                            });
  }
}

void ExpertWaves::TakeRound(size_t* next, ops::MoeStats* stats) {
  round_.clear();
  for (size_t ji = *next; ji < jobs_.size(); ++ji) {
    Job& job = jobs_[ji];
    if (job.done) continue;
    if (ji != *next && !source_->ExpertReady(layer_, job.expert)) continue;
    job.done = true;
    const auto t0 = std::chrono::steady_clock::now();
    job.w = source_->Expert(layer_, job.expert);  // the first job of a round may wait here
    waited_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (job.w == nullptr) {
      if (stats) {
        stats->experts_skipped += job.n;
        stats->missing.push_back(job.expert);
      }
      continue;
    }
    round_.push_back(&job);
  }
  while (*next < jobs_.size() && jobs_[*next].done) ++*next;
}

}  // namespace k3::run
