// The floor (k3run/app/floor.h): ComputeFloor's arithmetic against hand-computed numbers, and the
// bandwidth probes on the tiny prepared directory (positive rates, the request sizes asked for,
// option rules, read failures as a Status naming the file). No timing assertions beyond > 0.
#include "k3run/app/floor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "formats/prepared_layout.h"
#include "k3run/kernels/matmul.h"
#include "tests/k3run/engine_fixture.h"
#include "tests/support/fault_env.h"

namespace k3::run {
namespace {

using ::testing::HasSubstr;

// ---- ComputeFloor ---------------------------------------------------------------------------

Bandwidths Rates(double trunk, double expert, double memory, double flops) {
  Bandwidths b;
  b.trunk_bytes_per_s = trunk;
  b.expert_bytes_per_s = expert;
  b.memory_bytes_per_s = memory;
  b.kernel_flops_per_s = flops;
  return b;
}

TEST(ComputeFloor, DiskBoundSumsTrunkKindsAndExperts) {
  PerToken t;
  t.trunk_bytes = 600;
  t.lm_head_bytes = 300;
  t.other_bytes = 100;      // (600 + 300 + 100) / 500 = 2 s at trunk speed
  t.expert_bytes = 400;     // 400 / 400 = 1 s
  t.weight_bytes_used = 1000;  // 1000 / 10000 = 0.1 s
  t.multiply_adds = 50;        // 2 · 50 / 1000 = 0.1 s
  const Floor f = ComputeFloor(t, Rates(500, 400, 10000, 1000));
  EXPECT_DOUBLE_EQ(f.disk_s, 3.0);
  EXPECT_DOUBLE_EQ(f.memory_s, 0.1);
  EXPECT_DOUBLE_EQ(f.compute_s, 0.1);
  EXPECT_DOUBLE_EQ(f.floor_s, 3.0);
  EXPECT_EQ(f.bound, "disk");
  EXPECT_TRUE(f.unmeasured.empty());
}

TEST(ComputeFloor, MemoryBoundWhenEverythingIsResident) {
  PerToken t;
  t.weight_bytes_used = 8e9;  // 8e9 / 4e9 = 2 s
  t.multiply_adds = 1e9;      // 2e9 / 4e9 = 0.5 s
  const Floor f = ComputeFloor(t, Rates(1e9, 1e9, 4e9, 4e9));
  EXPECT_DOUBLE_EQ(f.disk_s, 0.0);
  EXPECT_DOUBLE_EQ(f.memory_s, 2.0);
  EXPECT_DOUBLE_EQ(f.compute_s, 0.5);
  EXPECT_DOUBLE_EQ(f.floor_s, 2.0);
  EXPECT_EQ(f.bound, "memory");
}

TEST(ComputeFloor, ComputeBoundCountsTwoFlopsPerMultiplyAdd) {
  PerToken t;
  t.trunk_bytes = 1e8;        // 1e8 / 1e9 = 0.1 s
  t.weight_bytes_used = 1e9;  // 1e9 / 1e10 = 0.1 s
  t.multiply_adds = 3e9;      // 6e9 / 2e9 = 3 s
  const Floor f = ComputeFloor(t, Rates(1e9, 1e9, 1e10, 2e9));
  EXPECT_DOUBLE_EQ(f.disk_s, 0.1);
  EXPECT_DOUBLE_EQ(f.memory_s, 0.1);
  EXPECT_DOUBLE_EQ(f.compute_s, 3.0);
  EXPECT_DOUBLE_EQ(f.floor_s, 3.0);
  EXPECT_EQ(f.bound, "compute");
}

TEST(ComputeFloor, ZeroExpertBandwidthLeavesExpertBytesOutAndSaysSo) {
  PerToken t;
  t.trunk_bytes = 1000;  // 1000 / 1000 = 1 s
  t.expert_bytes = 5000;  // no rate: left out, not infinite
  const Floor f = ComputeFloor(t, Rates(1000, 0, 1e9, 1e9));
  EXPECT_DOUBLE_EQ(f.disk_s, 1.0);
  EXPECT_TRUE(std::isfinite(f.floor_s));
  EXPECT_DOUBLE_EQ(f.floor_s, 1.0);
  ASSERT_EQ(f.unmeasured.size(), 1u);
  EXPECT_EQ(f.unmeasured[0], "expert_bytes_per_s");
}

TEST(ComputeFloor, ZeroBandwidthWithNoBytesIsNotUnmeasured) {
  PerToken t;  // a dense checkpoint: no expert bytes, so no expert rate is needed
  t.trunk_bytes = 2000;  // 2000 / 1000 = 2 s
  const Floor f = ComputeFloor(t, Rates(1000, 0, 1e9, 1e9));
  EXPECT_DOUBLE_EQ(f.disk_s, 2.0);
  EXPECT_TRUE(f.unmeasured.empty());
}

TEST(ComputeFloor, NegativeOrNonFiniteBandwidthIsUnmeasured) {
  PerToken t;
  t.trunk_bytes = 10;
  t.weight_bytes_used = 10;
  t.multiply_adds = 10;
  const Floor f = ComputeFloor(
      t, Rates(-1, 0, std::numeric_limits<double>::quiet_NaN(),
               std::numeric_limits<double>::infinity()));
  EXPECT_EQ(f.floor_s, 0.0);
  EXPECT_EQ(f.bound, "");
  EXPECT_EQ(f.unmeasured, (std::vector<std::string>{"trunk_bytes_per_s", "memory_bytes_per_s",
                                                    "kernel_flops_per_s"}));
}

TEST(ComputeFloor, NothingToDoHasNoBound) {
  const Floor f = ComputeFloor(PerToken{}, Rates(1, 1, 1, 1));
  EXPECT_EQ(f.floor_s, 0.0);
  EXPECT_EQ(f.bound, "");
  EXPECT_TRUE(f.unmeasured.empty());
}

// ---- ProbeBandwidths on the tiny prepared directory -----------------------------------------

prepared::PreparedDir OpenTiny() {
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), testing::TinyPreparedDir());
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(p).value() : prepared::PreparedDir{};
}

