// Image preprocessing (k3run/vision/image_*.h): decoding, the navit rule, Pillow's resampling and
// the patch tensor, against a Pillow + numpy implementation of the released rule
// (image_ref.py, run with /usr/bin/python3; the parity tests skip visibly without python3-pil
// and python3-numpy). Committed images (tests/data/images/, made by `image_ref.py small`) are
// small and are never resized; the resize paths run on large images the script writes
// deterministically at test time (`image_ref.py large`).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "k3run/vision/image_decode.h"
#include "k3run/vision/image_patches.h"
#include "k3run/vision/image_resize.h"
#include "tests/support/files.h"
#include "tests/support/temp_dir.h"

namespace k3::vision {
namespace {

const std::string kImages = std::string(K3_SOURCE_DIR) + "/tests/data/images/";
const std::string kScript = std::string(K3_SOURCE_DIR) + "/tests/k3run/vision/image_ref.py";

// Committed images compared with Pillow (gray16 is the documented deviation, tested apart).
const char* const kCommitted[] = {
    "rgba_61x47.png",      "gray_45x33.png",      "palette_trns_50x37.png", "palette_40x30.png",
    "rgb_30x17.jpg",       "gray_30x17.jpg",      "cmyk_24x20.jpg",         "la_33x21.png",
    "gray_trns_20x20.png", "rgb_30x17.png",       "rgb_1x1.png",            "interlaced_23x19.png",
    "exif_rot6_40x16.jpg", "bilevel_40x20.png",   "rgb16_20x15.png",        "gray4_trns_24x10.png",
    "progressive_40x24.jpg",
};
// Written by `image_ref.py large`: every one is downsized (sides over 7,168, or more than
// 65,536 patches for the 5000x3000 JPEG), one per resize path (the 1-pixel sides run only the
// horizontal or only the vertical pass).
const char* const kLarge[] = {
    "big_rgba_7300x40.png",      "big_palette_7200x30.png", "big_gray_30x7400.png",
    "big_la_7250x20.png",        "big_cmyk_7300x16.jpg",    "big_gray_trns_7200x20.png",
    "big_bilevel_7200x20.png",   "big_rgb_7500x25.jpg",     "big_rgb_5000x3000.jpg",
    "big_rgb_7300x1.png",        "big_rgba_1x7300.png",     "big_gray4_trns_7210x12.png",
};

bool HavePillow() {
  static const bool ok =
      std::system("/usr/bin/python3 -c 'import PIL, numpy' >/dev/null 2>&1") == 0;
  return ok;
}

// Runs image_ref.py with `args`; its output goes to the test log. Fails the test on a non-zero
// exit.
bool RunScript(const std::string& args) {
  const std::string cmd = "/usr/bin/python3 '" + kScript + "' " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "popen failed: " << cmd;
    return false;
  }
  std::string output;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, pipe)) output.append(buf, n);
  const int status = pclose(pipe);
  const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  EXPECT_TRUE(ok) << cmd << "\n" << output;
  return ok;
}

std::string Bytes(const std::string& name) {
  std::string bytes;
  EXPECT_TRUE(test::ReadWholeFile(kImages + name, &bytes)) << kImages + name;
  return bytes;
}

// RGB8 of the resize, padded with black to the grid, as the reference's .rgb file holds it.
std::vector<uint8_t> PaddedRgb(const Image& image, const NavitGrid& g) {
  const std::vector<uint8_t> rgb = ResizeToRgb(image, g.resized_width, g.resized_height);
  std::vector<uint8_t> padded(size_t{g.padded_width} * g.padded_height * 3, 0);
  for (size_t y = 0; y < g.resized_height; ++y) {
    std::memcpy(&padded[y * g.padded_width * 3], &rgb[y * g.resized_width * 3],
                size_t{g.resized_width} * 3);
  }
  return padded;
}

struct Worst {
  int rgb = 0;          // max |k3 - Pillow| over 8-bit samples
  double patch = 0.0;   // max |k3 - reference| over normalised patch values
  size_t images = 0;
  size_t float_images = 0;
};

