// CacheTraceWriter (k3run/stream/cache_trace.h) and scripts/cache-replay: the file format, atomic
// writes, header validation, and the replay reproducing a real ExpertCache driven the way
// StreamingWeights::WillUse drives it, plus hand-computed LRU/S3-FIFO/Belady numbers.
#include "k3run/stream/cache_trace.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3run/stream/expert_cache.h"
#include "tests/support/fault_env.h"
#include "tests/support/files.h"
#include "tests/support/temp_dir.h"

namespace k3::run {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

CacheTraceHeader SmallHeader(int slots, CachePolicy policy) {
  CacheTraceHeader h;
  h.n_layers = 4;
  h.first_dense = 1;
  h.n_experts = 24;
  h.topk = 3;
  h.expert_slots = slots;
  h.expert_slot_bytes = 4096;
  h.policy = policy;
  h.prepared_dir = "/prepared/small";
  return h;
}

std::string Slurp(const std::string& path) { return test::ReadWholeFile(path); }

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string line; std::getline(ss, line);) out.push_back(line);
  return out;
}

struct ScriptRun {
  int exit_code = -1;
  std::string out, err;
};

// Runs scripts/cache-replay from the source tree (the test must exercise the committed script).
ScriptRun Replay(const std::string& trace_dir, const std::string& args) {
  k3::test::TempDir scratch;
  const std::string err_path = scratch.Join("stderr.txt");
  const std::string cmd = std::string("python3 '") + K3_SOURCE_DIR + "/scripts/cache-replay' '" +
                          trace_dir + "' " + args + " 2>'" + err_path + "'";
  ScriptRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) {
    ADD_FAILURE() << "popen failed: " << cmd;
    return r;
  }
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = Slurp(err_path);
  return r;
}

json ReplayJson(const std::string& trace_dir, const std::string& args, int want_exit = 0) {
  ScriptRun r = Replay(trace_dir, "--json " + args);
  EXPECT_EQ(r.exit_code, want_exit) << r.out << r.err;
  json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << "not JSON: " << r.out << r.err;
  return j;
}

// The row for `capacity` of the replay's JSON output.
json Row(const json& j, int capacity) {
  for (const json& r : j.at("capacities")) {
    if (r.at("capacity") == capacity) return r;
  }
  ADD_FAILURE() << "no row for capacity " << capacity << " in " << j.dump();
  return json::object();
}

std::unique_ptr<CacheTraceWriter> MakeWriter(Env* env, const std::string& dir,
                                             const CacheTraceHeader& h) {
  auto w = CacheTraceWriter::Create(env, dir, h);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  return w.ok() ? std::move(w).value() : nullptr;
}

// ---------------------------------------------------------------------------------------------
// A seeded routing history, and the engine's cache protocol over it.

// One MoE layer of one forward pass: the ascending union of the experts its tokens chose.
struct Pass {
  int64_t step;
  int layer;
  std::vector<int32_t> experts;
};

// Step 0 is a prefill of `prefill_tokens` tokens, then one token per step, except that every
// `wide_every`-th step (0: none) also feeds `prefill_tokens` tokens (like a speculative
// verification pass), so multi-wave passes meet a warm cache. Each token picks topk distinct
// experts with a skew (low ids are popular) so that caching pays and policies differ.
std::vector<Pass> RandomPasses(const CacheTraceHeader& h, int steps, int prefill_tokens,
                               uint32_t seed, int wide_every = 0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<Pass> passes;
  for (int64_t step = 0; step < steps; ++step) {
    const bool wide = step == 0 || (wide_every > 0 && step % wide_every == 0);
    const int tokens = wide ? prefill_tokens : 1;
    for (int layer = h.first_dense; layer < h.n_layers; ++layer) {
      std::vector<int32_t> all;
      for (int t = 0; t < tokens; ++t) {
        std::vector<int32_t> picked;
        while (static_cast<int>(picked.size()) < h.topk) {
          const double x = u(rng);
          const auto e = static_cast<int32_t>(x * x * h.n_experts);
          if (std::find(picked.begin(), picked.end(), e) == picked.end()) picked.push_back(e);
        }
        all.insert(all.end(), picked.begin(), picked.end());
      }
      std::sort(all.begin(), all.end());
      all.erase(std::unique(all.begin(), all.end()), all.end());
      passes.push_back(Pass{step, layer, all});
    }
  }
  return passes;
}

