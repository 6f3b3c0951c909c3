// The MoonViT-V2 tower and the patchmergerv2 projector, in data-flow order (vision_tower.h).
#include "k3run/vision/vision_tower.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>

#include "k3run/kernels/thread_pool.h"
#include "k3run/ops/math.h"
#include "k3run/ops/norm.h"
#include "k3run/vision/vision_attention.h"

namespace k3::vision {

// ---- validation ----------------------------------------------------------------------------

Status VisionDims::Validate() const {
  auto positive = [](int64_t v, const char* name) -> Status {
    if (v > 0 && v <= (int64_t{1} << 20)) return Status::Ok();
    return Status::Invalid(std::string("vision dims: ") + name + " = " + std::to_string(v) +
                           " (rule: 1 <= " + name + " <= 2^20)");
  };
  K3_RETURN_IF_ERROR(positive(hidden, "hidden"));
  K3_RETURN_IF_ERROR(positive(heads, "heads"));
  K3_RETURN_IF_ERROR(positive(head_dim, "head_dim"));
  K3_RETURN_IF_ERROR(positive(mlp, "mlp"));
  K3_RETURN_IF_ERROR(positive(layers, "layers"));
  K3_RETURN_IF_ERROR(positive(pos_h, "pos_h"));
  K3_RETURN_IF_ERROR(positive(pos_w, "pos_w"));
  K3_RETURN_IF_ERROR(positive(patch, "patch"));
  K3_RETURN_IF_ERROR(positive(text_hidden, "text_hidden"));
  if (head_dim % 4 != 0) {
    return Status::Invalid("vision dims: head_dim = " + std::to_string(head_dim) +
                           " (rule: the 2-D RoPE needs head_dim % 4 == 0)");
  }
  if (merge != 2) {
    return Status::Invalid("vision dims: merge = " + std::to_string(merge) +
                           " (rule: only the released 2×2 merge is supported)");
  }
  return Status::Ok();
}

std::string VisionBlockTensorName(int64_t layer, const std::string& leaf) {
  return "vision_tower.encoder.blocks." + std::to_string(layer) + "." + leaf + ".weight";
}

namespace {

std::string Shape(int64_t r, int64_t c) {
  return "[" + std::to_string(r) + "][" + std::to_string(c) + "]";
}

// A matrix of the tower: F32 or BF16, exactly [rows][cols]. `shown` is the released shape.
Status CheckMatrix(const kernels::Matrix& m, const std::string& name, int64_t rows, int64_t cols,
                   const std::string& shown) {
  if (m.type != kernels::WeightType::kF32 && m.type != kernels::WeightType::kBF16) {
    return Status::Invalid(name + ": weight type " + std::to_string(static_cast<int>(m.type)) +
                           " (rule: vision weights are F32 or BF16)");
  }
  if (m.rows != rows || m.cols != cols) {
    return Status::Invalid(name + ": shape " + Shape(m.rows, m.cols) + ", expected " +
                           Shape(rows, cols) + " (rule: " + shown + " for these vision dims)");
  }
  if (m.data == nullptr) return Status::Invalid(name + ": no data (rule: every tensor is set)");
  return kernels::ValidateMatrix(m, name);
}

Status CheckVector(const float* v, const std::string& name) {
  if (v == nullptr) return Status::Invalid(name + ": no data (rule: every tensor is set)");
  return Status::Ok();
}

}  // namespace

Status VisionWeights::Validate(const VisionDims& d) const {
  K3_RETURN_IF_ERROR(d.Validate());
  const std::string H = std::to_string(d.hidden), P = std::to_string(d.patch);
  K3_RETURN_IF_ERROR(CheckMatrix(patch_proj, "vision_tower.patch_embed.proj.weight", d.hidden,
                                 d.patch_dim(), "[" + H + ", 3, " + P + ", " + P + "]"));
  K3_RETURN_IF_ERROR(CheckMatrix(pos_emb, "vision_tower.patch_embed.pos_emb.weight",
                                 d.pos_h * d.pos_w, d.hidden,
                                 "[" + std::to_string(d.pos_h) + ", " + std::to_string(d.pos_w) +
                                     ", " + H + "]"));
  if (static_cast<int64_t>(blocks.size()) != d.layers) {
    return Status::Invalid("vision_tower.encoder.blocks: " + std::to_string(blocks.size()) +
                           " blocks, expected " + std::to_string(d.layers) +
                           " (rule: one block per layer)");
  }
  for (int64_t l = 0; l < d.layers; ++l) {
    const VisionBlockWeights& b = blocks[static_cast<size_t>(l)];
    K3_RETURN_IF_ERROR(CheckVector(b.norm0, VisionBlockTensorName(l, "norm0")));
    K3_RETURN_IF_ERROR(CheckVector(b.norm1, VisionBlockTensorName(l, "norm1")));
    auto mat = [&](const kernels::Matrix& m, const char* leaf, int64_t r, int64_t c) {
      return CheckMatrix(m, VisionBlockTensorName(l, leaf), r, c,
                         "[" + std::to_string(r) + ", " + std::to_string(c) + "]");
    };
    K3_RETURN_IF_ERROR(mat(b.wqkv, "wqkv", 3 * d.qkv(), d.hidden));
    K3_RETURN_IF_ERROR(mat(b.wo, "wo", d.hidden, d.qkv()));
    K3_RETURN_IF_ERROR(mat(b.fc0, "mlp.fc0", d.mlp, d.hidden));
    K3_RETURN_IF_ERROR(mat(b.fc1, "mlp.fc1", d.hidden, d.mlp));
  }
  K3_RETURN_IF_ERROR(CheckVector(final_norm, "vision_tower.encoder.final_layernorm.weight"));
  const std::string M = std::to_string(d.merged()), T = std::to_string(d.text_hidden);
  K3_RETURN_IF_ERROR(CheckMatrix(proj0, "mm_projector.proj.0.weight", d.merged(), d.merged(),
                                 "[" + M + ", " + M + "]"));
  K3_RETURN_IF_ERROR(CheckMatrix(proj2, "mm_projector.proj.2.weight", d.text_hidden, d.merged(),
                                 "[" + T + ", " + M + "]"));
  return CheckVector(post_norm, "mm_projector.post_norm.weight");
}

// ---- working memory ------------------------------------------------------------------------

namespace {

// Rows per step of the row-wise phases (norms, MatMuls, the MLP, the projector).
constexpr int64_t kStepRows = 2 * kRowChunk;

// Offsets (in floats, each rounded to 16 = 64 bytes) of the buffers in one scratch block.
struct Layout {
  int64_t x = 0, o = 0, inv = 0, q = 0, kt = 0, v = 0, a = 0, b = 0, slots = 0, total = 0;
};

int64_t Round16(int64_t f) { return (f + 15) / 16 * 16; }

Layout MakeLayout(const VisionDims& d, int64_t n, int threads) {
  Layout l;
  int64_t at = 0;
  auto take = [&](int64_t floats) {
    const int64_t here = at;
    at += Round16(floats);
    return here;
  };
  const int64_t Q = d.qkv();
  l.x = take(n * d.hidden);    // residual stream [n][hidden]
  l.o = take(n * Q);           // attention output of all heads [n][Q]
  l.inv = take(n);             // norm0's 1/rms per row, reused by every head
  l.q = take(n * d.head_dim);  // one head's q [n][d]
  l.kt = take(n * d.head_dim); // one head's k, transposed per key tile
  l.v = take(n * d.head_dim);  // one head's v [n][d]
  // Step buffers: a holds a step's normed rows or merged rows; b a step's MatMul outputs.
  l.a = take(kStepRows * std::max(d.hidden, d.merged()));
  l.b = take(kStepRows * std::max({3 * d.head_dim, d.mlp, d.merged(), d.hidden}));
  l.slots = take(static_cast<int64_t>(threads) * internal::AttentionSlotFloats(d));
  l.total = at;
  return l;
}

struct AlignedDelete {
  void operator()(float* p) const { ::operator delete(p, std::align_val_t{64}); }
};

int ResolveThreads(int threads) { return threads > 0 ? threads : kernels::Threads(); }

// y = W·x for T rows, in sub-calls whose activation rows fit in L2 next to a weight row block
// (MatMul re-reads every activation row for each 4-row weight block). Same bits as one call.
void MatMulRows(const kernels::Matrix& w, const float* x, int64_t T, float* y) {
  // Measured (bf16, 1 thread, docs/PERFORMANCE.md "Vision tower"): T = 128 beats 64 and 256 at
  // 1024 and 1536 columns, T = 64 is best at 4096; i.e. about 1 MB of activations per call.
  constexpr int64_t kActivationBytes = 1 << 20;
  int64_t step = kActivationBytes / (4 * std::max<int64_t>(w.cols, 1));
  step = std::clamp<int64_t>(step / 4 * 4, 16, kRowChunk);
  for (int64_t t = 0; t < T; t += step) {
    const int64_t rows = std::min(step, T - t);
    kernels::MatMul(w, x + t * w.cols, rows, y + t * w.rows);
  }
}

// fn(r0, r1) over [0, rows) in blocks spread over the compute threads; for element-wise and
// row-wise work whose result does not depend on the split.
template <class Fn>
void ParallelRows(int threads, int64_t rows, int64_t block, const Fn& fn) {
  const int64_t chunks = (rows + block - 1) / block;
  kernels::ParallelChunks(threads, chunks, [&](int64_t c) {
    fn(c * block, std::min(rows, (c + 1) * block));
  });
}

// gelu_pytorch_tanh: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), fp32, in this order.
void GeluTanh(float* v, int64_t count) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  constexpr float kCubic = 0.044715f;
  for (int64_t i = 0; i < count; ++i) {
    const float x = v[i];
    const float inner = kSqrt2OverPi * (x + kCubic * (x * x * x));
    v[i] = (0.5f * x) * (1.0f + ops::Tanh(inner));
  }
}

// nn.GELU() (exact): 0.5·x·(1 + erf(x/√2)), erf by libm's erff on every path.
void GeluErf(float* v, int64_t count) {
  constexpr float kInvSqrt2 = 0.70710678118654752f;
  for (int64_t i = 0; i < count; ++i) {
    const float x = v[i];
    v[i] = (0.5f * x) * (1.0f + std::erf(x * kInvSqrt2));
  }
}

float MatrixAt(const kernels::Matrix& m, int64_t r, int64_t c) {
  if (m.type == kernels::WeightType::kBF16) {
    return kernels::Bf16ToF32(static_cast<const uint16_t*>(m.data)[r * m.cols + c]);
  }
  return static_cast<const float*>(m.data)[r * m.cols + c];
}

// torch's bilinear source index for align_corners=False along one axis: for destination d,
// src = max(0, (d + 0.5)·in/out − 0.5), i0 = floor(src), i1 = min(i0 + 1, in − 1),
// weights (1 − λ, λ) with λ = src − i0. In double.
struct Axis {
  std::vector<int64_t> i0, i1;
  std::vector<double> l0, l1;
};
Axis BilinearAxis(int64_t in, int64_t out) {
  Axis a;
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  for (int64_t dst = 0; dst < out; ++dst) {
    const double src = std::max(0.0, (static_cast<double>(dst) + 0.5) * scale - 0.5);
    const int64_t i0 = std::min(static_cast<int64_t>(src), in - 1);
    const double lam = src - static_cast<double>(i0);
    a.i0.push_back(i0);
    a.i1.push_back(std::min(i0 + 1, in - 1));
    a.l0.push_back(1.0 - lam);
    a.l1.push_back(lam);
  }
  return a;
}

// x[p] += pos_emb resized to gh × gw (exact copy when the grid equals the table's). Bilinear, as
// the released config (pos_emb_interpolation_mode), the spec and the MLX port have it; the
// TensorRT-LLM K3 port reuses K2.5's module, whose comment says bicubic (K2.5's mode): not
// followed (docs/VISION.md "Sources followed").
void AddPosEmb(const VisionDims& d, const kernels::Matrix& pe, int64_t gh, int64_t gw, float* x,
               int threads) {
  const int64_t H = d.hidden;
  const bool same = gh == d.pos_h && gw == d.pos_w;
  const Axis ay = BilinearAxis(d.pos_h, gh), ax = BilinearAxis(d.pos_w, gw);
  ParallelRows(threads, gh * gw, 16, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t r = p / gw, c = p % gw;
      float* row = x + p * H;
      if (same) {
        for (int64_t j = 0; j < H; ++j) row[j] = row[j] + MatrixAt(pe, p, j);
        continue;
      }
      const size_t ri = static_cast<size_t>(r), ci = static_cast<size_t>(c);
      const int64_t r00 = ay.i0[ri] * d.pos_w + ax.i0[ci], r01 = ay.i0[ri] * d.pos_w + ax.i1[ci];
      const int64_t r10 = ay.i1[ri] * d.pos_w + ax.i0[ci], r11 = ay.i1[ri] * d.pos_w + ax.i1[ci];
      const double h0 = ay.l0[ri], h1 = ay.l1[ri], w0 = ax.l0[ci], w1 = ax.l1[ci];
      for (int64_t j = 0; j < H; ++j) {
        const double v = h0 * (w0 * MatrixAt(pe, r00, j) + w1 * MatrixAt(pe, r01, j)) +
                         h1 * (w0 * MatrixAt(pe, r10, j) + w1 * MatrixAt(pe, r11, j));
        row[j] = row[j] + static_cast<float>(v);
      }
    }
  });
}