// One image against the reference files in ref_dir (image_ref.py ref).
void CompareWithReference(const std::string& path, const std::string& ref_dir, Worst* worst) {
  const std::string name = path.substr(path.find_last_of('/') + 1);
  SCOPED_TRACE(name);
  auto image = ReadImageFile(path);
  ASSERT_TRUE(image.ok()) << image.status().ToString();
  auto patches = PreprocessImage(*image);
  ASSERT_TRUE(patches.ok()) << patches.status().ToString();
  const NavitGrid& g = patches->grid;

  std::istringstream grid_text(test::ReadWholeFile(ref_dir + "/" + name + ".grid"));
  uint32_t r[9] = {};
  for (uint32_t& v : r) grid_text >> v;
  ASSERT_FALSE(grid_text.fail()) << "no reference grid for " << name;
  EXPECT_EQ(g.original_width, r[0]);
  EXPECT_EQ(g.original_height, r[1]);
  EXPECT_EQ(g.resized_width, r[2]);
  EXPECT_EQ(g.resized_height, r[3]);
  EXPECT_EQ(g.padded_width, r[4]);
  EXPECT_EQ(g.padded_height, r[5]);
  EXPECT_EQ(g.grid_h, r[6]);
  EXPECT_EQ(g.grid_w, r[7]);
  EXPECT_EQ(g.tokens, r[8]);
  EXPECT_EQ(g.tokens * 4, g.grid_h * g.grid_w);

  // The grid-only path (header, then the pure rule) agrees with the full path.
  auto header = ProbeImage(test::ReadWholeFile(path), name);
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  const NavitGrid probed = ComputeNavitGrid(header->width, header->height);
  EXPECT_EQ(probed.tokens, g.tokens);
  EXPECT_EQ(probed.grid_h, g.grid_h);
  EXPECT_EQ(probed.grid_w, g.grid_w);

  const std::string ref_rgb = test::ReadWholeFile(ref_dir + "/" + name + ".rgb");
  const std::vector<uint8_t> rgb = PaddedRgb(*image, g);
  ASSERT_EQ(ref_rgb.size(), rgb.size());
  int max_rgb = 0;
  size_t differing = 0;
  for (size_t i = 0; i < rgb.size(); ++i) {
    const int d = std::abs(int{rgb[i]} - int{static_cast<uint8_t>(ref_rgb[i])});
    max_rgb = std::max(max_rgb, d);
    differing += d != 0;
  }
  EXPECT_LE(max_rgb, 1) << differing << " of " << rgb.size() << " samples differ";
  // The contract is 1/255; k3 reproduces Pillow 9.4's 8-bit result exactly, and a difference
  // means a regression (or another Pillow).
  EXPECT_EQ(max_rgb, 0) << differing << " of " << rgb.size() << " samples differ";

  std::string ref_f32;
  double max_patch = -1.0;
  if (test::ReadWholeFile(ref_dir + "/" + name + ".f32", &ref_f32)) {
    ASSERT_EQ(ref_f32.size(), patches->patches.size() * sizeof(float));
    std::vector<float> ref(patches->patches.size());
    std::memcpy(ref.data(), ref_f32.data(), ref_f32.size());
    max_patch = 0.0;
    for (size_t i = 0; i < ref.size(); ++i) {
      max_patch = std::max(max_patch, std::fabs(double{patches->patches[i]} - double{ref[i]}));
    }
    // 1/255 of a pixel is 2/255 after (v / 255 - 0.5) / 0.5.
    EXPECT_LE(max_patch, 2.0 / 255 + 1e-6);
    EXPECT_EQ(max_patch, 0.0);
    worst->patch = std::max(worst->patch, max_patch);
    ++worst->float_images;
  }
  worst->rgb = std::max(worst->rgb, max_rgb);
  ++worst->images;
  std::printf("%-28s %5ux%-5u -> %4ux%-4u grid %3ux%-3u tokens %5u  max |rgb diff| %d/255 (%zu "
              "samples differ)  max |patch diff| %s\n",
              name.c_str(), g.original_width, g.original_height, g.resized_width,
              g.resized_height, g.grid_h, g.grid_w, g.tokens, max_rgb, differing,
              max_patch < 0 ? "(not written: too many patches)"
                            : std::to_string(max_patch).c_str());
}

void RunParity(const std::string& image_dir, const char* const* names, size_t count,
               const std::string& ref_dir, const char* what) {
  std::string args = "ref '" + ref_dir + "'";
  for (size_t i = 0; i < count; ++i) args += " '" + image_dir + names[i] + "'";
  if (!RunScript(args)) return;
  Worst worst;
  for (size_t i = 0; i < count; ++i) CompareWithReference(image_dir + names[i], ref_dir, &worst);
  EXPECT_EQ(worst.images, count);
  std::printf("%s: %zu images, max |rgb diff| %d/255, max |patch diff| %.9g (%zu with patches)\n",
              what, worst.images, worst.rgb, worst.patch, worst.float_images);
}