// Exactly what ExpertWaves (k3run/engine) + StreamingWeights do: waves of max(1, slots − 1) ascending ids;
// per wave Lookup each (hit → pin), Reserve the missing ones in order, UnpinAll at the end.
CacheTraceCounters DriveEngine(const CacheTraceHeader& h, const std::vector<Pass>& passes,
                               int slots, CachePolicy policy, CacheTraceWriter* trace) {
  ExpertCache cache(slots, policy);
  CacheTraceCounters c;
  const size_t wave = static_cast<size_t>(std::max(1, slots - 1));
  for (const Pass& p : passes) {
    for (size_t b = 0; b < p.experts.size(); b += wave) {
      const size_t n = std::min(wave, p.experts.size() - b);
      std::span<const int32_t> ids(p.experts.data() + b, n);
      if (trace != nullptr) trace->Wave(p.step, p.layer, ids);
      std::vector<uint64_t> missing;
      for (int32_t e : ids) {
        const uint64_t key =
            uint64_t(p.layer - h.first_dense) * uint64_t(h.n_experts) + uint64_t(e);
        ++c.requests;
        const int s = cache.Lookup(key);
        if (s >= 0) {
          ++c.true_hits;
          cache.Pin(s);
        } else {
          missing.push_back(key);
        }
      }
      for (uint64_t key : missing) {
        EXPECT_GE(cache.Reserve(key), 0) << "wave larger than the cache";
        ++c.reads;
      }
      cache.UnpinAll();
    }
  }
  c.evictions = cache.evictions();
  return c;
}

// ---------------------------------------------------------------------------------------------
// Writer: format

TEST(CacheTraceWriter, WritesHeaderLineThenOneLinePerWave) {
  k3::test::TempDir tmp;
  const std::string dir = tmp.Join("trace");  // does not exist yet: Create makes it
  CacheTraceHeader h = SmallHeader(5, CachePolicy::kLru);
  auto w = MakeWriter(Env::Default(), dir, h);
  ASSERT_NE(w, nullptr);
  const std::vector<int32_t> a{1, 3, 6};
  w->Wave(0, 1, a);
  w->Wave(7, 3, std::span<const int32_t>());
  w->SetEngineCounters(CacheTraceCounters{3, 1, 2, 0});
  ASSERT_TRUE(w->Finish().ok());
  EXPECT_EQ(w->path(), dir + "/cache-trace.jsonl");

  const std::vector<std::string> lines = Lines(Slurp(dir + "/cache-trace.jsonl"));
  ASSERT_EQ(lines.size(), 3u);
  const json head = json::parse(lines[0]);
  EXPECT_EQ(head.at("format"), "k3-cache-trace");
  EXPECT_EQ(head.at("version"), 1);
  EXPECT_EQ(head.at("n_layers"), 4);
  EXPECT_EQ(head.at("first_moe_layer"), 1);
  EXPECT_EQ(head.at("n_experts"), 24);
  EXPECT_EQ(head.at("topk"), 3);
  EXPECT_EQ(head.at("expert_slots"), 5);
  EXPECT_EQ(head.at("expert_slot_bytes"), 4096);
  EXPECT_EQ(head.at("policy"), "lru");
  EXPECT_EQ(head.at("prepared_dir"), "/prepared/small");
  EXPECT_EQ(head.at("waves"), 2);
  EXPECT_EQ(head.at("expert_ids"), 3);
  EXPECT_EQ(head.at("engine"),
            json({{"requests", 3}, {"true_hits", 1}, {"reads", 2}, {"evictions", 0}}));
  EXPECT_EQ(lines[1], R"({"step":0,"layer":1,"experts":[1,3,6]})");
  EXPECT_EQ(lines[2], R"({"step":7,"layer":3,"experts":[]})");
  // No temporary left behind.
  EXPECT_EQ(tmp.List(), std::vector<std::string>{"trace"});
  EXPECT_FALSE(fs::exists(dir + "/cache-trace.jsonl.k3tmp"));
}

TEST(CacheTraceWriter, EngineIsNullWithoutCounters) {
  k3::test::TempDir tmp;
  auto w = MakeWriter(Env::Default(), tmp.path(), SmallHeader(5, CachePolicy::kS3Fifo));
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->Finish().ok());
  const json head = json::parse(Lines(Slurp(w->path())).at(0));
  EXPECT_TRUE(head.at("engine").is_null());
  EXPECT_EQ(head.at("policy"), "s3fifo");
  EXPECT_EQ(head.at("waves"), 0);
}

