// The latent cache grows with the context: reserved for its capacity, resident only for the
// positions written (ops/mla.h), and the reservation changes no bit.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "k3run/ops/layer.h"
#include "random_model.h"

namespace k3::ops {
namespace {

using testing::RandomDims;
using testing::RandomModel;

uint64_t PagesFor(int64_t floats) {
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return (static_cast<uint64_t>(floats) * 4 + page - 1) / page * page;
}

TEST(MlaCache, ResidentMemoryFollowsThePositionsWritten) {
  const Dims d = RandomDims();
  RandomModel m(d);
  const LayerWeights w = m.Layer(true, false);
  const int64_t capacity = 1 << 20;  // the release's longest context
  MlaCache big = MlaCache::Make(d, capacity);
  EXPECT_EQ(big.data.size(), static_cast<size_t>(capacity * big.width));
  EXPECT_EQ(big.data.ResidentBytes(), 0u);

  const int64_t T = 5;
  const std::vector<float> x = m.Activations(T * d.hidden);
  std::vector<float> y_big(x.size()), y_small(x.size());
  ASSERT_TRUE(MlaLayer(w.mla, d, x.data(), 3, &big, y_big.data()).ok());
  ASSERT_TRUE(MlaLayer(w.mla, d, x.data() + 3 * d.hidden, 2, &big, y_big.data() + 3 * d.hidden)
                  .ok());
  EXPECT_EQ(big.len, T);
  // Writing T rows commits the pages they span and nothing past them (reading the untouched
  // rows past len would map only the shared zero page).
  EXPECT_EQ(big.data.ResidentBytes(), PagesFor(T * big.width));

  // Same bits as a cache that holds exactly T positions.
  MlaCache small = MlaCache::Make(d, T);
  ASSERT_TRUE(MlaLayer(w.mla, d, x.data(), 3, &small, y_small.data()).ok());
  ASSERT_TRUE(MlaLayer(w.mla, d, x.data() + 3 * d.hidden, 2, &small,
                       y_small.data() + 3 * d.hidden)
                  .ok());
  EXPECT_EQ(0, std::memcmp(y_big.data(), y_small.data(), y_big.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(big.data.data(), small.data.data(), T * big.width * sizeof(float)));

  // A reset sequence gives its memory back and starts again from zeros.
  big.len = 0;
  big.data.Release();
  EXPECT_EQ(big.data.ResidentBytes(), 0u);
  std::vector<float> y_again(x.size());
  ASSERT_TRUE(MlaLayer(w.mla, d, x.data(), T, &big, y_again.data()).ok());
  EXPECT_EQ(0, std::memcmp(y_again.data(), y_small.data(), y_again.size() * sizeof(float)));
}

}  // namespace
}  // namespace k3::ops
