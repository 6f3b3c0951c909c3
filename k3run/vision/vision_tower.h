// The MoonViT-V2 vision tower and the patchmergerv2 projector of Kimi K3: float patches of one
// image in, one text-width embedding per merged 2×2 patch group out (docs/VISION.md "The tower").
//
// Goals: the released math (spec/VISION-AND-TOOLS.md "Vision tower", checked against the public
// MLX port of modeling_kimi_k3.py), every weight product through kernels::MatMul, bits that do
// not depend on the thread count or the ISA path, and attention whose memory is linear in the
// patches (a 17,000-token image has ~68,000 patches; a patches² score matrix would be 18 GB).
// Non-goals: decoding or resizing images (image_*.h), video (t > 1: the sin-cos time term and
// the temporal mean), several images in one call (images never attend to each other, so the
// caller runs one call per image), file I/O (the caller fills VisionWeights from whatever owns
// the bytes).
//
// Pipeline for one image of gh × gw patches (n = gh·gw; gh, gw even), row p = r·gw + c:
//   x[p]  = Wpe·patch[p] + bilinear(pos_emb → gh × gw)[r][c]             (MatMul, [n][hidden])
//   27 ×  x += wo(attn(rope(split(wqkv(rmsnorm0(x))))));  x += fc1(gelu_tanh(fc0(rmsnorm1(x))))
//   x     = rmsnorm_final(x)
//   m[g]  = x[2R·gw + 2C] ‖ x[2R·gw + 2C+1] ‖ x[(2R+1)·gw + 2C] ‖ x[(2R+1)·gw + 2C+1]
//           for merged row g = R·(gw/2) + C (4·hidden wide)
//   out[g] = post_norm(proj2(gelu_erf(proj0(m[g]))))                        ([n/4][text_hidden])
//
// Numerics (DESIGN.md §7 where it applies): every weight product is kernels::MatMul (16 lanes,
// ascending, fixed tree); RMSNorm is ops::RmsNorm (double sum of squares, ascending); gelu_tanh
// uses ops::Tanh; the exact GELU uses std::erf (one scalar libm call per element on every path);
// attention scores and P·V are MatMulOnThisThread over fixed-size key tiles (kKeyTile) with an
// online softmax whose order is fixed by the tile size alone; the RoPE and pos-emb tables are
// computed in double and rounded once. Heads run one after another; a head's query blocks are
// spread over the compute threads
// (kernels::ParallelChunks), each block computed whole by one thread, so the output bits are the
// same for every thread count and ISA path (tests/k3run/vision/vision_tower_test.cpp).
//
// Memory: one working buffer of VisionScratchBytes(dims, gh, gw) bytes, allocated per call
// unless the caller passes one: the residual stream x [n][hidden], the attention output of all
// heads [n][qkv], ONE head's q, k (transposed per key tile) and v (n·head_dim each: attention
// runs head by head), a 1/rms per row, two step buffers of 2·kRowChunk rows for the norms,
// MatMuls, MLP and projector, and one attention slot per thread (one score tile and the
// accumulators of a query block): O(n·(hidden + qkv + 3·head_dim) + threads·tile), never n².
// Released dims: 11.8 KB per patch plus 8.4 MB, so 57 MB for a 1024×768 image (56×74 patches)
// and 0.81 GB for 68,000 patches (a 17,000-token image).
//
// Thread safety: RunVisionTower uses the compute threads (kernels::MatMul, ParallelChunks) and,
// like MatMul, may be called from one thread at a time. The weights are only read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "k3run/kernels/matmul.h"

namespace k3::vision {

// The tower's dimensions. Released() are the values of vision_config in the released config.json;
// tests use scaled ones. All sizes are counts of elements.
struct VisionDims {
  int64_t hidden = 1024;         // vt_hidden_size (= mm_hidden_size)
  int64_t heads = 12;            // vt_num_attention_heads
  int64_t head_dim = 128;        // qkv_hidden_size / heads; a multiple of 4 (2-D RoPE)
  int64_t mlp = 4096;            // vt_intermediate_size
  int64_t layers = 27;           // vt_num_hidden_layers
  int64_t pos_h = 64;            // init_pos_emb_height
  int64_t pos_w = 64;            // init_pos_emb_width
  int64_t patch = 14;            // patch_size (3·patch² inputs per patch)
  int64_t merge = 2;             // merge_kernel_size (2×2; only 2 is supported)
  int64_t text_hidden = 7168;    // text_hidden_size
  // The reference builds the block and final norms as nn.RMSNorm(dim) with no eps, which torch
  // resolves to finfo(fp32).eps = 2^-23 when the tower runs in fp32 (spec; the MLX port pins the
  // same value). A bf16 run of the reference would use 2^-7 instead: see docs/VISION.md.
  float norm_eps = 1.1920929e-07f;
  float projector_eps = 1e-5f;   // projector_ln_eps (mm_projector.post_norm)
  double rope_theta = 10000.0;