TEST(CacheTraceWriter, NonUtf8PreparedDirStillGivesValidJson) {
  k3::test::TempDir tmp;
  CacheTraceHeader h = SmallHeader(5, CachePolicy::kLru);
  h.prepared_dir = "/p/\xff\xfe";
  auto w = MakeWriter(Env::Default(), tmp.path(), h);
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->Finish().ok());
  const json head = json::parse(Lines(Slurp(w->path())).at(0), nullptr, false);
  ASSERT_FALSE(head.is_discarded());
  EXPECT_EQ(head.at("prepared_dir"), "/p/\xEF\xBF\xBD\xEF\xBF\xBD");  // U+FFFD each
}

// ---------------------------------------------------------------------------------------------
// Writer: one test per header / directory rule

void ExpectCreateFails(const CacheTraceHeader& h, const std::string& field,
                       const std::string& rule) {
  k3::test::TempDir tmp;
  auto w = CacheTraceWriter::Create(Env::Default(), tmp.path(), h);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), Code::kInvalid);
  const std::string& m = w.status().message();
  EXPECT_NE(m.find("--dump-cache-trace " + tmp.path()), std::string::npos) << m;
  EXPECT_NE(m.find(field), std::string::npos) << m;
  EXPECT_NE(m.find(rule), std::string::npos) << m;
  EXPECT_TRUE(tmp.List().empty()) << "a rejected header must not create files";
}

TEST(CacheTraceWriterHeader, NLayersMustBePositive) {
  CacheTraceHeader h = SmallHeader(5, CachePolicy::kLru);
  h.n_layers = 0;
  h.first_dense = 0;
  ExpectCreateFails(h, "n_layers = 0", "n_layers >= 1");
}

TEST(CacheTraceWriterHeader, FirstDenseMustBeWithinLayers) {
  CacheTraceHeader h = SmallHeader(5, CachePolicy::kLru);
  h.first_dense = 5;
  ExpectCreateFails(h, "first_dense = 5", "0 <= first_dense <= n_layers");
}

TEST(CacheTraceWriterHeader, NExpertsMustBePositive) {
  CacheTraceHeader h = SmallHeader(5, CachePolicy::kLru);
  h.n_experts = 0;
  ExpectCreateFails(h, "n_experts = 0", "n_experts >= 1");
}

TEST(CacheTraceWriterHeader, TopkMustBeAtMostNExperts) {
  CacheTraceHeader h = SmallHeader(30, CachePolicy::kLru);
  h.topk = 25;
  ExpectCreateFails(h, "topk = 25", "1 <= topk <= n_experts");
}

TEST(CacheTraceWriterHeader, ExpertSlotsMustBeAtLeastTopkPlusOne) {
  ExpectCreateFails(SmallHeader(3, CachePolicy::kLru), "expert_slots = 3",
                    "expert_slots >= topk + 1");
}

TEST(CacheTraceWriterDir, EmptyDirIsRejected) {
  auto w = CacheTraceWriter::Create(Env::Default(), "", SmallHeader(5, CachePolicy::kLru));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), Code::kInvalid);
  EXPECT_NE(w.status().message().find("--dump-cache-trace: empty directory"), std::string::npos)
      << w.status().message();
}

TEST(CacheTraceWriterDir, DirThatIsAFileIsRejectedAtCreate) {
  k3::test::TempDir tmp;
  const std::string file = tmp.WriteFile("plain", "x");
  auto w = CacheTraceWriter::Create(Env::Default(), file, SmallHeader(5, CachePolicy::kLru));
  ASSERT_FALSE(w.ok());
  const std::string& m = w.status().message();
  EXPECT_NE(m.find("--dump-cache-trace " + file), std::string::npos) << m;
  EXPECT_NE(m.find("not a directory"), std::string::npos) << m;
  EXPECT_NE(m.find("choose a writable directory"), std::string::npos) << m;
}

TEST(CacheTraceWriterDir, CreateMakesNestedDirsAndLeavesNoProbeFile) {
  k3::test::TempDir tmp;
  const std::string dir = tmp.Join("a/b/c");
  auto w = MakeWriter(Env::Default(), dir, SmallHeader(5, CachePolicy::kLru));
  ASSERT_NE(w, nullptr);
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_TRUE(fs::is_empty(dir)) << "nothing may appear before Finish";
}

