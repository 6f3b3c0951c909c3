// The vision tower against the float64 torch reference (tests/reference/vision_ref.py), its bits
// across thread counts and ISA paths, its scratch, and its refusals.
//
// The reference runs once per model (tiny: BF16 matrices, pos grid 8×8; small: F32 matrices, pos
// grid 16×16) on every grid of the model's case list, through files: this test writes the
// weights under their released names as safetensors, the patches as float32 and a cases.json;
// vision_ref.py writes float64 rows back. Skipped visibly when /usr/bin/python3 lacks torch.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "k3run/kernels/matmul.h"
#include "k3run/vision/vision_tower.h"
#include "tests/k3run/vision/vision_ref_runner.h"
#include "tests/support/temp_dir.h"

namespace k3::vision {
namespace {

using kernels::Isa;
using kernels::Matrix;
using kernels::WeightType;
using Json = nlohmann::json;

struct Grid {
  int gh, gw;
};

// ---- a random model --------------------------------------------------------------------------

// One tensor: its released name and shape, and its bytes (F32 or BF16).
struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  bool bf16 = false;
  std::vector<float> f32;      // when !bf16
  std::vector<uint16_t> b16;   // when bf16
};

struct Model {
  VisionDims dims;
  std::vector<std::unique_ptr<Tensor>> tensors;
  VisionWeights w;
};

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  float Uniform(float a) { return std::uniform_real_distribution<float>(-a, a)(gen_); }

 private:
  std::mt19937_64 gen_;
};

Tensor* Add(Model& m, std::string name, std::vector<int64_t> shape, bool bf16, float center,
            float spread, Rng& rng) {
  auto t = std::make_unique<Tensor>();
  t->name = std::move(name);
  t->shape = std::move(shape);
  t->bf16 = bf16;
  int64_t count = 1;
  for (int64_t s : t->shape) count *= s;
  for (int64_t i = 0; i < count; ++i) {
    const float v = center + rng.Uniform(spread);
    if (bf16) {
      t->b16.push_back(kernels::F32ToBf16RoundNearestEven(v));
    } else {
      t->f32.push_back(v);
    }
  }
  m.tensors.push_back(std::move(t));
  return m.tensors.back().get();
}

Matrix View(const Tensor* t, int64_t rows, int64_t cols) {
  return Matrix{t->bf16 ? WeightType::kBF16 : WeightType::kF32, rows, cols,
                t->bf16 ? static_cast<const void*>(t->b16.data())
                        : static_cast<const void*>(t->f32.data()),
                nullptr};
}

// Matrices uniform in ±sqrt(3/cols) (unit variance gain), norms 1 ± 0.2, pos-emb ±0.5.
std::unique_ptr<Model> MakeModel(const VisionDims& d, bool bf16, uint64_t seed) {
  auto m = std::make_unique<Model>();
  m->dims = d;
  Rng rng(seed);
  auto mat = [&](const std::string& name, std::vector<int64_t> shape, int64_t rows,
                 int64_t cols) {
    const Tensor* t =
        Add(*m, name, std::move(shape), bf16, 0.0f, std::sqrt(3.0f / static_cast<float>(cols)), rng);
    return View(t, rows, cols);
  };
  auto norm = [&](const std::string& name, int64_t n) {
    return Add(*m, name, {n}, false, 1.0f, 0.2f, rng)->f32.data();
  };
  const int64_t H = d.hidden, Q = d.qkv(), M = d.merged();
  m->w.patch_proj = mat("vision_tower.patch_embed.proj.weight", {H, 3, d.patch, d.patch}, H,
                        d.patch_dim());
  m->w.pos_emb = View(Add(*m, "vision_tower.patch_embed.pos_emb.weight", {d.pos_h, d.pos_w, H},
                          bf16, 0.0f, 0.5f, rng),
                      d.pos_h * d.pos_w, H);
  for (int64_t l = 0; l < d.layers; ++l) {
    VisionBlockWeights b;
    b.norm0 = norm(VisionBlockTensorName(l, "norm0"), H);
    b.norm1 = norm(VisionBlockTensorName(l, "norm1"), H);
    b.wqkv = mat(VisionBlockTensorName(l, "wqkv"), {3 * Q, H}, 3 * Q, H);
    b.wo = mat(VisionBlockTensorName(l, "wo"), {H, Q}, H, Q);
    b.fc0 = mat(VisionBlockTensorName(l, "mlp.fc0"), {d.mlp, H}, d.mlp, H);
    b.fc1 = mat(VisionBlockTensorName(l, "mlp.fc1"), {H, d.mlp}, H, d.mlp);
    m->w.blocks.push_back(b);
  }
  m->w.final_norm = norm("vision_tower.encoder.final_layernorm.weight", H);
  m->w.proj0 = mat("mm_projector.proj.0.weight", {M, M}, M, M);
  m->w.proj2 = mat("mm_projector.proj.2.weight", {d.text_hidden, M}, d.text_hidden, M);
  m->w.post_norm = norm("mm_projector.post_norm.weight", d.text_hidden);
  return m;
}

