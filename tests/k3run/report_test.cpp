// The JSON report's rules: generated_text null without a tokenizer, invalid UTF-8 → U+FFFD,
// generated_ids authoritative, prefill-only steps have a null token, --layers labelled.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "k3run/app/report.h"

namespace k3::run {
namespace {

RunReport Basic() {
  RunReport r;
  r.prepared = "/p";
  r.layers_run = r.n_layers = 13;
  r.prompt_ids = {1, 2};
  r.generated_ids = {7, 8};
  StepRecord a;
  a.index = 0;
  a.tokens_in = 2;
  a.token = 7;
  a.seconds = 0.5;
  a.bytes.trunk = 100;
  StepRecord b = a;
  b.index = 1;
  b.tokens_in = 1;
  b.token = 8;
  b.bytes = ReadCounters{};
  b.bytes.experts = 30;
  r.steps = {a, b};
  return r;
}

TEST(Report, GeneratedTextIsNullWithoutTokenizer) {
  const auto j = nlohmann::json::parse(RenderReportJson(Basic()));
  EXPECT_TRUE(j["generated_text"].is_null());
  EXPECT_EQ(j["generated_ids"], nlohmann::json({7, 8}));
  EXPECT_EQ(j["prompt_ids"], nlohmann::json({1, 2}));
}

TEST(Report, InvalidUtf8InGeneratedTextBecomesReplacementCharacter) {
  RunReport r = Basic();
  r.generated_bytes = std::string("ok\xFF\xF0\x9F");
  const auto j = nlohmann::json::parse(RenderReportJson(r));
  EXPECT_EQ(j["generated_text"], "ok\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(Report, TotalsSumTheSteps) {
  const auto j = nlohmann::json::parse(RenderReportJson(Basic()));
  EXPECT_EQ(j["totals"]["bytes_read"]["trunk"], 100);
  EXPECT_EQ(j["totals"]["bytes_read"]["experts"], 30);
  EXPECT_EQ(j["totals"]["bytes_read"]["total"], 130);
  EXPECT_DOUBLE_EQ(j["totals"]["seconds"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["totals"]["seconds_per_token"].get<double>(), 0.5);
}

// Hand-computed: the run read 4000 + 1000 + 1000 bytes in 3 busy seconds (2000 B/s); a decode
// token needed (800 + 200 unused − 200) = 800 bytes → floor 0.4 s; decode steps took 0.5 s each.
TEST(Report, OwnRateFloorIsNeededBytesAtTheRunsReadRate) {
  RunReport r = Basic();
  r.generated_ids = {7, 8, 9};
  r.steps[0].bytes = ReadCounters{};
  r.steps[0].bytes.trunk = 4000;
  r.steps[0].source.io_busy_seconds = 2.0;
  r.steps[1].bytes = ReadCounters{};
  r.steps[1].bytes.experts = 800;
  r.steps[1].bytes.prefetch_unused = 200;
  r.steps[1].source.io_busy_seconds = 0.25;
  r.steps[1].seconds = 0.5;
  StepRecord c = r.steps[1];
  c.index = 2;
  c.token = 9;
  c.source.io_busy_seconds = 0.75;
  r.steps.push_back(c);
  const std::optional<OwnRateFloor> o = RunOwnRateFloor(r);
  ASSERT_TRUE(o.has_value());
  EXPECT_DOUBLE_EQ(o->read_bytes_per_s, 2000.0);
  EXPECT_DOUBLE_EQ(o->needed_bytes_per_token, 800.0);
  EXPECT_DOUBLE_EQ(o->floor_s, 0.4);
  EXPECT_DOUBLE_EQ(o->seconds_per_token, 0.5);
  EXPECT_DOUBLE_EQ(o->time_over_floor, 1.25);
  const auto j = nlohmann::json::parse(RenderReportJson(r));
  EXPECT_DOUBLE_EQ(j["own_rate_floor"]["time_over_floor"].get<double>(), 1.25);
  EXPECT_DOUBLE_EQ(j["own_rate_floor"]["read_bytes_per_s"].get<double>(), 2000.0);
  EXPECT_NE(SummaryLines(r).find("time / that floor 1.25"), std::string::npos) << SummaryLines(r);
}

TEST(Report, OwnRateFloorIsNullWithoutReadsPerTokenOrReadTime) {
  RunReport r = Basic();  // decode step reads 30 expert bytes, but no busy time was recorded
  EXPECT_FALSE(RunOwnRateFloor(r).has_value());
  EXPECT_TRUE(nlohmann::json::parse(RenderReportJson(r))["own_rate_floor"].is_null());
  r.steps[0].source.io_busy_seconds = 1.0;
  EXPECT_TRUE(RunOwnRateFloor(r).has_value());
  r.steps[1].bytes = ReadCounters{};  // everything resident: a token reads nothing
  EXPECT_FALSE(RunOwnRateFloor(r).has_value());
  EXPECT_EQ(SummaryLines(r).find("own read rate"), std::string::npos);
}

TEST(Report, PrefillOnlyStepHasNullToken) {
  RunReport r = Basic();
  r.generated_ids.clear();
  r.steps.resize(1);
  r.steps[0].token = -1;
  const auto j = nlohmann::json::parse(RenderReportJson(r));
  EXPECT_TRUE(j["steps"][0]["token"].is_null());
  EXPECT_TRUE(j["totals"]["seconds_per_token"].is_null());
}

TEST(Report, PartialLayersAreNotTheModel) {
  RunReport r = Basic();
  r.layers_run = 2;
  const auto j = nlohmann::json::parse(RenderReportJson(r));
  EXPECT_EQ(j["is_full_model"], false);
  EXPECT_NE(SummaryLines(r).find("NOT the model"), std::string::npos);
}

TEST(Report, ExpertFailuresMakeTheRunInvalid) {
  RunReport r = Basic();
  r.failures.push_back(ExpertFailure{3, 5, "EIO"});
  r.experts_skipped = 2;
  const auto j = nlohmann::json::parse(RenderReportJson(r));
  EXPECT_EQ(j["valid"], false);
  EXPECT_EQ(j["expert_failures"][0]["layer"], 3);
  EXPECT_EQ(j["expert_failures"][0]["expert"], 5);
}

// Issue 30 item 3: the prefill against its compute floor, in the JSON and the summary line.
TEST(Report, PrefillComputeFloorIsReportedWhenProbed) {
  RunReport r = Basic();
  EXPECT_TRUE(nlohmann::json::parse(RenderReportJson(r))["prefill"].is_null());
  r.steps[0].multiply_adds = 1e9;
  Bandwidths b;
  b.kernel_matmul_flops_per_s = 1e10;  // 2e9 flops at 1e10/s: a 0.2 s floor for 0.5 s
  r.bandwidths = b;
  const auto j = nlohmann::json::parse(RenderReportJson(r));
  ASSERT_TRUE(j["prefill"].is_object());
  EXPECT_EQ(j["prefill"]["tokens"], 2);
  EXPECT_GT(j["prefill"]["time_over_compute_floor"].get<double>(), 0);
  EXPECT_DOUBLE_EQ(j["prefill"]["time_over_compute_floor"].get<double>(), 2.5);
  EXPECT_NE(SummaryLine(r).find("(4.00 tok/s, 2.50× its compute floor)"), std::string::npos)
      << SummaryLine(r);
}

}  // namespace
}  // namespace k3::run