// ---------------------------------------------------------------------------------------------
// Writer: atomicity (FaultEnv)

TEST(CacheTraceWriterAtomic, FailedWriteLeavesNoFileUnderFinalName) {
  k3::test::TempDir tmp;
  k3::test::FaultEnv env;
  auto w = MakeWriter(&env, tmp.path(), SmallHeader(5, CachePolicy::kLru));
  ASSERT_NE(w, nullptr);
  const std::vector<int32_t> ids{0, 1, 2, 3};
  for (int i = 0; i < 100; ++i) w->Wave(i, 1, ids);
  env.SetRule(w->path(), k3::test::FaultRule::EnospcAfter(100));
  Status s = w->Finish();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kIo);
  EXPECT_NE(s.message().find("--dump-cache-trace: writing " + w->path()), std::string::npos)
      << s.message();
  EXPECT_FALSE(fs::exists(w->path()));
  EXPECT_FALSE(fs::exists(w->path() + ".k3tmp"));
  // Once the disk has room again, Finish writes the complete trace.
  env.ClearRules();
  ASSERT_TRUE(w->Finish().ok());
  EXPECT_EQ(Lines(Slurp(w->path())).size(), 101u);
}

TEST(CacheTraceWriterAtomic, FailedRenameKeepsTheOlderTrace) {
  k3::test::TempDir tmp;
  k3::test::FaultEnv env;
  const std::string old_trace = tmp.WriteFile("cache-trace.jsonl", "older trace\n");
  auto w = MakeWriter(&env, tmp.path(), SmallHeader(5, CachePolicy::kLru));
  ASSERT_NE(w, nullptr);
  const std::vector<int32_t> ids{4};
  w->Wave(0, 2, ids);
  env.SetRule(w->path(), k3::test::FaultRule::RenameFails());
  ASSERT_FALSE(w->Finish().ok());
  EXPECT_EQ(Slurp(old_trace), "older trace\n");
  EXPECT_FALSE(fs::exists(w->path() + ".k3tmp"));
}

// ---------------------------------------------------------------------------------------------
// Replay: hand-computed traces

// One MoE layer, 4 experts, top-1, 3 slots; one expert per wave: 0 1 2 0 3 0 1 2.
//   LRU:    0m 1m 2m | 0 hit (order 1,2,0) | 3m evicts 1 (2,0,3) | 0 hit (2,3,0) |
//           1m evicts 2 (3,0,1) | 2m evicts 3          → 2 hits / 8, 3 evictions.
//   Belady: 0m 1m 2m | 0 hit | 3m: next uses 0@5, 1@6, 2@7 → evict 2 | 0 hit | 1 hit |
//           2m (everything resident is never used again) → 3 hits / 8.
//   S3-FIFO (small target max(1, 3/10) = 1): slots 0,1,2 ← keys 0,1,2 in small | 0 hit (freq 1) |
//           3m: small head key 0 has freq 1 → main; next head key 1 (freq 0) evicted, ghost {1};
//           3 → small | 0 hit | 1m: small head key 2 evicted, ghost {1,2}; 1 is a ghost → main |
//           2m: small head key 3 evicted; 2 is a ghost → main   → 2 hits / 8.
TEST(CacheReplay, HandComputedSingleExpertWaves) {
  k3::test::TempDir tmp;
  CacheTraceHeader h = SmallHeader(3, CachePolicy::kLru);
  h.n_layers = 1;
  h.first_dense = 0;
  h.n_experts = 4;
  h.topk = 1;
  auto w = MakeWriter(Env::Default(), tmp.path(), h);
  ASSERT_NE(w, nullptr);
  const int32_t seq[] = {0, 1, 2, 0, 3, 0, 1, 2};
  for (int i = 0; i < 8; ++i) w->Wave(i, 0, std::span<const int32_t>(&seq[i], 1));
  w->SetEngineCounters(CacheTraceCounters{8, 2, 6, 3});  // the LRU derivation above
  ASSERT_TRUE(w->Finish().ok());

  json j = ReplayJson(tmp.path(), "--capacities 3");
  const json row = Row(j, 3);
  EXPECT_EQ(row.at("lru").at("requests"), 8);
  EXPECT_EQ(row.at("lru").at("true_hits"), 2);
  EXPECT_EQ(row.at("lru").at("evictions"), 3);
  EXPECT_EQ(row.at("s3fifo").at("true_hits"), 2);
  EXPECT_EQ(row.at("belady").at("true_hits"), 3);
  EXPECT_DOUBLE_EQ(row.at("belady").at("hit_rate").get<double>(), 3.0 / 8.0);
  EXPECT_EQ(j.at("engine_check").at("result"), "MATCH");
}