// Tiny: qkv width 48 != hidden 64 (wo not square), 3 heads of 16.
VisionDims TinyDims() {
  VisionDims d;
  d.hidden = 64;
  d.heads = 3;
  d.head_dim = 16;
  d.mlp = 128;
  d.layers = 2;
  d.pos_h = d.pos_w = 8;
  d.text_hidden = 96;
  return d;
}

// Small: 4 heads of 40 (qkv 160), 3 layers, pos grid 16×16.
VisionDims SmallDims() {
  VisionDims d;
  d.hidden = 128;
  d.heads = 4;
  d.head_dim = 40;
  d.mlp = 256;
  d.layers = 3;
  d.pos_h = d.pos_w = 16;
  d.text_hidden = 160;
  return d;
}

std::vector<float> RandomPatches(const VisionDims& d, Grid g, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> p(static_cast<size_t>(int64_t{g.gh} * g.gw * d.patch_dim()));
  for (float& v : p) v = rng.Uniform(1.0f);
  return p;
}

std::vector<float> RunTower(const Model& m, const std::vector<float>& patches, Grid g) {
  std::vector<float> out(static_cast<size_t>(g.gh / 2 * (g.gw / 2) * m.dims.text_hidden));
  const Status st = RunVisionTower(m.w, m.dims, patches.data(), g.gh, g.gw, out.data());
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out;
}

// ---- the reference, through files ----------------------------------------------------------

bool TorchPresent() {
  return std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
}

void WriteBytes(const std::string& path, const void* data, size_t bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  ASSERT_TRUE(f.good()) << path;
}

