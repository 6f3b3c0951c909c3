// Gated MLA attention over a LATENT cache (MODEL.md §3.5 in the absorbed form of DESIGN.md §11.2;
// NoPE, no rotary embedding anywhere). This is the only MLA path.
//
// With n = qk_nope, r = qk_rope, v = v_head, c = kv_lora and the per-head stride n + v of
// kv_b_proj, the cache holds per position the NORMALISED latent (c floats) ‖ the shared,
// un-normalised, un-rotated rope key (r floats): c + r floats instead of the expanded
// H·(n + v) + r, which is what lets long contexts fit a small budget.
//
// Evaluation order (part of the numerics contract, DESIGN.md §7 and §11.2):
//   1. q = q_b(RMSNorm_latent_eps(q_a(x))), [T][H][n + r] (nope ‖ rope per head);
//      c_kv = kv_a(x); latent = RMSNorm_latent_eps(c_kv[0, c)); k_rope = c_kv[c, c + r).
//   2. W_UK[h] = rows h·(n+v) + [0, n) of kv_b_proj, an [n][c] slice; q̃_h = W_UK[h]ᵀ·q_nope_h
//      under the MatMul contract (16 fp32 lanes over i < n, fixed tree), computed by reading the
//      slice by columns (kernels/transposed.h): no transposed copy, no cache of one.
//   3. score_s = fp32(Σ_{j<c} q̃_h[j]·latent_s[j] + Σ_{i<r} q_h[n+i]·k_rope_s[i]): ONE double
//      accumulator, latent terms then rope terms, each ascending; then · scale in fp32 with
//      scale = 1/sqrtf(n + r), never folded into q̃. Causal: s ≤ the row's position.
//   4. Softmax (below): fp32 max, fp32 expf, double sum, p = fp32(e/Z).
//   5. ō_h[j] = Σ_s p_s·latent_s[j] in fp32, s ascending (a product, then a sum: no fma).
//   6. o_h = W_UV[h]·ō_h under the MatMul contract, W_UV[h] = rows h·(n+v) + n + [0, v).
//   7. o ⊙ σ(g_proj x) (the gate sits between W_UV and o_proj, so W_UV is not folded), o_proj.
// Every output element is computed by one thread in this order, so threads, ISA paths, chunk
// sizes (T rows in one call equal T one-row calls) and budgets never change a bit. Forbidden
// here (DESIGN.md §11.2a): online or tiled softmax, score sums split in pieces.
// Scratch: MlaRows holds the pass's [T] rows of projections; MlaAttend adds, per compute thread
// (not per row), the scores of one unit of at most kMlaUnitQueries queries: that many × the
// longest sequence's len floats, and that many × kMlaKeyBlock doubles.
// The score sums run in kernels/router_dot.h (same contract: one double accumulator per
// position, ascending index; SIMD across positions), a unit's queries (a block of rows × a group
// of heads) together so that they share each read of the cache; step 5 vectorised across j, the
// group's heads per cache row.
// The latent norms use Dims::mla_latent_eps (1e-6 upstream; 1e-5 reproduces the original
// engine's fixtures). Thread safety: none; one cache per sequence and layer.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/reserved_floats.h"
#include "common/status.h"
#include "k3run/ops/weights.h"

namespace k3::ops {

// The buffer is reserved for `capacity` positions but grows with the context: its pages are
// committed as positions are written (common/reserved_floats.h), so a sequence costs
// len × (c + r) × 4 bytes of RAM (rounded up to a page), not capacity × …; the memory plan
// still checks the full reservation, so a sequence can always grow to its capacity.
struct MlaCache {
  int64_t capacity = 0;  // positions the buffer holds
  int64_t len = 0;       // positions written (the next token's position)
  int64_t latent = 0;    // c = kv_lora
  int64_t width = 0;     // c + r floats per position
  ReservedFloats data;   // [capacity][c + r]: latent ‖ k_rope; rows past len read as zeros