ProbeOptions Quick() {
  ProbeOptions o;
  o.seconds_per_probe = 0.02;
  o.threads = 1;  // the machine is shared: one core is enough to get positive numbers
  o.max_buffer_bytes = uint64_t{64} << 20;  // still far beyond the caches; 1 GiB costs ~1 s of CPU
  return o;
}

uint64_t LargestRun(const prepared::PreparedDir& p) {
  uint64_t m = 0;
  for (const prepared::TrunkRun& r : p.manifest.runs) m = std::max(m, r.length);
  return m;
}

TEST(ProbeBandwidths, TinyGivesPositiveRatesAndNamesTheBackend) {
  const prepared::PreparedDir p = OpenTiny();
  ASSERT_FALSE(p.experts.records.empty());
  Result<Bandwidths> b = ProbeBandwidths(Env::Default(), p, Quick());
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_GT(b->expert_bytes_per_s, 0);
  EXPECT_GT(b->trunk_bytes_per_s, 0);
  EXPECT_GT(b->memory_bytes_per_s, 0);
  EXPECT_GT(b->kernel_flops_per_s, 0);
  EXPECT_GT(b->kernel_matmul_flops_per_s, 0);
  EXPECT_FALSE(b->backend.empty());
}

TEST(ProbeBandwidths, ForcePreadUsesThePreadPool) {
  const prepared::PreparedDir p = OpenTiny();
  ProbeOptions o = Quick();
  o.force_pread = true;
  Result<Bandwidths> b = ProbeBandwidths(Env::Default(), p, o);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_THAT(b->backend, HasSubstr("pread-pool"));
}

TEST(ProbeBandwidths, RequestSizesAreTheOnesAsked) {
  const prepared::PreparedDir p = OpenTiny();
  ProbeOptions o = Quick();
  o.expert_queue_depth = 3;
  o.trunk_request_bytes = 8192;
  Result<Bandwidths> b = ProbeBandwidths(Env::Default(), p, o);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->expert_queue_depth, 3);
  // One expert = one read of the whole record (the config's six sub-tensors).
  EXPECT_EQ(b->expert_request_bytes, prepared::ExpertBytes(p.manifest.config));
  EXPECT_EQ(b->trunk_request_bytes, 8192u);
}

TEST(ProbeBandwidths, TrunkRequestDefaultsToTheLargestRun) {
  const prepared::PreparedDir p = OpenTiny();
  Result<Bandwidths> b = ProbeBandwidths(Env::Default(), p, Quick());
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_GT(LargestRun(p), 0u);
  EXPECT_EQ(b->trunk_request_bytes, LargestRun(p));
}

TEST(ProbeBandwidths, TrunkRequestIsCappedAtTheLargestRun) {
  const prepared::PreparedDir p = OpenTiny();
  ProbeOptions o = Quick();
  o.trunk_request_bytes = uint64_t{1} << 30;
  Result<Bandwidths> b = ProbeBandwidths(Env::Default(), p, o);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->trunk_request_bytes, std::min(LargestRun(p), kMaxTrunkProbeRequest));
}

TEST(ProbeBandwidths, ExpertQueueDepthIsClampedToTheRecordCount) {
  const prepared::PreparedDir p = OpenTiny();
  const ModelConfig& c = p.manifest.config;
  const int records = c.n_moe_layers() * c.n_experts;  // from the config, not the index
  ProbeOptions o = Quick();
  o.expert_queue_depth = records + 100;
  Result<Bandwidths> b = ProbeBandwidths(Env::Default(), p, o);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->expert_queue_depth, records);
}

TEST(ProbeBandwidths, RestoresTheKernelThreadCount) {
  const prepared::PreparedDir p = OpenTiny();
  const int before = kernels::Threads();
  ProbeOptions o = Quick();
  o.threads = before + 1;
  Result<Bandwidths> b = ProbeBandwidths(Env::Default(), p, o);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(kernels::Threads(), before);
}