void WriteSafetensors(const Model& m, const std::string& path) {
  Json header = Json::object();
  int64_t at = 0;
  for (const auto& t : m.tensors) {
    const int64_t bytes = t->bf16 ? static_cast<int64_t>(t->b16.size()) * 2
                                  : static_cast<int64_t>(t->f32.size()) * 4;
    header[t->name] = {{"dtype", t->bf16 ? "BF16" : "F32"},
                       {"shape", t->shape},
                       {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text += ' ';
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = text.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& t : m.tensors) {
    if (t->bf16) {
      f.write(reinterpret_cast<const char*>(t->b16.data()),
              static_cast<std::streamsize>(t->b16.size() * 2));
    } else {
      f.write(reinterpret_cast<const char*>(t->f32.data()),
              static_cast<std::streamsize>(t->f32.size() * 4));
    }
  }
  ASSERT_TRUE(f.good()) << path;
}

// Runs vision_ref.py on every grid; returns the float64 rows per grid (empty on failure).
std::vector<std::vector<double>> Reference(const Model& m, const std::vector<Grid>& grids,
                                           const std::vector<std::vector<float>>& patches) {
  test::TempDir dir;
  WriteSafetensors(m, dir.Join("weights.safetensors"));
  const VisionDims& d = m.dims;
  Json cases = Json::array();
  for (size_t i = 0; i < grids.size(); ++i) {
    const std::string name = "patches_" + std::to_string(i) + ".bin";
    WriteBytes(dir.Join(name), patches[i].data(), patches[i].size() * 4);
    cases.push_back({{"gh", grids[i].gh}, {"gw", grids[i].gw}, {"patches", name}});
  }
  const Json spec = {{"dims", testing::VisionRefDims(d)}, {"cases", cases}};
  dir.WriteFile("cases.json", spec.dump(1));
  std::string output;
  const bool ran = testing::RunVisionRef(dir.path(), &output);
  std::printf("vision_ref.py: %s", output.c_str());
  if (!ran) {
    ADD_FAILURE() << "vision_ref.py failed: " << output;
    return {};
  }
  std::vector<std::vector<double>> out;
  for (size_t i = 0; i < grids.size(); ++i) {
    const size_t count = static_cast<size_t>(grids[i].gh / 2 * (grids[i].gw / 2) * d.text_hidden);
    std::vector<double> rows(count);
    std::ifstream f(dir.Join("out_" + std::to_string(i) + ".bin"), std::ios::binary);
    f.read(reinterpret_cast<char*>(rows.data()), static_cast<std::streamsize>(count * 8));
    if (!f.good()) {
      ADD_FAILURE() << "out_" << i << ".bin: short";
      return {};
    }
    out.push_back(std::move(rows));
  }
  return out;
}

double RelL2(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = static_cast<double>(got[i]) - want[i];
    num += e * e;
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

void CheckAgainstReference(const char* what, const Model& m, const std::vector<Grid>& grids) {
  if (!TorchPresent()) {
    GTEST_SKIP() << "python3-torch is missing (apt-get install python3-torch): the " << what
                 << " tower is NOT checked against the float64 reference";
  }
  std::vector<std::vector<float>> patches;
  for (size_t i = 0; i < grids.size(); ++i) {
    patches.push_back(RandomPatches(m.dims, grids[i], 100 + i));
  }
  const std::vector<std::vector<double>> want = Reference(m, grids, patches);
  ASSERT_EQ(want.size(), grids.size());
  for (size_t i = 0; i < grids.size(); ++i) {
    const std::vector<float> got = RunTower(m, patches[i], grids[i]);
    ASSERT_EQ(got.size(), want[i].size());
    const double rel = RelL2(got, want[i]);
    std::printf("%s %dx%d patches: rel L2 %.3g\n", what, grids[i].gh, grids[i].gw, rel);
    EXPECT_LE(rel, 1e-5) << what << " grid " << grids[i].gh << "x" << grids[i].gw;
  }
}

// Grids: the minimum (a 1×1 or 28×28 px image pads to 2×2), rectangles both ways, the pos grid
// itself (no interpolation), larger than the pos grid (upsampled), more patches than one key
// tile (kKeyTile = 256) with a partial last tile, and a 1024×768 image's grid (56×74: 17 tiles).
TEST(VisionTower, TinyMatchesReference) {
  const auto m = MakeModel(TinyDims(), /*bf16=*/true, 1);
  CheckAgainstReference("tiny", *m,
                        {{2, 2}, {4, 4}, {4, 2}, {2, 4}, {8, 6}, {6, 8}, {8, 8}, {12, 10},
                         {14, 20}, {24, 22}, {56, 74}});
}

TEST(VisionTower, SmallMatchesReference) {
  const auto m = MakeModel(SmallDims(), /*bf16=*/false, 2);
  CheckAgainstReference("small", *m, {{2, 2}, {6, 8}, {10, 4}, {16, 16}, {20, 18}, {4, 30}});
}

// ---- bits ------------------------------------------------------------------------------------

class IsaThreadsRestore : public ::testing::Test {
 protected:
  void TearDown() override {
    kernels::SetIsa(isa_);
    kernels::SetThreads(threads_);
  }
  Isa isa_ = kernels::ActiveIsa();
  int threads_ = kernels::Threads();
};

using VisionTowerBits = IsaThreadsRestore;

// Same bits for 1, 2, 3 threads on every ISA path this CPU has (the scalar path is the yardstick).
void CheckBitsAcrossPaths(const Model& model, Grid g) {
  const Model* m = &model;
  const std::vector<float> patches = RandomPatches(m->dims, g, 7);
  kernels::SetIsa(Isa::kScalar);
  kernels::SetThreads(1);
  const std::vector<float> want = RunTower(*m, patches, g);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!kernels::IsaSupported(isa)) {
      std::printf("SKIPPED path %s: this CPU lacks it; its bits are NOT tested here\n",
                  kernels::IsaName(isa));
      continue;
    }
    kernels::SetIsa(isa);
    for (int threads : {1, 2, 3}) {
      kernels::SetThreads(threads);
      const std::vector<float> got = RunTower(*m, patches, g);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0)
          << "path " << kernels::IsaName(isa) << " threads " << threads << " grid " << g.gh
          << "x" << g.gw;
    }
  }
}