// y[i] = rmsnorm(x[i]) for `rows` rows of width n.
void NormRows(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y,
              int threads) {
  ParallelRows(threads, rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) ops::RmsNorm(x + r * n, w, n, eps, y + r * n);
  });
}

// inv[i] = fp32(1/sqrt(Σ x_i² / n + eps)) with the sum in double, ascending: ops::RmsNorm's
// factor (norm.h), kept so that each head's pass normalises with one multiply per element.
void RowInvRms(const float* x, int64_t rows, int64_t n, float eps, float* inv, int threads) {
  ParallelRows(threads, rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * n;
      double ss = 0.0;
      for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * static_cast<double>(xr[i]);
      inv[r] = static_cast<float>(
          1.0 / std::sqrt(ss / static_cast<double>(n) + static_cast<double>(eps)));
    }
  });
}

// y[r][i] = (w_i·x[r][i])·inv[r]: ops::RmsNorm's output, bit for bit, from a saved factor.
void ApplyInvRms(const float* x, const float* w, const float* inv, int64_t rows, int64_t n,
                 float* y, int threads) {
  ParallelRows(threads, rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t i = 0; i < n; ++i) y[r * n + i] = (w[i] * x[r * n + i]) * inv[r];
    }
  });
}

// Rows [r0, r0 + rows) of a matrix, as a matrix (row-major, so contiguous).
kernels::Matrix RowSlice(const kernels::Matrix& m, int64_t r0, int64_t rows) {
  const int64_t elem = m.type == kernels::WeightType::kBF16 ? 2 : 4;
  return kernels::Matrix{m.type, rows, m.cols, static_cast<const char*>(m.data) + r0 * m.cols * elem,
                         nullptr};
}