// ---- parity with Pillow ------------------------------------------------------------------

TEST(ImagePreprocess, MatchesPillowOnCommittedImages) {
  if (!HavePillow()) {
    GTEST_SKIP() << "python3-pil or python3-numpy is missing (apt-get install python3-pil "
                    "python3-numpy): preprocessing was not compared with Pillow";
  }
  test::TempDir dir;
  RunParity(kImages, kCommitted, std::size(kCommitted), dir.path(), "committed images");
}

TEST(ImagePreprocess, MatchesPillowOnResizedImages) {
  if (!HavePillow()) {
    GTEST_SKIP() << "python3-pil or python3-numpy is missing (apt-get install python3-pil "
                    "python3-numpy): the resize was not compared with Pillow";
  }
  test::TempDir dir;
  const std::string images = dir.Join("images") + "/";
  ASSERT_TRUE(RunScript("large '" + images + "'"));
  RunParity(images, kLarge, std::size(kLarge), dir.path(), "resized images");
}

TEST(ImagePreprocess, NormalizeMatchesNumpy) {
  if (!HavePillow()) GTEST_SKIP() << "python3-numpy is missing: normalisation not compared";
  test::TempDir dir;
  ASSERT_TRUE(RunScript("norm '" + dir.Join("norm.f32") + "'"));
  const std::string ref = test::ReadWholeFile(dir.Join("norm.f32"));
  ASSERT_EQ(ref.size(), 256 * sizeof(float));
  for (size_t v = 0; v < 256; ++v) {
    float r;
    std::memcpy(&r, ref.data() + v * sizeof(float), sizeof r);
    EXPECT_EQ(NormalizePixel(static_cast<uint8_t>(v)), r) << "v=" << v;  // bit-identical
  }
}

TEST(NavitGrid, MatchesReferenceRuleOnManySizes) {
  if (!HavePillow()) GTEST_SKIP() << "python3 with numpy is missing: grid rule not compared";
  // Edges of every clause: tiny, the 14/28 boundaries, the 7,168 side limit, the 65,536-patch
  // limit (and both at once), extreme aspect ratios, the decoder's 65,535 limit.
  std::vector<std::pair<uint32_t, uint32_t>> sizes = {
      {1, 1},       {13, 13},     {14, 14},       {27, 29},       {28, 28},     {30, 17},
      {1024, 768},  {2800, 2800}, {3584, 3584},   {3600, 3600},   {3598, 3598}, {7168, 7168},
      {7169, 1},    {1, 7169},    {7168, 7169},   {65535, 1},     {1, 65535},   {65535, 65535},
      {5000, 3000}, {4000, 3000}, {4096, 4096},   {12000, 9000},  {65535, 300}, {300, 65535},
      {3585, 3585}, {100, 7200},  {13000, 13000}, {10000, 10000},
  };
  uint64_t s = 12345;  // deterministic pseudo-random sizes
  for (int i = 0; i < 300; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const auto w = static_cast<uint32_t>(1 + (s >> 33) % 20000);
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const auto h = static_cast<uint32_t>(1 + (s >> 33) % 20000);
    sizes.emplace_back(w, h);
  }
  test::TempDir dir;
  std::string args = "grids '" + dir.Join("grids.txt") + "'";
  for (const auto& [w, h] : sizes) args += " " + std::to_string(w) + " " + std::to_string(h);
  ASSERT_TRUE(RunScript(args));
  std::istringstream in(test::ReadWholeFile(dir.Join("grids.txt")));
  size_t checked = 0;
  for (const auto& [w, h] : sizes) {
    uint32_t r[7] = {};
    for (uint32_t& v : r) in >> v;
    ASSERT_FALSE(in.fail());
    ASSERT_EQ(r[0], w);
    ASSERT_EQ(r[1], h);
    const NavitGrid g = ComputeNavitGrid(w, h);
    EXPECT_EQ(g.resized_width, r[2]) << w << "x" << h;
    EXPECT_EQ(g.resized_height, r[3]) << w << "x" << h;
    EXPECT_EQ(g.grid_h, r[4]) << w << "x" << h;
    EXPECT_EQ(g.grid_w, r[5]) << w << "x" << h;
    EXPECT_EQ(g.tokens, r[6]) << w << "x" << h;
    ++checked;
  }
  EXPECT_EQ(checked, sizes.size());
}