  static MlaCache Make(const Dims& d, int64_t capacity);
  const float* row(int64_t pos) const { return data.data() + pos * width; }
  float* row(int64_t pos) { return data.data() + pos * width; }
};

// Floats per cached position: kv_lora + qk_rope (576 for the released model).
inline int64_t MlaCacheWidth(const Dims& d) { return d.kv_lora + d.qk_rope; }

// Queries (a sequence's consecutive rows × heads) whose steps 3–5 run together over one read of
// the cache, at most: groups of up to this many heads (fewer when a pass has fewer rows than
// compute threads), and when the heads are fewer, blocks of as many rows as fit. The memory
// plan counts one unit's scores per thread. Timed with a driver of MlaAttend alone (not
// k3_bench_mla) at the released dims (96 heads), 32,768 positions, two threads, units of one
// row's heads: 16 heads 60 ms, 32 66-68 (three units on two threads), 48 47-48; the router
// kernel's panels are built once per unit.
inline constexpr int64_t kMlaUnitQueries = 48;
// Cache positions a unit's queries are summed over together (a block of 128 × 576 floats, 295 KB
// at the released dims, stays in L2 while the unit's queries read it).
inline constexpr int64_t kMlaKeyBlock = 128;

// The layer in three phases, so that the rows of several sequences in one pass share every
// weight read: MlaProject (steps 1–2 for every row of the pass) → MlaAttend (the cache rows and
// steps 3–5 for one sequence's rows, with its cache) → MlaOutput (steps 6–7, every row). Steps
// 1–2 and 6–7 work row by row, so grouping rows never changes a bit.
struct MlaRows {
  int64_t T = 0;
  std::vector<float> q;     // [T][H][n + r]  step 1
  std::vector<float> ckv;   // [T][c + r]     kv_a's output, before the latent norm
  std::vector<float> qt;    // [H][T][c]      q̃, step 2
  std::vector<float> obar;  // [H][T][c]      ō, steps 3–5
};

// Steps 1 (projections) and 2 for x [T][E] (the input-layernormed rows). Fails (kInvalid) on an
// MXFP4 kv_b_proj, which the absorbed form cannot read by columns.
Status MlaProject(const MlaWeights& w, const Dims& d, const float* x, int64_t T, MlaRows* r);

// Rows [first, first + n) of r, one sequence's, in order: their normalised latents and rope keys
// join the cache at positions cache->len …, then steps 3–5 for them. Fails (kInvalid, cache
// untouched) if the cache cannot hold n more positions.
Status MlaAttend(const MlaWeights& w, const Dims& d, int64_t first, int64_t n, MlaCache* cache,
                 MlaRows* r);

// One sequence's rows of a pass for MlaAttendMany: MlaAttend's first, n and cache.
struct MlaSegment {
  int64_t first = 0, n = 0;
  MlaCache* cache = nullptr;
};

// MlaAttend for several sequences' disjoint rows, with one fork/join for all of them: the same
// bits as one MlaAttend per segment. Fails (kInvalid, every cache untouched) if any cache cannot
// hold its rows.
Status MlaAttendMany(const MlaWeights& w, const Dims& d, std::span<const MlaSegment> segments,
                     MlaRows* r);

// Steps 6–7 for every row: out [T][E]; x is the same input MlaProject had (the gate reads it).
void MlaOutput(const MlaWeights& w, const Dims& d, const float* x, const MlaRows& r, float* out);

// The three phases for one sequence: x [T][E] (the input-layernormed rows), out [T][E];
// positions cache->len … len+T−1. Fails (kInvalid, cache untouched) if the cache cannot hold T
// more positions.
Status MlaLayer(const MlaWeights& w, const Dims& d, const float* x, int64_t T, MlaCache* cache,
                float* out);

// The softmax recipe shared by MLA and AttnRes: m = fp32 max, e = expf(score − m) (fp32),
// Z = Σ e in double (ascending), p = fp32(e/Z). p may alias score.
void Softmax(const float* score, int64_t n, float* p);

}  // namespace k3::ops
