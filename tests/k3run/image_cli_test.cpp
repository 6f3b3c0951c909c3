// k3run --image through the CLI on the tiny fixture (docs/VISION.md "CLI"): the prompt's image
// block and the report; the same ids and logits bits at every memory budget and thread count;
// each bad input refused with exit 2 naming the file, before any pass.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "formats/prepared_manifest.h"
#include "k3run/stream/streaming_plan.h"
#include "k3run/vision/image_resize.h"
#include "tests/k3run/engine_fixture.h"
#include "tests/support/files.h"
#include "tests/support/temp_dir.h"

namespace k3::run {
namespace {

using testing::RunCliArgs;
using testing::TinyPreparedDir;

std::string Image(const std::string& name) {
  return std::string(K3_SOURCE_DIR) + "/tests/data/images/" + name;
}

bool Has(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

// One --image run; returns the report and the logits of every step.
struct ImageRun {
  int exit_code = -1;
  std::string err;
  nlohmann::json report;
  std::string logits;
};

ImageRun RunImage(const std::vector<std::string>& images, const std::vector<std::string>& extra) {
  test::TempDir tmp;
  std::vector<std::string> args = {TinyPreparedDir(), "--prompt", "Describe it.", "--gen", "6",
                                   "--no-floor", "--out", tmp.Join("r.json"),
                                   "--dump-logits", tmp.Join("l.bin"), "--dump-logits-all"};
  for (const std::string& i : images) args.insert(args.end(), {"--image", i});
  args.insert(args.end(), extra.begin(), extra.end());
  const testing::CliRun r = RunCliArgs(args);
  ImageRun out;
  out.exit_code = r.exit_code;
  out.err = r.stderr_text;
  if (r.exit_code == 0) {
    out.report = nlohmann::json::parse(test::ReadWholeFile(tmp.Join("r.json")));
    out.logits = test::ReadWholeFile(tmp.Join("l.bin"));
  }
  return out;
}

int64_t Count(const nlohmann::json& ids, int64_t id) {
  int64_t n = 0;
  for (const auto& v : ids) n += v.get<int64_t>() == id;
  return n;
}

TEST(ImageCli, PromptHoldsOnePadPerRowAndTheReportSaysSo) {
  const ImageRun r = RunImage({Image("rgba_61x47.png"), Image("rgb_30x17.jpg")}, {});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const vision::NavitGrid a = vision::ComputeNavitGrid(61, 47), b = vision::ComputeNavitGrid(30, 17);
  const auto& images = r.report["images"];
  EXPECT_EQ(images["count"].get<int64_t>(), 2);
  EXPECT_EQ(images["tokens"].get<int64_t>(), a.tokens + b.tokens);
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), TinyPreparedDir());
  ASSERT_TRUE(p.ok());
  const int64_t pad = p->manifest.config.media_placeholder_token_id;
  EXPECT_EQ(Count(r.report["prompt_ids"], pad), a.tokens + b.tokens);
  EXPECT_EQ(Count(r.report["prompt_ids"], pad - 3), 2);  // <|media_begin|>: one per image
  EXPECT_EQ(r.report["generated_ids"].size(), 6u);
  EXPECT_GT(r.report["memory_plan"]["vision_bytes"].get<uint64_t>(), 0u);
  EXPECT_TRUE(Has(r.err, "2 images: " + std::to_string(a.tokens + b.tokens) + " image tokens"))
      << r.err;
}

TEST(ImageCli, TheImageChangesTheAnswerAndTheSameImageGivesTheSameBits) {
  const ImageRun a = RunImage({Image("rgb_30x17.png")}, {});
  const ImageRun again = RunImage({Image("rgb_30x17.png")}, {});
  const ImageRun other = RunImage({Image("gray_30x17.jpg")}, {});
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(other.exit_code, 0) << other.err;
  EXPECT_EQ(a.logits, again.logits);
  EXPECT_EQ(a.report["prompt_ids"], other.report["prompt_ids"]);  // same size: same ids
  EXPECT_NE(a.logits, other.logits);  // ... but other rows
}

TEST(ImageCli, SameBitsAtEveryBudgetAndThreadCount) {
  const ImageRun want = RunImage({Image("rgba_61x47.png")}, {});
  ASSERT_EQ(want.exit_code, 0) << want.err;
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), TinyPreparedDir());
  ASSERT_TRUE(p.ok());
  BudgetRequest generous;
  generous.budget_gb = 1e6;
  Result<StreamingPlan> plan = PlanStreaming(*p, generous, 0);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const std::vector<std::vector<std::string>> rungs = {
      {"--threads", "1"},
      {"--threads", "2"},
      {"--preset", "max"},
      {"--trunk-gb", std::to_string(double(plan->trunk_min) / 1e9), "--cache-gb",
       std::to_string(double(plan->cache_min + 4096) / 1e9)},
  };
  for (const auto& rung : rungs) {
    const ImageRun got = RunImage({Image("rgba_61x47.png")}, rung);
    ASSERT_EQ(got.exit_code, 0) << rung[0] << ": " << got.err;
    EXPECT_EQ(got.report["generated_ids"], want.report["generated_ids"]) << rung[0];
    EXPECT_EQ(got.logits, want.logits) << rung[0] << " " << rung[1];
  }
}