// ---- the navit rule, without Python --------------------------------------------------------

TEST(NavitGrid, KnownSizes) {
  const NavitGrid one = ComputeNavitGrid(1, 1);
  EXPECT_EQ(one.resized_width, 1u);
  EXPECT_EQ(one.padded_width, 28u);
  EXPECT_EQ(one.grid_h * one.grid_w, 4u);
  EXPECT_EQ(one.tokens, 1u);
  const NavitGrid odd = ComputeNavitGrid(30, 17);  // padded 56 x 28: 4 x 2 patches, 2 tokens
  EXPECT_EQ(odd.grid_w, 4u);
  EXPECT_EQ(odd.grid_h, 2u);
  EXPECT_EQ(odd.tokens, 2u);
  EXPECT_EQ(ComputeNavitGrid(1024, 768).tokens, 1036u);  // the spec's "about 1,000"
  EXPECT_EQ(ComputeNavitGrid(2800, 2800).tokens, 10000u);  // as the vLLM profile checks
  const NavitGrid wide = ComputeNavitGrid(7300, 40);  // side limit: s = 7168 / 7300
  EXPECT_EQ(wide.resized_width, 7168u);
  EXPECT_EQ(wide.resized_height, 39u);
  const NavitGrid many = ComputeNavitGrid(5000, 3000);  // patch limit: s = sqrt(65536 / 76398)
  EXPECT_EQ(many.resized_width, 4630u);
  EXPECT_EQ(many.resized_height, 2778u);
  EXPECT_EQ(many.tokens, 16600u);
  EXPECT_LE((many.resized_width / kPatchSize) * (many.resized_height / kPatchSize), kInPatchLimit);
  for (uint32_t w : {1u, 100u, 7168u, 20000u, 65535u}) {
    for (uint32_t h : {1u, 100u, 7168u, 20000u, 65535u}) {
      const NavitGrid g = ComputeNavitGrid(w, h);
      EXPECT_LE(g.resized_width, kMaxResizedSide);
      EXPECT_LE(g.resized_height, kMaxResizedSide);
      EXPECT_LE(g.tokens, 17000u) << w << "x" << h;  // "one image can reach ~17,000"
    }
  }
}

// ---- decoding --------------------------------------------------------------------------------

