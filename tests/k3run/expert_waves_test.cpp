// engine/expert_waves.h: a streaming source's experts arrive one by one, and ExpertWaves
// computes them in rounds as they arrive, in waves of any size, on any thread count: the bits
// must be those of ops::MoeBlock with every expert at hand.
#include "k3run/engine/expert_waves.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "k3run/kernels/matmul.h"
#include "k3run/kernels/thread_pool.h"
#include "ops/random_model.h"

namespace k3::run {
namespace {

using ops::testing::RandomDims;
using ops::testing::RandomModel;

// Only the expert half of WeightSource. Reads arrive from the highest id of the wave down, one
// every other ExpertReady question; Expert() on one not arrived yet is the source waiting for it.
class ArrivingExperts final : public WeightSource {
 public:
  ArrivingExperts(ops::ExpertTable all, int64_t wave_size) : all_(all), wave_size_(wave_size) {}

  int64_t ExpertWaveSize() const override { return wave_size_; }
  void WillUse(int, std::span<const int32_t> wave) override {
    EXPECT_TRUE(not_looked.empty()) << "a wave began before the last one was released";
    in_flight.assign(wave.begin(), wave.end());
    not_looked = std::set<int64_t>(wave.begin(), wave.end());
    ++waves;
  }
  bool ExpertReady(int, int e) override {
    if (++asks % 2 == 0 && !in_flight.empty()) {
      arrived.insert(in_flight.back());
      in_flight.pop_back();
    }
    return arrived.count(e) > 0;
  }
  const ops::GluWeights* Expert(int, int e) override {
    EXPECT_EQ(not_looked.count(e), 1u) << "expert " << e << " looked up twice or not announced";
    if (arrived.count(e) == 0) {
      EXPECT_EQ(e, *not_looked.begin()) << "waited for a later expert first";
      ++waited;
      arrived.insert(e);
      in_flight.erase(std::find(in_flight.begin(), in_flight.end(), e));
    } else {
      ++ready_lookups;
    }
    not_looked.erase(e);
    looked.push_back(e);
    return all_[static_cast<size_t>(e)];
  }
  void ReleaseExperts(int) override {
    EXPECT_TRUE(not_looked.empty()) << "a wave was released with experts not looked up";
    ++releases;
  }

  Result<const ops::LayerWeights*> Layer(int) override { return Status::Invalid("unused"); }
  void ReleaseLayer(int) override {}
  Status EmbeddingRows(const int32_t*, int64_t, float*) override {
    return Status::Invalid("unused");
  }
  int64_t LmHeadChunkRows() const override { return 1; }
  Result<kernels::Matrix> LmHeadRows(int64_t, int64_t) override {
    return Status::Invalid("unused");
  }
  Result<const HeadWeights*> Head() override { return Status::Invalid("unused"); }
  ReadCounters Counters() const override { return {}; }
  const std::vector<ExpertFailure>& Failures() const override { return failures_; }
  uint64_t PlannedResidentBytes() const override { return 0; }

  std::vector<int64_t> in_flight, looked;
  std::set<int64_t> arrived, not_looked;
  int asks = 0, waited = 0, ready_lookups = 0, waves = 0, releases = 0;

 private:
  ops::ExpertTable all_;
  int64_t wave_size_;
  std::vector<ExpertFailure> failures_;
};

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(ExpertWaves, RoundsAsExpertsArriveEqualMoeBlock) {
  const int restore_threads = kernels::Threads();
  const ops::Dims d = RandomDims();
  RandomModel m(d);
  const ops::LayerWeights w = m.Layer(false, false);
  constexpr int64_t kT = 5;
  const std::vector<float> x = m.Activations(kT * d.hidden, 2.0f);
  const ops::ExpertTable all = m.Experts();
  std::vector<float> want(x.size());
  ops::MoeStats plain;
  ops::MoeBlock(w.moe, all, d, x.data(), kT, want.data(), &plain);
  const ops::Routing r = ops::Route(w.moe, d, x.data(), kT);
  const std::set<int64_t> used(r.idx.begin(), r.idx.end());
  ASSERT_GT(used.size(), 3u) << "the test needs several experts per wave";
  for (int64_t wave_size : {0, 1, 3}) {
    for (int threads : {1, 2}) {
      SCOPED_TRACE("wave size " + std::to_string(wave_size) + ", " + std::to_string(threads) +
                   " threads");
      kernels::SetThreads(threads);
      ArrivingExperts source(all, wave_size);
      ExpertWaves waves(&source, 0, d, r);
      waves.Start();
      EXPECT_EQ(source.waves, 1) << "wave 0's reads are issued by Start, before any work";
      ops::MoeScratch s;
      ops::MoeBegin(w.moe, d, x.data(), kT, &s);
      ops::MoeStats stats;
      waves.Run(&s, &stats);
      std::vector<float> got(x.size());
      ops::MoeCombine(w.moe, d, r, s, got.data());
      EXPECT_TRUE(SameBits(got, want)) << "ExpertWaves differs from MoeBlock";
      EXPECT_EQ(stats.experts_skipped, 0);
      std::sort(source.looked.begin(), source.looked.end());
      EXPECT_EQ(source.looked, std::vector<int64_t>(used.begin(), used.end()));
      const int64_t n_waves =
          wave_size == 0 ? 1 : (static_cast<int64_t>(used.size()) + wave_size - 1) / wave_size;
      EXPECT_EQ(source.waves, n_waves);
      EXPECT_EQ(source.releases, n_waves);
      EXPECT_GT(source.waited, 0);
      if (wave_size != 1) {
        EXPECT_GT(source.ready_lookups, 0) << "rounds never mixed arrivals";
      }
    }
  }
  kernels::SetThreads(restore_threads);
}

// An expert the source cannot give is skipped and counted, never substituted.
TEST(ExpertWaves, MissingExpertIsSkippedAndCounted) {
  const ops::Dims d = RandomDims();
  RandomModel m(d);
  const ops::LayerWeights w = m.Layer(false, false);
  const std::vector<float> x = m.Activations(2 * d.hidden, 2.0f);
  const ops::Routing r = ops::Route(w.moe, d, x.data(), 2);
  const ops::ExpertTable all = m.Experts();
  std::vector<const ops::GluWeights*> lossy(all.begin(), all.end());
  lossy[static_cast<size_t>(r.idx[0])] = nullptr;
  ArrivingExperts source(lossy, 0);
  ExpertWaves waves(&source, 0, d, r);
  waves.Start();
  ops::MoeScratch s;
  ops::MoeBegin(w.moe, d, x.data(), 2, &s);
  ops::MoeStats stats;
  waves.Run(&s, &stats);
  int64_t uses = 0;
  for (int32_t e : r.idx) uses += e == r.idx[0];
  EXPECT_EQ(stats.experts_skipped, uses);
  ASSERT_EQ(stats.missing.size(), 1u);
  EXPECT_EQ(stats.missing[0], r.idx[0]);
}

}  // namespace
}  // namespace k3::run
