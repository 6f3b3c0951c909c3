// MlaAttendMany's steps 3–5 (units of a block of rows × a group of heads sharing each read of the
// cache, step 5 blocked over positions, columns and head pairs) against the order
// k3run/ops/mla.h states, written here one head, one row and one position at a time with plain
// loops: the same bits on every ISA path and thread count. The dims reach every blocking edge:
// 21 heads (blocks of 2 rows; an odd last head pair) and 50 heads (more than kMlaUnitQueries:
// groups of 25, one row a block), kv_lora 88 (a 64-column block, a 16-column block, 8 columns
// one by one), caches of up to 150 positions (step 5's blocks of 64 positions and the scores'
// blocks of kMlaKeyBlock, each with a ragged last one), segments of 3, 0, 1 and 2 rows (a 1-row
// pass splits the heads further, so that every thread gets work).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "k3run/kernels/matmul.h"
#include "k3run/kernels/thread_pool.h"
#include "k3run/ops/mla.h"
#include "k3run/ops/norm.h"
#include "kernel_settings.h"

namespace k3::ops {
namespace {

using testing::KernelSettings;

Dims AttendDims(int64_t heads) {
  static_assert(kMlaUnitQueries >= 42 && kMlaUnitQueries < 50, "the dims below assume 48");
  static_assert(kMlaKeyBlock < 150 && 150 % kMlaKeyBlock != 0, "caches below span a ragged block");
  Dims d;
  d.n_heads = heads;
  d.kv_lora = 88;
  d.qk_nope = 24;
  d.qk_rope = 8;
  d.v_head = 16;
  return d;
}

std::vector<float> Normal(size_t n, std::mt19937* rng, float sd) {
  std::normal_distribution<float> g(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = g(*rng);
  return v;
}

// One sequence: its cache before the pass (`history` positions already in it) and its rows.
struct Sequence {
  int64_t history = 0, rows = 0;
};

struct Pass {
  MlaWeights w;
  std::vector<float> norm;
  std::vector<MlaCache> caches;
  std::vector<MlaSegment> segments;
  MlaRows rows;
};

Pass MakePass(const Dims& d, const std::vector<Sequence>& seqs, uint32_t seed) {
  std::mt19937 rng(seed);
  Pass p;
  p.norm = Normal(size_t(d.kv_lora), &rng, 0.2f);
  for (float& x : p.norm) x += 1.0f;
  p.w.kv_a_layernorm = p.norm;
  int64_t T = 0;
  for (const Sequence& s : seqs) {
    p.caches.push_back(MlaCache::Make(d, s.history + s.rows));
    MlaCache& c = p.caches.back();
    const std::vector<float> old = Normal(size_t(s.history * c.width), &rng, 1.0f);
    std::copy(old.begin(), old.end(), c.data.data());
    c.len = s.history;
    T += s.rows;
  }
  int64_t first = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    p.segments.push_back(MlaSegment{first, seqs[i].rows, &p.caches[i]});
    first += seqs[i].rows;
  }
  const int64_t H = d.n_heads, c = d.kv_lora;
  p.rows.T = T;
  p.rows.q = Normal(size_t(T * H * d.qk_head()), &rng, 1.0f);
  p.rows.ckv = Normal(size_t(T * MlaCacheWidth(d)), &rng, 1.0f);
  p.rows.qt = Normal(size_t(H * T * c), &rng, 0.5f);
  p.rows.obar.assign(size_t(H * T * c), std::nanf(""));
  return p;
}

// Steps 3–5 for head h of row t at cache length len, exactly as mla.h orders them.
void ReferenceHead(const Dims& d, const Pass& p, const MlaCache& cache, int64_t h, int64_t t,
                   int64_t len, float* o) {
  const int64_t H = d.n_heads, c = d.kv_lora, r = d.qk_rope, T = p.rows.T;
  const float* qt = p.rows.qt.data() + (h * T + t) * c;
  const float* rope = p.rows.q.data() + (t * H + h) * d.qk_head() + d.qk_nope;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.qk_head()));
  std::vector<float> score(static_cast<size_t>(len));
  for (int64_t s = 0; s < len; ++s) {
    const float* key = cache.row(s);
    double acc = 0.0;  // one rounding per term: the float product is exact in double
    for (int64_t j = 0; j < c; ++j) acc = acc + double(qt[j]) * double(key[j]);
    for (int64_t i = 0; i < r; ++i) acc = acc + double(rope[i]) * double(key[c + i]);
    score[size_t(s)] = static_cast<float>(acc) * scale;
  }
  Softmax(score.data(), len, score.data());
  for (int64_t j = 0; j < c; ++j) {
    float sum = 0.0f;
    for (int64_t s = 0; s < len; ++s) sum = sum + score[size_t(s)] * cache.row(s)[j];
    o[j] = sum;
  }
}