// One test per option rule: each names the option.
TEST(ProbeBandwidths, SecondsPerProbeMustBePositive) {
  const prepared::PreparedDir p = OpenTiny();
  for (double s : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(), 61.0}) {
    ProbeOptions o = Quick();
    o.seconds_per_probe = s;
    Result<Bandwidths> b = ProbeBandwidths(Env::Default(), p, o);
    ASSERT_FALSE(b.ok()) << s;
    EXPECT_EQ(b.status().code(), Code::kInvalid);
    EXPECT_THAT(b.status().message(), HasSubstr("seconds_per_probe"));
    EXPECT_THAT(b.status().message(), HasSubstr("(0, 60]"));
  }
}

TEST(ProbeBandwidths, ExpertQueueDepthMustBePositive) {
  const prepared::PreparedDir p = OpenTiny();
  ProbeOptions o = Quick();
  o.expert_queue_depth = 0;
  Result<Bandwidths> b = ProbeBandwidths(Env::Default(), p, o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::kInvalid);
  EXPECT_THAT(b.status().message(), HasSubstr("expert_queue_depth is 0"));
}

TEST(ProbeBandwidths, ThreadsMustNotBeNegative) {
  const prepared::PreparedDir p = OpenTiny();
  ProbeOptions o = Quick();
  o.threads = -2;
  Result<Bandwidths> b = ProbeBandwidths(Env::Default(), p, o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::kInvalid);
  EXPECT_THAT(b.status().message(), HasSubstr("threads is -2"));
}

TEST(ProbeBandwidths, ExpertFileIdWithoutPathIsInvalid) {
  prepared::PreparedDir p = OpenTiny();
  ASSERT_FALSE(p.experts.records.empty());
  p.experts.records[1].file_id = static_cast<uint32_t>(p.expert_paths.size());
  Result<Bandwidths> b = ProbeBandwidths(Env::Default(), p, Quick());
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::kInvalid);
  EXPECT_THAT(b.status().message(),
              HasSubstr("file_id " + std::to_string(p.expert_paths.size())));
  EXPECT_THAT(b.status().message(), HasSubstr("expert 1"));
}

TEST(ProbeBandwidths, ExpertReadEioNamesTheFileAndOffset) {
  const prepared::PreparedDir p = OpenTiny();
  ASSERT_FALSE(p.experts.records.empty());
  // The last record. A queue as deep as there are records makes the probe's first (untimed
  // warm-up) batch read every record, so the failing read is reached whatever the time bound.
  const prepared::ExpertRecord& rec = p.experts.records.back();
  const std::string& path = p.expert_paths[rec.file_id];
  test::FaultEnv fault;
  fault.SetRule(path, test::FaultRule::EioAt(rec.offset + 1));
  ProbeOptions o = Quick();
  o.expert_queue_depth = static_cast<int>(p.experts.records.size());
  Result<Bandwidths> b = ProbeBandwidths(&fault, p, o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::kIo);
  EXPECT_THAT(b.status().message(), HasSubstr(path));
  EXPECT_THAT(b.status().message(), HasSubstr("byte offset " + std::to_string(rec.offset)));
  const ModelConfig& c = p.manifest.config;
  EXPECT_THAT(b.status().message(), HasSubstr("layer " + std::to_string(c.n_layers - 1) +
                                              " expert " + std::to_string(c.n_experts - 1)));
}

TEST(ProbeBandwidths, MissingExpertFileNamesTheFile) {
  prepared::PreparedDir p = OpenTiny();
  ASSERT_FALSE(p.expert_paths.empty());
  const std::string missing = p.dir + "/experts/no-such-file.bin";
  for (std::string& path : p.expert_paths) path = missing;
  Result<Bandwidths> b = ProbeBandwidths(Env::Default(), p, Quick());
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), HasSubstr(missing));
  EXPECT_THAT(b.status().message(), HasSubstr("bandwidth probe"));
}

TEST(ProbeBandwidths, TrunkReadEioNamesTheFileAndRun) {
  const prepared::PreparedDir p = OpenTiny();
  // The largest run is read first.
  const prepared::TrunkRun* largest = &p.manifest.runs[0];
  for (const prepared::TrunkRun& r : p.manifest.runs) {
    if (r.length > largest->length) largest = &r;
  }
  const std::string trunk = p.dir + "/trunk.bin";
  test::FaultEnv fault;
  fault.SetRule(trunk, test::FaultRule::EioAt(largest->offset + 8));
  // The probe's untimed warm-up reads the largest run: the failure does not wait on the clock.
  Result<Bandwidths> b = ProbeBandwidths(&fault, p, Quick());
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::kIo);
  EXPECT_THAT(b.status().message(), HasSubstr("trunk.bin"));
  EXPECT_THAT(b.status().message(),
              HasSubstr("layer " + std::to_string(largest->layer) + "'s trunk run"));
  EXPECT_THAT(b.status().message(), HasSubstr("byte offset " + std::to_string(largest->offset)));
}

}  // namespace
}  // namespace k3::run