void AddInto(float* x, const float* y, int64_t count, int threads) {
  ParallelRows(threads, count, 1 << 14, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) x[i] = x[i] + y[i];
  });
}

// One encoder block over all n rows of x. Attention runs one head at a time: the head's q, k
// and v come from its three row slices of wqkv (MatMul output rows are independent, so a slice
// gives the same bits as the whole matrix), then all of its queries attend, writing the head's
// columns of o; wo then reads o whole. Only one head's q, k, v are ever held.
void Block(const VisionDims& d, const VisionBlockWeights& bw, const internal::RopeTables& rope,
           int64_t gw, int64_t n, const Layout& L, float* base, int threads) {
  float* x = base + L.x;
  float* o = base + L.o;
  float* inv = base + L.inv;
  float* q = base + L.q;
  float* kt = base + L.kt;
  float* v = base + L.v;
  float* a = base + L.a;
  float* b = base + L.b;
  const int64_t H = d.hidden, Q = d.qkv(), hd = d.head_dim;
  RowInvRms(x, n, H, d.norm_eps, inv, threads);
  for (int64_t h = 0; h < d.heads; ++h) {
    const kernels::Matrix wq = RowSlice(bw.wqkv, h * hd, hd);
    const kernels::Matrix wk = RowSlice(bw.wqkv, Q + h * hd, hd);
    const kernels::Matrix wv = RowSlice(bw.wqkv, 2 * Q + h * hd, hd);
    for (int64_t p0 = 0; p0 < n; p0 += kStepRows) {
      const int64_t rows = std::min(kStepRows, n - p0);
      ApplyInvRms(x + p0 * H, bw.norm0, inv + p0, rows, H, a, threads);
      float* bq = b;
      float* bk = b + rows * hd;
      float* bv = b + 2 * rows * hd;
      MatMulRows(wq, a, rows, bq);
      MatMulRows(wk, a, rows, bk);
      MatMulRows(wv, a, rows, bv);
      internal::ScatterHead(d, rope, gw, n, bq, bk, bv, p0, rows, q, kt, v);
    }
    internal::AttendHead(d, n, q, kt, v, o + h * hd, Q, base + L.slots, threads);
  }
  for (int64_t p0 = 0; p0 < n; p0 += kStepRows) {
    const int64_t rows = std::min(kStepRows, n - p0);
    MatMulRows(bw.wo, o + p0 * Q, rows, b);
    AddInto(x + p0 * H, b, rows * H, threads);
  }
  // MLP.
  for (int64_t p0 = 0; p0 < n; p0 += kStepRows) {
    const int64_t rows = std::min(kStepRows, n - p0);
    NormRows(x + p0 * H, bw.norm1, rows, H, d.norm_eps, a, threads);
    MatMulRows(bw.fc0, a, rows, b);
    ParallelRows(threads, rows, 4, [&](int64_t r0, int64_t r1) {
      GeluTanh(b + r0 * d.mlp, (r1 - r0) * d.mlp);
    });
    MatMulRows(bw.fc1, b, rows, a);
    AddInto(x + p0 * H, a, rows * H, threads);
  }
}

}  // namespace