// One MoE layer, 4 experts, top-2, 3 slots (waves of ≤ 2): {0,1} {0,2} {1,3} {0,2}.
//   Belady: W1 0m 1m | W2 0 hit, 2m (3 resident) | W3 1 hit (pinned), 3m: the victim is among
//           the unpinned {0, 2}; both return in W4, 2 later (position 7 vs 6) → evict 2 |
//           W4 0 hit, 2m → 3 hits / 8. (Ignoring the pin would evict 1, never used again, and
//           claim an impossible 4: W3 needs 1 and 3 resident together with 0 and 2.)
//   LRU:    W1 0m 1m | W2 0 hit, 2m | W3 1 hit, 3m evicts 0 (older than 2) | W4 0m, 2 hit
//           → 3 hits / 8.
TEST(CacheReplay, HandComputedBeladyRespectsPinning) {
  k3::test::TempDir tmp;
  CacheTraceHeader h = SmallHeader(3, CachePolicy::kLru);
  h.n_layers = 1;
  h.first_dense = 0;
  h.n_experts = 4;
  h.topk = 2;
  auto w = MakeWriter(Env::Default(), tmp.path(), h);
  ASSERT_NE(w, nullptr);
  const std::vector<std::vector<int32_t>> waves{{0, 1}, {0, 2}, {1, 3}, {0, 2}};
  for (size_t i = 0; i < waves.size(); ++i) w->Wave(int64_t(i), 0, waves[i]);
  ASSERT_TRUE(w->Finish().ok());

  json j = ReplayJson(tmp.path(), "--capacities 3");
  const json row = Row(j, 3);
  EXPECT_EQ(row.at("belady").at("requests"), 8);
  EXPECT_EQ(row.at("belady").at("true_hits"), 3);
  EXPECT_EQ(row.at("lru").at("true_hits"), 3);
  EXPECT_EQ(j.at("engine_check").at("result"), "SKIPPED");  // no engine counters written
}

// ---------------------------------------------------------------------------------------------
// Replay: cross-check against the real ExpertCache

TEST(CacheReplay, ReproducesExpertCacheForBothPoliciesAndSeveralCapacities) {
  const CacheTraceHeader shape = SmallHeader(4, CachePolicy::kLru);
  const std::vector<Pass> passes = RandomPasses(shape, 200, 6, 1234);
  int separated = 0;  // capacities at which LRU and S3-FIFO differ (else the check proves less)
  for (int slots : {4, 7, 13, 30}) {
    for (CachePolicy engine_policy : {CachePolicy::kLru, CachePolicy::kS3Fifo}) {
      SCOPED_TRACE("slots " + std::to_string(slots) + ", engine policy " +
                   CachePolicyName(engine_policy));
      k3::test::TempDir tmp;
      CacheTraceHeader h = SmallHeader(slots, engine_policy);
      auto w = MakeWriter(Env::Default(), tmp.path(), h);
      ASSERT_NE(w, nullptr);
      const CacheTraceCounters lru = DriveEngine(h, passes, slots, CachePolicy::kLru,
                                                 engine_policy == CachePolicy::kLru ? w.get()
                                                                                    : nullptr);
      const CacheTraceCounters s3 = DriveEngine(h, passes, slots, CachePolicy::kS3Fifo,
                                                engine_policy == CachePolicy::kS3Fifo ? w.get()
                                                                                      : nullptr);
      if (lru.true_hits != s3.true_hits) ++separated;
      w->SetEngineCounters(engine_policy == CachePolicy::kLru ? lru : s3);
      ASSERT_TRUE(w->Finish().ok());

      json j = ReplayJson(tmp.path(), "--capacities " + std::to_string(slots));
      EXPECT_EQ(j.at("engine_check").at("result"), "MATCH") << j.at("engine_check").dump();
      const json row = Row(j, slots);
      EXPECT_EQ(row.at("lru").at("requests"), lru.requests);
      EXPECT_EQ(row.at("lru").at("true_hits"), lru.true_hits);
      EXPECT_EQ(row.at("lru").at("evictions"), lru.evictions);
      EXPECT_EQ(row.at("s3fifo").at("true_hits"), s3.true_hits);
      EXPECT_EQ(row.at("s3fifo").at("evictions"), s3.evictions);
      EXPECT_GE(row.at("belady").at("true_hits").get<uint64_t>(), lru.true_hits);
      EXPECT_GE(row.at("belady").at("true_hits").get<uint64_t>(), s3.true_hits);
    }
  }
  EXPECT_GE(separated, 4) << "the routing history does not separate LRU from S3-FIFO";
}

