// The JSON report's rules: generated_text null without a tokenizer, invalid UTF-8 → U+FFFD,
// generated_ids authoritative, prefill-only steps have a null token, --layers labelled.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "k3run/report.h"

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

}  // namespace
}  // namespace k3::run
