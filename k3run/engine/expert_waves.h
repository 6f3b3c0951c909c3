// One MoE layer's routed experts, read through a WeightSource and computed as they arrive
// (DESIGN.md §7 "Multi-token passes", "Overlap").
//
// The pass's expert union (ascending ids) is visited in waves of at most
// WeightSource::ExpertWaveSize() experts (0: one wave), so a cache of S slots never needs more
// than it holds: a wave's reads are issued together (WillUse) and its slots released after its
// work (ReleaseExperts). Within a wave, experts compute in rounds: each round takes the first
// expert not yet computed (waiting for its read) plus every other one whose read is done
// (ExpertReady), and runs them in parallel, one expert per thread, while the wave's other reads
// load. Bits never depend on any of this: each expert writes only its own slots
// (ops::ExpertForward), summed in top-k order by ops::MoeCombine after the last wave.
#pragma once

#include <cstdint>
#include <vector>

#include "k3run/ops/moe.h"
#include "k3run/weights/weights.h"

namespace k3::run {

class ExpertWaves {
 public:
  // `source` and `routing` must outlive the object. `chosen`: the experts to compute (ascending,
  // each chosen by a row of `routing`); the default is every expert the routing chose.
  ExpertWaves(WeightSource* source, int layer, const ops::Dims& d, const ops::Routing& routing);
  ExpertWaves(WeightSource* source, int layer, const ops::Dims& d, const ops::Routing& routing,
              std::vector<int32_t> chosen);

  // Issues wave 0's reads: call it the moment routing is known, before the work that needs no
  // routed expert (ops::MoeBegin), so the reads overlap it.
  void Start();
  // Every wave into *s (after ops::MoeBegin); an expert the source could not give is skipped and
  // counted in *stats.
  void Run(ops::MoeScratch* s, ops::MoeStats* stats);
  // Seconds Run spent blocked on the source for an expert's bytes (the rest of it computed).
  double waited() const { return waited_; }

 private:
  struct Job {
    int32_t expert;
    int64_t first, n;  // its rows in rows_ (flat t·topk + j, ascending)
    const ops::GluWeights* w = nullptr;
    bool done = false;
  };
  void BeginWave(size_t wave_begin);
  void RunWave(size_t wave_begin, ops::MoeScratch* s, ops::MoeStats* stats);
  // Looks up the round's experts (the first one not done, waiting, then the ready ones).
  void TakeRound(size_t* next, ops::MoeStats* stats);

  WeightSource* source_;
  int layer_;
  ops::Dims dims_;
  const ops::Routing& routing_;
  std::vector<int32_t> chosen_;
  ops::SlotsByExpert slots_;  // of routing_
  size_t wave_size_;
  std::vector<Job> jobs_;
  std::vector<const Job*> round_;
  std::vector<int64_t> rows_;
  double waited_ = 0;
};

}  // namespace k3::run