// Runs MlaAttendMany on a fresh pass and checks every ō element against ReferenceHead.
void CheckPass(int64_t heads, const std::vector<Sequence>& seqs, const std::string& what) {
  const Dims d = AttendDims(heads);
  Pass p = MakePass(d, seqs, 5);
  ASSERT_TRUE(MlaAttendMany(p.w, d, p.segments, &p.rows).ok()) << what;
  const int64_t c = d.kv_lora, T = p.rows.T;
  std::vector<float> ref(static_cast<size_t>(c));
  for (size_t i = 0; i < seqs.size(); ++i) {
    const MlaSegment& g = p.segments[i];
    ASSERT_EQ(g.cache->len, seqs[i].history + seqs[i].rows) << what;
    for (int64_t j = 0; j < g.n; ++j) {
      for (int64_t h = 0; h < d.n_heads; ++h) {
        const int64_t t = g.first + j;
        ReferenceHead(d, p, *g.cache, h, t, seqs[i].history + j + 1, ref.data());
        const float* got = p.rows.obar.data() + (h * T + t) * c;
        for (int64_t e = 0; e < c; ++e) {
          ASSERT_EQ(std::memcmp(&got[e], &ref[size_t(e)], sizeof(float)), 0)
              << what << ": sequence " << i << " row " << j << " head " << h << " element " << e
              << ": " << got[e] << " vs " << ref[size_t(e)] << " in the per-head order";
        }
      }
    }
  }
}

TEST(MlaAttend, BlocksOfRowsAndHeadsEqualThePerHeadOrderOnEveryPathAndThreadCount) {
  KernelSettings restore;
  const std::vector<Sequence> prefill = {{147, 3}, {5, 0}, {0, 1}, {63, 2}};
  const std::vector<Sequence> decode = {{149, 1}};
  int paths = 0;
  for (kernels::Isa isa : {kernels::Isa::kScalar, kernels::Isa::kAvx2, kernels::Isa::kAvx512}) {
    if (!kernels::IsaSupported(isa)) continue;  // the paths this CPU has; scalar always
    ++paths;
    kernels::SetIsa(isa);
    for (int threads : {1, 2, 3}) {
      kernels::SetThreads(threads);
      const std::string at = std::string(kernels::IsaName(isa)) + ", " + std::to_string(threads) +
                             " threads";
      for (int64_t heads : {21, 50}) {
        const std::string with = std::to_string(heads) + " heads, " + at;
        CheckPass(heads, prefill, "4 sequences, " + with);
        CheckPass(heads, decode, "1 row, " + with);
      }
    }
  }
  EXPECT_GE(paths, 1);
}

// The scratch is kept between calls: a long call, then a short one, then a long one again give
// the bits of fresh calls (nothing read from an earlier call's scores).
TEST(MlaAttend, ScratchKeptBetweenCallsChangesNoBit) {
  CheckPass(21, {{150, 2}}, "long");
  CheckPass(21, {{3, 1}}, "short after long");
  CheckPass(50, {{120, 3}, {1, 1}}, "long again, more heads");
}

}  // namespace
}  // namespace k3::ops