TEST(ImageCli, BadImagesAreExit2NamingTheFileBeforeAnyPass) {
  test::TempDir tmp;
  const std::string text = tmp.Join("notes.png");
  std::ofstream(text) << "just some text, not an image\n";
  const std::string png = test::ReadWholeFile(Image("rgb_30x17.png"));
  const std::string cut = tmp.Join("cut.png");
  std::ofstream(cut, std::ios::binary) << png.substr(0, png.size() / 2);
  // A PNG header that says 0 x 0.
  std::string zero = png.substr(0, 33);
  for (int i = 16; i < 24; ++i) zero[static_cast<size_t>(i)] = 0;
  const std::string zero_path = tmp.Join("zero.png");
  std::ofstream(zero_path, std::ios::binary) << zero;
  struct Case {
    std::vector<std::string> images;
    std::vector<std::string> extra;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{text}, {}, "not a PNG or JPEG"},
      {{cut}, {}, "cut.png"},
      {{zero_path}, {}, "zero.png"},
      {{tmp.Join("missing.png")}, {}, "missing.png"},
      {{Image("rgba_61x47.png")}, {"--ctx", "8"}, "--ctx 8: the prompt with --image"},
      {{Image("rgba_61x47.png")}, {"--ctx", "8"}, "rgba_61x47.png ("},
  };
  for (const Case& c : cases) {
    const ImageRun r = RunImage(c.images, c.extra);
    EXPECT_EQ(r.exit_code, 2) << c.says << ": " << r.err;
    EXPECT_TRUE(Has(r.err, c.says)) << r.err;
    EXPECT_FALSE(Has(r.err, "tok/s")) << "a pass ran: " << r.err;
  }
  // --image with --ids or --chat is a usage error naming what to do instead.
  testing::CliRun ids = RunCliArgs({TinyPreparedDir(), "--ids", "1,2", "--image",
                                    Image("rgb_1x1.png"), "--no-floor"});
  EXPECT_EQ(ids.exit_code, 2);
  EXPECT_TRUE(Has(ids.stderr_text, "--image needs --prompt")) << ids.stderr_text;
}

TEST(ImageCli, ATextOnlyDirectorySaysNoVision) {
  test::TempDir tmp;
  testing::CopyTinyWithoutVision(tmp.Join("p"));
  const testing::CliRun r = RunCliArgs({tmp.Join("p"), "--prompt", "hi", "--image",
                                        Image("rgb_1x1.png"), "--no-floor"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.stderr_text, "no vision")) << r.stderr_text;
  // Text still runs.
  const testing::CliRun text = RunCliArgs({tmp.Join("p"), "--prompt", "hi", "--gen", "2",
                                           "--no-floor"});
  EXPECT_EQ(text.exit_code, 0) << text.stderr_text;
}

}  // namespace
}  // namespace k3::run