TEST(ImageDecode, Layouts) {
  struct Case {
    const char* name;
    PixelLayout layout;
    bool nearest;
    int key;
  };
  const Case cases[] = {
      {"rgba_61x47.png", PixelLayout::kRgba, false, -1},
      {"gray_45x33.png", PixelLayout::kRgb, false, -1},
      {"palette_trns_50x37.png", PixelLayout::kRgba, true, -1},
      {"palette_40x30.png", PixelLayout::kRgb, true, -1},
      {"la_33x21.png", PixelLayout::kRgba, false, -1},
      {"gray_trns_20x20.png", PixelLayout::kRgb, false, 77},
      {"bilevel_40x20.png", PixelLayout::kRgb, true, -1},
      {"rgb_30x17.jpg", PixelLayout::kRgb, false, -1},
      {"gray_30x17.jpg", PixelLayout::kRgb, false, -1},
      {"cmyk_24x20.jpg", PixelLayout::kCmyk, false, -1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto image = DecodeImage(Bytes(c.name), c.name);
    ASSERT_TRUE(image.ok()) << image.status().ToString();
    EXPECT_EQ(image->layout, c.layout);
    EXPECT_EQ(image->nearest_resize, c.nearest);
    EXPECT_EQ(image->transparent_gray, c.key);
    EXPECT_EQ(image->pixels.size(),
              size_t{image->width} * image->height * static_cast<size_t>(image->channels()));
  }
}

TEST(ImageDecode, ExifOrientationIsNotApplied) {
  // Orientation 6 would display it 16 wide and 40 high; the released processor (PIL.Image.open,
  // no exif_transpose) keeps the stored 40 x 16, and so do we.
  auto image = DecodeImage(Bytes("exif_rot6_40x16.jpg"), "exif");
  ASSERT_TRUE(image.ok()) << image.status().ToString();
  EXPECT_EQ(image->width, 40u);
  EXPECT_EQ(image->height, 16u);
}

TEST(ImageDecode, Gray16KeepsTheHighByte) {
  // The documented deviation: Pillow 9.4 opens 16-bit gray as mode I and its RGB conversion
  // clips at 255 (an almost white image); we keep the high byte, like every other 16-bit kind.
  auto wide = DecodeImage(Bytes("gray16_20x15.png"), "gray16");
  auto narrow = DecodeImage(Bytes("gray16_hi_20x15.png"), "gray16_hi");
  ASSERT_TRUE(wide.ok()) << wide.status().ToString();
  ASSERT_TRUE(narrow.ok()) << narrow.status().ToString();
  EXPECT_EQ(wide->pixels, narrow->pixels);
}

TEST(ImageDecode, SniffsMagicNotName) {
  auto image = DecodeImage(Bytes("rgb_30x17.jpg"), "photo.png");
  ASSERT_TRUE(image.ok()) << image.status().ToString();
  EXPECT_EQ(image->format, ImageFormat::kJpeg);
}

void ExpectInvalid(const Status& status, const std::vector<std::string>& parts) {
  EXPECT_EQ(status.code(), Code::kInvalid) << status.ToString();
  for (const std::string& part : parts) {
    EXPECT_NE(status.message().find(part), std::string::npos)
        << "'" << part << "' not in: " << status.message();
  }
}

TEST(ImageDecode, NotAnImage) {
  auto r = DecodeImage("GIF89a\x01\x00\x01\x00", "cat.gif");
  ASSERT_FALSE(r.ok());
  ExpectInvalid(r.status(), {"cat.gif: ", "not a PNG or JPEG image", "first bytes 47 49 46 38"});
  auto empty = DecodeImage("", "empty.png");
  ASSERT_FALSE(empty.ok());
  ExpectInvalid(empty.status(), {"empty.png: ", "not a PNG or JPEG image (empty)"});
  auto probe = ProbeImage("hello world", "hello.txt");
  ASSERT_FALSE(probe.ok());
  ExpectInvalid(probe.status(), {"hello.txt: ", "first bytes 68 65 6c 6c 6f 20 77 6f ..."});
}

TEST(ImageDecode, TruncatedPng) {
  const std::string bytes = Bytes("rgba_61x47.png");
  for (size_t keep : {bytes.size() / 2, size_t{40}, bytes.size() - 13}) {
    auto r = DecodeImage(std::string_view(bytes).substr(0, keep), "cut.png");
    ASSERT_FALSE(r.ok()) << keep;
    ExpectInvalid(r.status(),
                  {"cut.png: ", "truncated PNG", "ends at byte " + std::to_string(keep)});
  }
}

TEST(ImageDecode, TruncatedJpeg) {
  const std::string bytes = Bytes("rgb_30x17.jpg");
  for (size_t keep : {bytes.size() * 3 / 5, size_t{30}}) {
    auto r = DecodeImage(std::string_view(bytes).substr(0, keep), "cut.jpg");
    ASSERT_FALSE(r.ok()) << keep;
    ExpectInvalid(r.status(), {"cut.jpg: ", "truncated JPEG"});
  }
}

std::string WithIhdrSize(uint32_t w, uint32_t h) {
  std::string bytes = Bytes("rgb_30x17.png");
  for (int i = 0; i < 4; ++i) {
    bytes[static_cast<size_t>(16 + i)] = static_cast<char>(w >> (24 - 8 * i));
    bytes[static_cast<size_t>(20 + i)] = static_cast<char>(h >> (24 - 8 * i));
  }
  return bytes;
}

TEST(ImageDecode, ZeroByZeroPng) {
  auto r = DecodeImage(WithIhdrSize(0, 0), "zero.png");
  ASSERT_FALSE(r.ok());
  ExpectInvalid(r.status(), {"zero.png: ", "PNG header gives a 0x0 image", "at least 1 pixel"});
  auto p = ProbeImage(WithIhdrSize(30, 0), "flat.png");
  ASSERT_FALSE(p.ok());
  ExpectInvalid(p.status(), {"flat.png: ", "30x0"});
}

TEST(ImageDecode, SideOverLimit) {
  auto r = DecodeImage(WithIhdrSize(70000, 10), "wide.png");
  ASSERT_FALSE(r.ok());
  ExpectInvalid(r.status(), {"wide.png: ", "70000x10", "each side must be at most 65535"});
}

TEST(ImageDecode, PixelsOverLimit) {
  auto r = ProbeImage(WithIhdrSize(20000, 20000), "huge.png");
  ASSERT_FALSE(r.ok());
  ExpectInvalid(r.status(), {"huge.png: ", "400000000 pixels", "at most 178956970",
                             "decompression-bomb"});
  DecodeLimits small;
  small.max_pixels = 1000;
  auto s = DecodeImage(Bytes("rgba_61x47.png"), "rgba.png", small);
  ASSERT_FALSE(s.ok());
  ExpectInvalid(s.status(), {"rgba.png: ", "2867 pixels", "at most 1000"});
}

TEST(ImageDecode, CorruptPng) {
  std::string bytes = Bytes("rgba_61x47.png");
  for (size_t i = 60; i < 90; ++i) bytes[i] = static_cast<char>(bytes[i] ^ 0x5A);
  auto r = DecodeImage(bytes, "bad.png");
  ASSERT_FALSE(r.ok());
  ExpectInvalid(r.status(), {"bad.png: ", "corrupt PNG: "});
}

TEST(ImageDecode, CorruptJpeg) {
  // SOF0 turned into SOF15 (lossless arithmetic coding, which libjpeg does not decode).
  std::string bytes = Bytes("rgb_30x17.jpg");
  const size_t sof = bytes.find("\xFF\xC0");
  ASSERT_NE(sof, std::string::npos);
  bytes[sof + 1] = '\xCF';
  auto r = DecodeImage(bytes, "odd.jpg");
  ASSERT_FALSE(r.ok());
  ExpectInvalid(r.status(), {"odd.jpg: ", "corrupt or unsupported JPEG: "});
  // A marker segment that claims more bytes than there are.
  const std::string junk = std::string("\xFF\xD8\xFF\xE0") + std::string(40, '\x7F');
  auto j = DecodeImage(junk, "junk.jpg");
  ASSERT_FALSE(j.ok());
  ExpectInvalid(j.status(), {"junk.jpg: ", "JPEG"});
}

TEST(ImageDecode, ReadImageFileNamesThePath) {
  test::TempDir dir;
  const std::string missing = dir.Join("nope.png");
  auto r = ReadImageFile(missing);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(missing), std::string::npos) << r.status().ToString();
  const std::string text = dir.WriteFile("notes.png", "just text");
  auto t = ReadImageFile(text);
  ASSERT_FALSE(t.ok());
  ExpectInvalid(t.status(), {text + ": not a PNG or JPEG image"});
  auto ok = ReadImageFile(kImages + "rgb_1x1.png");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->pixels, (std::vector<uint8_t>{200, 30, 90}));
}

