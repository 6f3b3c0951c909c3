// k3run --batch with "images" lines (k3run/app/batch_input.h): each line's ids and
// --dump-logits-all bytes equal its own single --image/--prompt run (the expectations come from
// single CLI runs); bad image lines are refused naming FILE:LINE before any pass.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "tests/k3run/engine_fixture.h"
#include "tests/support/files.h"
#include "tests/support/temp_dir.h"

namespace k3::run::testing {
namespace {

using nlohmann::json;

std::string ImagePath(const std::string& name) {
  return std::string(K3_SOURCE_DIR) + "/tests/data/images/" + name;
}

struct Line {
  json jsonl;
  std::vector<std::string> single;  // the equivalent single run's flags
};

TEST(BatchImages, EachLineEqualsItsSingleRunIdsAndDumps) {
  test::TempDir tmp;
  const std::string a = ImagePath("rgba_61x47.png"), b = ImagePath("rgb_30x17.jpg"),
                    c = ImagePath("gray_45x33.png");
  const std::vector<Line> lines = {
      {{{"prompt", "Describe it."}, {"images", {a}}, {"gen", 5}},
       {"--prompt", "Describe it.", "--image", a, "--gen", "5"}},
      {{{"prompt", "1 2 3"}}, {"--prompt", "1 2 3", "--gen", "6"}},
      {{{"prompt", "Compare them."}, {"images", {b, c}}, {"gen", 4}},
       {"--prompt", "Compare them.", "--image", b, "--image", c, "--gen", "4"}},
  };
  std::string file;
  for (const Line& l : lines) file += l.jsonl.dump() + "\n";
  const std::string input = tmp.WriteFile("in.jsonl", file);
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::string> dumps;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::vector<std::string> args = {TinyPreparedDir()};
    args.insert(args.end(), lines[i].single.begin(), lines[i].single.end());
    const std::string report = tmp.Join("single" + std::to_string(i) + ".json");
    const std::string dump = tmp.Join("single.logits." + std::to_string(i));
    args.insert(args.end(), {"--out", report, "--no-floor", "--dump-logits", dump,
                             "--dump-logits-all"});
    const CliRun r = RunCliArgs(args);
    ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
    ids.push_back(json::parse(test::ReadWholeFile(report))["generated_ids"]
                      .get<std::vector<int32_t>>());
    dumps.push_back(test::ReadWholeFile(dump));
  }
  for (const char* seqs : {"1", "3"}) {
    const std::string dump = tmp.Join(std::string("batch") + seqs + ".logits");
    const CliRun r = RunCliArgs({TinyPreparedDir(), "--batch", input, "--gen", "6", "--max-seqs",
                                 seqs, "--no-floor", "--dump-logits", dump, "--dump-logits-all"});
    ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
    const std::string text = r.stdout_text();
    size_t pos = 0;
    for (size_t i = 0; i < lines.size(); ++i) {
      const size_t nl = text.find('\n', pos);
      ASSERT_NE(nl, std::string::npos);
      const json out = json::parse(text.substr(pos, nl - pos));
      pos = nl + 1;
      EXPECT_EQ(out["index"], i);
      EXPECT_EQ(out["generated_ids"].get<std::vector<int32_t>>(), ids[i])
          << "line " << i << ", --max-seqs " << seqs;
      EXPECT_EQ(test::ReadWholeFile(dump + "." + std::to_string(i)), dumps[i])
          << "line " << i << ", --max-seqs " << seqs;
    }
  }
}

TEST(BatchImages, BadImageLinesAreRefusedNamingTheLine) {
  test::TempDir tmp;
  const auto refuse = [&](const std::string& line, const std::string& want) {
    const std::string input = tmp.WriteFile("bad.jsonl", "{\"prompt\": \"hi\"}\n" + line + "\n");
    const CliRun r = RunCliArgs({TinyPreparedDir(), "--batch", input, "--no-floor"});
    EXPECT_EQ(r.exit_code, 2) << r.stderr_text;
    EXPECT_NE(r.stderr_text.find(want), std::string::npos) << r.stderr_text;
    EXPECT_EQ(r.stdout_text(), "");  // before any pass
  };
  refuse(R"({"ids": [1, 2], "images": ["x.png"]})", "bad.jsonl:2: \"images\" needs \"prompt\"");
  refuse(R"({"prompt": "hi", "images": []})", "bad.jsonl:2: \"images\" must be a non-empty array");
  refuse(R"({"prompt": "hi", "images": [3]})", "bad.jsonl:2: \"images\" must be a non-empty array");
  refuse(json({{"prompt", "hi"}, {"images", {tmp.Join("missing.png")}}}).dump(),
         "bad.jsonl:2: " + tmp.Join("missing.png"));
  const std::string not_image = tmp.WriteFile("not.png", "GIF89a not an image");
  refuse(json({{"prompt", "hi"}, {"images", {not_image}}}).dump(),
         "bad.jsonl:2: " + not_image + ": not a PNG or JPEG image");
}

}  // namespace
}  // namespace k3::run::testing