TEST_F(VisionTowerBits, IdenticalAcrossThreadsAndIsaPaths) {
  // 528 patches: three key tiles, the last partial (16 keys: the remainder loops only).
  CheckBitsAcrossPaths(*MakeModel(TinyDims(), true, 3), {24, 22});
}

// head_dim 72: the SIMD P·V blocks (64 columns on avx512, 32 on avx2) and their remainders;
// 360 patches: a last key tile of 104 = 3·32 + 8 keys; a last query block of 8.
TEST_F(VisionTowerBits, IdenticalAcrossPathsWideHeads) {
  VisionDims d = TinyDims();
  d.heads = 2;
  d.head_dim = 72;
  d.layers = 1;
  CheckBitsAcrossPaths(*MakeModel(d, false, 9), {20, 18});
}

// A caller-provided scratch of exactly VisionScratchBytes gives the same bits as the tower's own.
TEST_F(VisionTowerBits, CallerScratchOfStatedSize) {
  const auto m = MakeModel(TinyDims(), true, 4);
  const Grid g{6, 8};
  const std::vector<float> patches = RandomPatches(m->dims, g, 8);
  kernels::SetThreads(2);
  const std::vector<float> want = RunTower(*m, patches, g);
  const int64_t bytes = VisionScratchBytes(m->dims, g.gh, g.gw, 2);
  std::vector<float> scratch(static_cast<size_t>(bytes / 4), std::nanf(""));
  std::vector<float> got(want.size());
  ASSERT_TRUE(RunVisionTower(m->w, m->dims, patches.data(), g.gh, g.gw, got.data(),
                             scratch.data(), bytes)
                  .ok());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0);
  // One float short: refused, naming both sizes, nothing written.
  std::vector<float> untouched(want.size(), 7.0f);
  const Status st = RunVisionTower(m->w, m->dims, patches.data(), g.gh, g.gw, untouched.data(),
                                   scratch.data(), bytes - 4);
  EXPECT_EQ(st.code(), Code::kInvalid);
  EXPECT_NE(st.message().find("scratch of " + std::to_string(bytes - 4) + " bytes, " +
                              std::to_string(bytes) + " needed"),
            std::string::npos)
      << st.message();
  for (float v : untouched) ASSERT_EQ(v, 7.0f);
}

TEST(VisionTowerScratch, LinearInPatches) {
  const VisionDims d = VisionDims::Released();
  const int64_t a = VisionScratchBytes(d, 56, 74, 2), b = VisionScratchBytes(d, 112, 148, 2);
  const int64_t c = VisionScratchBytes(d, 224, 296, 2);
  // Doubling the side quadruples the patches: the growth is 4× minus the fixed part, never 16×.
  EXPECT_LT(c - b, 4 * (b - a) + 4096);
  EXPECT_GT(c - b, 4 * (b - a) - 4096);
  std::printf("released scratch: 56x74 %.1f MB, 112x148 %.1f MB, 224x296 (66,304 patches) %.1f MB\n",
              static_cast<double>(a) / 1e6, static_cast<double>(b) / 1e6,
              static_cast<double>(c) / 1e6);
}