// ---- the resize, without Python -------------------------------------------------------------

TEST(ImageResize, SameSizeIsACopyAndAlphaIsFlattened) {
  Image im;
  im.width = 9;
  im.height = 2;
  im.layout = PixelLayout::kRgba;
  for (uint32_t i = 0; i < 18; ++i) {
    const uint8_t a = i < 9 ? 0 : 255;  // row 0 transparent, row 1 opaque
    im.pixels.insert(im.pixels.end(), {10, 20, 30, a});
  }
  const std::vector<uint8_t> rgb = ResizeToRgb(im, 9, 2);
  // Transparent: the chessboard (x 0..7 white, x 8 gray); opaque: the colour.
  EXPECT_EQ(rgb[0], 255);
  EXPECT_EQ(rgb[8 * 3], 180);
  EXPECT_EQ(rgb[9 * 3], 10);
  EXPECT_EQ(rgb[9 * 3 + 2], 30);
}

TEST(ImageResize, ConstantImageStaysConstant) {
  // Normalised bicubic weights sum to one in 22-bit fixed point: a flat image stays flat.
  const uint32_t w = 301, h = 77, ow = 123, oh = 40;
  std::vector<uint8_t> src(size_t{w} * h * 3, 173), dst(size_t{ow} * oh * 3);
  ResizeBicubic8(src.data(), w, h, 3, dst.data(), ow, oh);
  for (uint8_t v : dst) ASSERT_EQ(v, 173);
}

}  // namespace
}  // namespace k3::vision
