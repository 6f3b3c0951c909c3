// The vision path on the synthetic checkpoints' own vision weights (issue #32 "Tests"): image
// files and generated images → our preprocessing → VisionEncoder (vision.bin of the prepared
// fixture) → rows, against tests/reference/vision_ref.py (float64 torch, written from the spec)
// reading the same weights from the checkpoint's shards and the same patches: rel L2 ≤ 1e-5
// for 1×1, 14×14 and 28×28 images, 30×17, a 64×64-patch image, 1024×768 and a PNG with alpha.
// Skipped visibly when /usr/bin/python3 lacks torch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "k3run/engine/image_input.h"
#include "k3run/engine/vision_encoder.h"
#include "tests/k3run/vision/vision_ref_runner.h"
#include "tests/support/synth_fixture.h"
#include "tests/support/temp_dir.h"

namespace k3::run {
namespace {

using Json = nlohmann::json;

std::string Image(const std::string& name) {
  return std::string(K3_SOURCE_DIR) + "/tests/data/images/" + name;
}

// A deterministic RGB picture (gradients and a checker) of w × h.
vision::Image Generated(uint32_t w, uint32_t h) {
  vision::Image img;
  img.width = w;
  img.height = h;
  img.layout = vision::PixelLayout::kRgb;
  img.pixels.resize(size_t{w} * h * 3);
  for (uint32_t y = 0; y < h; ++y) {
    for (uint32_t x = 0; x < w; ++x) {
      uint8_t* p = &img.pixels[(size_t{y} * w + x) * 3];
      p[0] = static_cast<uint8_t>((x * 255) / std::max(1u, w - 1));
      p[1] = static_cast<uint8_t>((y * 255) / std::max(1u, h - 1));
      p[2] = static_cast<uint8_t>((((x / 7) + (y / 5)) % 2) * 200 + 20);
    }
  }
  return img;
}

struct Case {
  std::string name;
  ImageInput image;
};

std::vector<Case> Cases() {
  std::vector<Case> out;
  for (const char* file : {"rgb_1x1.png", "rgb_30x17.png", "rgba_61x47.png"}) {
    Result<ImageInput> i = LoadImageFile(Env::Default(), Image(file));
    EXPECT_TRUE(i.ok()) << i.status().ToString();
    if (i.ok()) out.push_back({file, std::move(i).value()});
  }
  for (auto [w, h] : {std::pair{14u, 14u}, {28u, 28u}, {896u, 896u}, {1024u, 768u}}) {
    Result<vision::ImagePatches> p = vision::PreprocessImage(Generated(w, h));
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    const std::string name = std::to_string(w) + "x" + std::to_string(h);
    if (p.ok()) out.push_back({name, ImageInput{name, std::move(p).value()}});
  }
  return out;
}

bool TorchPresent() {
  return std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
}

void Check(const std::string& preset) {
  if (!TorchPresent()) GTEST_SKIP() << "SKIPPED: /usr/bin/python3 has no torch (python3-torch)";
  const test::FixtureDirs& f =
      test::SynthFixture(test::FixtureSpec{preset, 0, prepared::ExpertsMode::kCopy});
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), f.prepared);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  Result<std::unique_ptr<VisionEncoder>> enc = VisionEncoder::Open(Env::Default(), *p);
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  const vision::VisionDims& d = (*enc)->dims();
  std::vector<Case> cases = Cases();
  ASSERT_EQ(cases.size(), 7u);
  // The 64×64-patch case is the 896×896 image: no resize, the grid is 64 patches a side.
  EXPECT_EQ(cases[5].image.patches.grid.grid_w, 64u);

  test::TempDir dir;
  Json list = Json::array();
  std::vector<std::vector<float>> ours;
  for (size_t i = 0; i < cases.size(); ++i) {
    const vision::ImagePatches& ip = cases[i].image.patches;
    const std::string name = "patches_" + std::to_string(i) + ".bin";
    std::ofstream(dir.Join(name), std::ios::binary)
        .write(reinterpret_cast<const char*>(ip.patches.data()),
               static_cast<std::streamsize>(ip.patches.size() * 4));
    list.push_back({{"gh", ip.grid.grid_h}, {"gw", ip.grid.grid_w}, {"patches", name}});
    Result<MediaSpan> s = (*enc)->Encode(ip, 0, nullptr);
    ASSERT_TRUE(s.ok()) << cases[i].name << ": " << s.status().ToString();
    ours.push_back(*s->data);
  }
  const Json spec = {{"checkpoint", f.checkpoint},
                     {"dims", vision::testing::VisionRefDims(d)},
                     {"cases", list}};
  dir.WriteFile("cases.json", spec.dump(1));
  std::string output;
  ASSERT_TRUE(vision::testing::RunVisionRef(dir.path(), &output)) << output;
  for (size_t i = 0; i < cases.size(); ++i) {
    std::vector<double> want(ours[i].size());
    std::ifstream in(dir.Join("out_" + std::to_string(i) + ".bin"), std::ios::binary);
    in.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(want.size() * 8));
    ASSERT_TRUE(in.good()) << cases[i].name << ": the reference wrote fewer rows";
    double num = 0, den = 0;
    for (size_t k = 0; k < want.size(); ++k) {
      const double e = static_cast<double>(ours[i][k]) - want[k];
      num += e * e;
      den += want[k] * want[k];
    }
    const double rel = std::sqrt(num / den);
    std::printf("%s %s: %lld rows, rel L2 %.3g\n", preset.c_str(), cases[i].name.c_str(),
                static_cast<long long>(cases[i].image.tokens()), rel);
    EXPECT_LE(rel, 1e-5) << preset << " " << cases[i].name;
    EXPECT_GT(den, 0.0) << cases[i].name;
  }
}

TEST(VisionReference, TinyCheckpointImagesMatchTheFloat64Reference) { Check("tiny"); }
TEST(VisionReference, SmallCheckpointImagesMatchTheFloat64Reference) { Check("small"); }

}  // namespace
}  // namespace k3::run
