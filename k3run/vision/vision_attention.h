// Internals of the vision tower (vision_tower.cpp): the 2-D RoPE tables, the q/k/v scatter and
// the tiled (flash-style) bidirectional attention of one image. Not for use outside k3run/vision
// and its tests.
//
// The tower runs attention ONE HEAD AT A TIME (vision_tower.cpp), so only one head's q, k, v
// are held. Layouts for an image of n patches, head h of dimension d, Q = heads·d:
//   q   [n][d]        this head's queries, RoPE applied
//   kt  [tiles][d][len]  this head's keys transposed per key tile (len = kKeyTile, the last tile
//                     n mod kKeyTile), RoPE applied: 16 or 32 consecutive keys of one dimension
//                     are one vector load
//   v   [n][d]        this head's values
//   o   [n][Q]        the attention output of all heads, head h at columns h·d (what wo reads)
//
// Numerics, per query row, for key tiles t = 0, 1, ... in order (len keys each):
//   s_k   = fp32(Σ_j q_j·k_kj) · scale: the sum a chain of fmaf over j ascending from +0
//           (scale = fp32(1/sqrt(d)), applied after, never folded into q)
//   m'    = max(m, max_k s_k);  α = Exp(m − m') (first tile: no α)
//   p_k   = Exp(s_k − m')       (ops::Exp, fp32)
//   l     = l·α + Σ_k p_k       (double; Σ in 8 partial sums by k mod 8, fixed combining tree)
//   acc_c = fmaf-chain over k ascending of p_k·v_kc, starting from fp32(acc_c·α) (0 on the first
//           tile)
//   o_c   = fp32(acc_c / l)
// Every element is one fmaf chain in a fixed order on every ISA path (the SIMD bodies keep one
// element per lane and never add lanes together), so the bits depend on kKeyTile only; no thread
// ever splits a row's sums.
#pragma once

#include <cstdint>
#include <vector>

#include "k3run/vision/vision_tower.h"

namespace k3::vision::internal {

// cos/sin of the 2-D RoPE angles for one grid, each rounded once from double:
// col[c][i] = cis(c·f_i), row[r][i] = cis(r·f_i), f_i = theta^(−4i/d), i < d/4.
struct RopeTables {
  int64_t quarter = 0;  // d/4
  std::vector<float> col_cos, col_sin;  // [gw][d/4]
  std::vector<float> row_cos, row_sin;  // [gh][d/4]
};
RopeTables BuildRope(const VisionDims& dims, int64_t gh, int64_t gw);

// Writes rows [p0, p0 + rows) of one head's q, k and v (each [rows][d], the wqkv row slices'
// MatMul outputs) into q, kt and v (layouts above), rotating q and k: complex pair t = (2t, 2t+1)
// is multiplied by cis(col·f_{t/2}) for even t and cis(row·f_{t/2}) for odd t,
// (a, b) → (a·cos − b·sin, a·sin + b·cos) in fp32.
void ScatterHead(const VisionDims& dims, const RopeTables& rope, int64_t gw, int64_t n,
                 const float* qs, const float* ks, const float* vs, int64_t p0, int64_t rows,
                 float* q, float* kt, float* v);

// Per-thread working floats of AttendHead (one slot per compute thread).
int64_t AttentionSlotFloats(const VisionDims& dims);

// Bidirectional attention of one head over all n patches: o[p][0, d) for every p (o points at the
// head's first column; rows o_stride floats apart). Query blocks of kQueryBlock are spread over
// `threads` threads, each block computed whole by one. slots: threads × AttentionSlotFloats.
void AttendHead(const VisionDims& dims, int64_t n, const float* q, const float* kt,
                const float* v, float* o, int64_t o_stride, float* slots, int threads);

}  // namespace k3::vision::internal