// ---- refusals ------------------------------------------------------------------------------

void ExpectRefused(const Model& m, Grid g, const std::string& needle) {
  const std::vector<float> patches(
      static_cast<size_t>(std::max(1, g.gh * g.gw) * m.dims.patch_dim()), 0.5f);
  std::vector<float> out(4096, 7.0f);
  const Status st = RunVisionTower(m.w, m.dims, patches.data(), g.gh, g.gw, out.data());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Code::kInvalid) << st.ToString();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  for (float v : out) ASSERT_EQ(v, 7.0f) << "output written on a refusal";
}

TEST(VisionTowerRefuses, GridOddTooSmallOrTooLarge) {
  const auto m = MakeModel(TinyDims(), true, 5);
  ExpectRefused(*m, {3, 4}, "3x4");
  ExpectRefused(*m, {4, 5}, "4x5");
  ExpectRefused(*m, {0, 2}, "even and >= 2");
  ExpectRefused(*m, {2, 514}, "at most 512 patches a side");
}

TEST(VisionTowerRefuses, BadShapeNamesTheTensor) {
  const auto m = MakeModel(TinyDims(), true, 6);
  const Grid g{2, 2};
  {
    VisionWeights saved = m->w;
    m->w.blocks[1].wqkv.rows -= 1;
    ExpectRefused(*m, g, "vision_tower.encoder.blocks.1.wqkv.weight: shape [143][64], expected "
                         "[144][64]");
    m->w = saved;
  }
  {
    VisionWeights saved = m->w;
    m->w.patch_proj.cols = 14 * 14;
    ExpectRefused(*m, g, "vision_tower.patch_embed.proj.weight: shape [64][196], expected "
                         "[64][588] (rule: [64, 3, 14, 14]");
    m->w = saved;
  }
  {
    VisionWeights saved = m->w;
    m->w.pos_emb.rows = 7 * 8;
    ExpectRefused(*m, g, "vision_tower.patch_embed.pos_emb.weight");
    m->w = saved;
  }
  {
    VisionWeights saved = m->w;
    m->w.blocks[0].wo.cols = 64;  // the square wo a reader of "hidden" might expect
    ExpectRefused(*m, g, "vision_tower.encoder.blocks.0.wo.weight: shape [64][64], expected "
                         "[64][48]");
    m->w = saved;
  }
  {
    VisionWeights saved = m->w;
    m->w.proj2.rows = 64;
    ExpectRefused(*m, g, "mm_projector.proj.2.weight");
    m->w = saved;
  }
  {
    VisionWeights saved = m->w;
    m->w.blocks[0].fc1.type = WeightType::kMXFP4;
    ExpectRefused(*m, g, "vision_tower.encoder.blocks.0.mlp.fc1.weight: weight type");
    m->w = saved;
  }
}

TEST(VisionTowerRefuses, MissingTensorNamesIt) {
  const auto m = MakeModel(TinyDims(), true, 7);
  m->w.blocks[1].norm1 = nullptr;
  ExpectRefused(*m, {2, 2}, "vision_tower.encoder.blocks.1.norm1.weight: no data");
  m->w.blocks[1].norm1 = m->w.blocks[1].norm0;
  m->w.post_norm = nullptr;
  ExpectRefused(*m, {2, 2}, "mm_projector.post_norm.weight");
  m->w.post_norm = m->w.final_norm;
  m->w.blocks.pop_back();
  ExpectRefused(*m, {2, 2}, "1 blocks, expected 2");
}

TEST(VisionTowerRefuses, BadDims) {
  auto m = MakeModel(TinyDims(), true, 8);
  m->dims.head_dim = 18;
  ExpectRefused(*m, {2, 2}, "head_dim % 4");
}

}  // namespace
}  // namespace k3::vision