int64_t VisionScratchBytes(const VisionDims& dims, int64_t gh, int64_t gw, int threads) {
  return 4 * MakeLayout(dims, gh * gw, ResolveThreads(threads)).total;
}

// ---- the tower -----------------------------------------------------------------------------

Status RunVisionTower(const VisionWeights& w, const VisionDims& d, const float* patches, int gh,
                      int gw, float* out_rows, void* scratch, int64_t scratch_bytes) {
  if (gh < 2 || gw < 2 || gh % 2 != 0 || gw % 2 != 0) {
    return Status::Invalid("vision tower: patch grid " + std::to_string(gh) + "x" +
                           std::to_string(gw) + " (rule: gh and gw are even and >= 2; the " +
                           "preprocessing pads images to multiples of 28 px = 2 patches)");
  }
  if (gh > kMaxGridSide || gw > kMaxGridSide) {
    return Status::Invalid("vision tower: patch grid " + std::to_string(gh) + "x" +
                           std::to_string(gw) + " (rule: at most " +
                           std::to_string(kMaxGridSide) + " patches a side, the 7,168 px the " +
                           "preprocessing allows; the reference's RoPE table ends there)");
  }
  K3_RETURN_IF_ERROR(w.Validate(d));
  if (patches == nullptr || out_rows == nullptr) {
    return Status::Invalid("vision tower: null patches or output rows");
  }
  const int threads = ResolveThreads(0);
  const int64_t n = int64_t{gh} * gw, H = d.hidden;
  const Layout L = MakeLayout(d, n, threads);
  if (scratch != nullptr && scratch_bytes < 4 * L.total) {
    return Status::Invalid("vision tower: scratch of " + std::to_string(scratch_bytes) +
                           " bytes, " + std::to_string(4 * L.total) + " needed for a " +
                           std::to_string(gh) + "x" + std::to_string(gw) + " grid at " +
                           std::to_string(threads) + " threads (rule: VisionScratchBytes)");
  }
  std::unique_ptr<float, AlignedDelete> owned;
  float* base = static_cast<float*>(scratch);
  if (base == nullptr) {
    owned.reset(static_cast<float*>(::operator new(static_cast<size_t>(L.total) * sizeof(float),
                                                   std::align_val_t{64}, std::nothrow)));
    if (owned == nullptr) {
      return Status::Io("vision tower: cannot allocate " + std::to_string(4 * L.total) +
                        " bytes of working memory for a " + std::to_string(gh) + "x" +
                        std::to_string(gw) + " grid (VisionScratchBytes)");
    }
    base = owned.get();
  }
  float* x = base + L.x;
  float* a = base + L.a;
  float* b = base + L.b;

  // Patch embedding: x = Wpe·patch (the Conv2d with kernel = stride = patch), + pos-emb.
  MatMulRows(w.patch_proj, patches, n, x);
  AddPosEmb(d, w.pos_emb, gh, gw, x, threads);

  // Encoder.
  const internal::RopeTables rope = internal::BuildRope(d, gh, gw);
  for (int64_t l = 0; l < d.layers; ++l) {
    Block(d, w.blocks[static_cast<size_t>(l)], rope, gw, n, L, base, threads);
  }
  NormRows(x, w.final_norm, n, H, d.norm_eps, x, threads);

  // sd2 merge (t = 1: the temporal mean is the identity) and the projector. Merged row
  // g = R·(gw/2) + C concatenates the 2×2 patches (2R, 2C), (2R, 2C+1), (2R+1, 2C), (2R+1, 2C+1)
  // (the reference's view(t, gh/2, 2, gw/2, 2, d).permute(0, 1, 3, 2, 4, 5)).
  const int64_t mw = gw / 2, groups = n / 4, M = d.merged(), T = d.text_hidden;
  for (int64_t g0 = 0; g0 < groups; g0 += kStepRows) {
    const int64_t rows = std::min(kStepRows, groups - g0);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t g = g0 + i, R = g / mw, C = g % mw;
      for (int64_t s = 0; s < 4; ++s) {
        const int64_t p = (2 * R + s / 2) * gw + 2 * C + s % 2;
        std::memcpy(a + i * M + s * H, x + p * H, static_cast<size_t>(H) * 4);
      }
    }
    MatMulRows(w.proj0, a, rows, b);
    ParallelRows(threads, rows, 4, [&](int64_t r0, int64_t r1) {
      GeluErf(b + r0 * M, (r1 - r0) * M);
    });
    float* out = out_rows + g0 * T;
    MatMulRows(w.proj2, b, rows, out);
    NormRows(out, w.post_norm, rows, T, d.projector_eps, out, threads);
  }
  return Status::Ok();
}

}  // namespace k3::vision