// A trace recorded with 13 slots (prefill waves of up to 12 ids), replayed at other capacities,
// must equal the engine run at those capacities: the replay re-cuts each pass's expert union
// into the smaller or larger waves the engine would have used.
TEST(CacheReplay, OtherCapacitiesEqualEngineRunsAtThoseCapacities) {
  CacheTraceHeader h = SmallHeader(13, CachePolicy::kS3Fifo);
  const std::vector<Pass> passes = RandomPasses(h, 60, 8, 99, /*wide_every=*/3);
  k3::test::TempDir tmp;
  auto w = MakeWriter(Env::Default(), tmp.path(), h);
  ASSERT_NE(w, nullptr);
  w->SetEngineCounters(DriveEngine(h, passes, 13, CachePolicy::kS3Fifo, w.get()));
  ASSERT_TRUE(w->Finish().ok());
  json j = ReplayJson(tmp.path(), "--capacities 4,5,9,40");
  EXPECT_EQ(j.at("engine_check").at("result"), "MATCH");
  for (int slots : {4, 5, 9, 40}) {
    SCOPED_TRACE("slots " + std::to_string(slots));
    const json row = Row(j, slots);
    const CacheTraceCounters lru = DriveEngine(h, passes, slots, CachePolicy::kLru, nullptr);
    const CacheTraceCounters s3 = DriveEngine(h, passes, slots, CachePolicy::kS3Fifo, nullptr);
    EXPECT_EQ(row.at("lru").at("true_hits"), lru.true_hits);
    EXPECT_EQ(row.at("s3fifo").at("true_hits"), s3.true_hits);
    EXPECT_GE(row.at("belady").at("true_hits").get<uint64_t>(),
              std::max(lru.true_hits, s3.true_hits));
  }
}

// One MoE layer and a prompt prefilled in three passes, all at (step 0, layer 1), recorded with
// 9 slots (waves of ≤ 8): [0,4,6,9] [1,2,4] [9]. None of them is a full wave, so each is its own
// pass. Replayed at 3 slots (waves of ≤ 2), LRU:
//   {0,4} 0m 4m | {6,9} 6m, 9m evicts 0 → (4,6,9) | {1,2} evict 4, 6 → (9,1,2) |
//   {4} evicts 9 → (1,2,4) | {9} evicts 1                              → 0 hits / 8.
// Gluing the last wave onto the second (same step and layer, 9 > 4) would replay {4,9} as one
// wave, where 9 is still resident at lookup time: 1 hit.
TEST(CacheReplay, ChunkedPrefillPassesOfOneMoeLayerStaySeparate) {
  CacheTraceHeader h = SmallHeader(9, CachePolicy::kLru);
  h.n_layers = 2;
  h.n_experts = 10;
  h.topk = 2;
  const std::vector<Pass> passes{{0, 1, {0, 4, 6, 9}}, {0, 1, {1, 2, 4}}, {0, 1, {9}}};
  k3::test::TempDir tmp;
  auto w = MakeWriter(Env::Default(), tmp.path(), h);
  ASSERT_NE(w, nullptr);
  w->SetEngineCounters(DriveEngine(h, passes, 9, CachePolicy::kLru, w.get()));
  ASSERT_TRUE(w->Finish().ok());
  json j = ReplayJson(tmp.path(), "--capacities 3,9");
  EXPECT_EQ(j.at("engine_check").at("result"), "MATCH");
  EXPECT_EQ(Row(j, 9).at("lru").at("true_hits"), 2);  // 4 and 9 found again
  const json row = Row(j, 3);
  EXPECT_EQ(row.at("lru").at("true_hits"), 0);
  EXPECT_EQ(row.at("lru").at("true_hits"),
            DriveEngine(h, passes, 3, CachePolicy::kLru, nullptr).true_hits);
  EXPECT_EQ(row.at("s3fifo").at("true_hits"),
            DriveEngine(h, passes, 3, CachePolicy::kS3Fifo, nullptr).true_hits);
}