  static VisionDims Released() { return VisionDims{}; }
  int64_t qkv() const { return heads * head_dim; }            // qkv_hidden_size (1536)
  int64_t patch_dim() const { return 3 * patch * patch; }     // 588
  int64_t merged() const { return hidden * merge * merge; }   // 4096
  // kInvalid naming the field when a dimension is out of range (non-positive, head_dim % 4,
  // merge != 2).
  Status Validate() const;
};

// Views of the tower's weights (non-owning; they must outlive the call). Matrices are
// [rows = out][cols = in], row-major, F32 or BF16 (the release is BF16; MXFP4 is refused).
// Norm weights are fp32 vectors (the loader widens bf16 exactly, as for the text model).
struct VisionBlockWeights {
  const float* norm0 = nullptr;  // encoder.blocks.N.norm0.weight [hidden]
  const float* norm1 = nullptr;  // encoder.blocks.N.norm1.weight [hidden]
  kernels::Matrix wqkv{};        // encoder.blocks.N.wqkv.weight [3·qkv][hidden], rows q|k|v,
                                 //   each head-major (head h: rows h·head_dim + [0, head_dim))
  kernels::Matrix wo{};          // encoder.blocks.N.wo.weight [hidden][qkv]
  kernels::Matrix fc0{};         // encoder.blocks.N.mlp.fc0.weight [mlp][hidden]
  kernels::Matrix fc1{};         // encoder.blocks.N.mlp.fc1.weight [hidden][mlp]
};

struct VisionWeights {
  // vision_tower.patch_embed.proj.weight [hidden, 3, patch, patch] seen as [hidden][3·patch²]:
  // column (ch·patch + y)·patch + x, the (c, y, x) order of the patches.
  kernels::Matrix patch_proj{};
  // vision_tower.patch_embed.pos_emb.weight [pos_h, pos_w, hidden] seen as [pos_h·pos_w][hidden].
  kernels::Matrix pos_emb{};
  std::vector<VisionBlockWeights> blocks;   // [layers]
  const float* final_norm = nullptr;        // vision_tower.encoder.final_layernorm.weight [hidden]
  kernels::Matrix proj0{};                  // mm_projector.proj.0.weight [4·hidden][4·hidden]
  kernels::Matrix proj2{};                  // mm_projector.proj.2.weight [text_hidden][4·hidden]
  const float* post_norm = nullptr;         // mm_projector.post_norm.weight [text_hidden]

  // Checks every tensor against `dims`: kInvalid naming the released tensor name and the rule
  // broken (shape expected vs actual, dtype, missing data, block count).
  Status Validate(const VisionDims& dims) const;
};

// The released name of block `layer`'s tensor `leaf` ("wqkv", "mlp.fc0", "norm0", ...).
std::string VisionBlockTensorName(int64_t layer, const std::string& leaf);

// Fixed key-tile size of the attention (keys per online-softmax step). Part of the numerics:
// changing it changes the bits, so it is a constant, not a parameter.
inline constexpr int64_t kKeyTile = 256;
// Queries per attention work item (one thread computes a block whole).
inline constexpr int64_t kQueryBlock = 16;
// Most activation rows per weight MatMul: the T rows of one call stay in L2 while each weight
// row block is reused for all of them (docs/PERFORMANCE.md "Vision tower"). Not part of the
// numerics: MatMul rows are independent.
inline constexpr int64_t kRowChunk = 128;

// Largest gh or gw accepted: 7,168 px / 14 (the preprocessing's longest side; the reference's
// Rope2DPosEmbRepeated table is 512 × 512).
inline constexpr int kMaxGridSide = 512;

// Bytes of working memory RunVisionTower needs for a gh × gw grid at `threads` compute threads
// (kernels::Threads() when threads <= 0). Linear in gh·gw (see the header comment).
int64_t VisionScratchBytes(const VisionDims& dims, int64_t gh, int64_t gw, int threads = 0);

// Runs the tower and projector on one image. patches: [gh·gw][3·patch²] fp32, row-major over
// (gh, gw), each patch in (c, y, x) order (image_patches.h). out_rows: [(gh/2)·(gw/2)][text_hidden]
// fp32. scratch: nullptr (allocated here), or scratch_bytes ≥ VisionScratchBytes(dims, gh, gw)
// at the current kernels::Threads(), 64-byte aligned for speed (any float alignment works).
// Errors (nothing written): kInvalid for gh or gw odd, < 2 or > kMaxGridSide, invalid dims,
// weights failing Validate (naming the tensor), or a scratch smaller than needed (naming both
// sizes); kIo when the working memory cannot be allocated.
Status RunVisionTower(const VisionWeights& w, const VisionDims& dims, const float* patches,
                      int gh, int gw, float* out_rows, void* scratch = nullptr,
                      int64_t scratch_bytes = 0);

}  // namespace k3::vision