TEST(CacheReplay, DefaultCapacitiesAreGeometricPlusTheEngines) {
  CacheTraceHeader h = SmallHeader(13, CachePolicy::kLru);
  k3::test::TempDir tmp;
  auto w = MakeWriter(Env::Default(), tmp.path(), h);
  ASSERT_NE(w, nullptr);
  // 3 MoE layers × 24 experts, every one used: 72 distinct keys.
  for (int layer = 1; layer < 4; ++layer) {
    for (int32_t e = 0; e < 24; e += 12) {
      std::vector<int32_t> ids;
      for (int32_t i = e; i < e + 12; ++i) ids.push_back(i);
      w->Wave(0, layer, ids);
    }
  }
  ASSERT_TRUE(w->Finish().ok());
  json j = ReplayJson(tmp.path(), "");
  std::vector<int> caps;
  for (const json& r : j.at("capacities")) caps.push_back(r.at("capacity").get<int>());
  EXPECT_EQ(caps, (std::vector<int>{4, 8, 13, 16, 32, 64, 72}));
  EXPECT_EQ(j.at("distinct_experts"), 72);
}

TEST(CacheReplay, MismatchWithEngineCountersExitsOne) {
  CacheTraceHeader h = SmallHeader(7, CachePolicy::kLru);
  const std::vector<Pass> passes = RandomPasses(h, 10, 4, 7);
  k3::test::TempDir tmp;
  auto w = MakeWriter(Env::Default(), tmp.path(), h);
  ASSERT_NE(w, nullptr);
  CacheTraceCounters c = DriveEngine(h, passes, 7, CachePolicy::kLru, w.get());
  c.true_hits -= 1;  // as if the engine counted one hit fewer than its cache produced
  c.reads += 1;
  w->SetEngineCounters(c);
  ASSERT_TRUE(w->Finish().ok());
  ScriptRun r = Replay(tmp.path(), "");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("MISMATCH"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("true_hits engine"), std::string::npos) << r.out;
}

// ---------------------------------------------------------------------------------------------
// Replay: invalid traces (exit 2, naming the file, the line and the rule)

TEST(CacheReplayInput, TruncatedTraceIsRejected) {
  k3::test::TempDir tmp;
  auto w = MakeWriter(Env::Default(), tmp.path(), SmallHeader(5, CachePolicy::kLru));
  ASSERT_NE(w, nullptr);
  const std::vector<int32_t> ids{1, 2};
  for (int i = 0; i < 3; ++i) w->Wave(i, 1, ids);
  ASSERT_TRUE(w->Finish().ok());
  std::string text = Slurp(w->path());
  text.resize(text.rfind('{'));  // drop the last wave line whole
  tmp.WriteFile("cache-trace.jsonl", text);
  ScriptRun r = Replay(tmp.path(), "");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(w->path()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("announces 3 waves but the file holds 2"), std::string::npos) << r.err;
}

TEST(CacheReplayInput, UnsortedWaveIsRejected) {
  k3::test::TempDir tmp;
  auto w = MakeWriter(Env::Default(), tmp.path(), SmallHeader(5, CachePolicy::kLru));
  ASSERT_NE(w, nullptr);
  const std::vector<int32_t> ok{1, 2}, bad{3, 3};
  w->Wave(0, 1, ok);
  w->Wave(0, 2, bad);
  ASSERT_TRUE(w->Finish().ok());
  ScriptRun r = Replay(tmp.path(), "");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(w->path() + " line 3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("strictly ascending"), std::string::npos) << r.err;
}

TEST(CacheReplayInput, MissingTraceIsRejected) {
  k3::test::TempDir tmp;
  ScriptRun r = Replay(tmp.Join("nowhere"), "");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(tmp.Join("nowhere") + "/cache-trace.jsonl: cannot read"),
            std::string::npos)
      << r.err;
}

TEST(CacheReplayInput, BadCapacityIsRejected) {
  k3::test::TempDir tmp;
  auto w = MakeWriter(Env::Default(), tmp.path(), SmallHeader(5, CachePolicy::kLru));
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->Finish().ok());
  ScriptRun r = Replay(tmp.path(), "--capacities 4,0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--capacities: '0' is not a positive integer"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace k3::run
