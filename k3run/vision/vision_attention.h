// Internals of the vision tower (vision_tower.cpp): the 2-D RoPE tables, the q/k/v scatter and
// the tiled (flash-style) bidirectional attention of one image. Not for use outside k3run/vision
// and its tests.
//
// Layouts for an image of n patches, H heads of d = head_dim, Q = H·d:
//   q   [n][Q]        token-major, head h at columns h·d (RoPE applied); the attention output
//                     overwrites it in place (each (head, query block) item reads and writes only
//                     its own rows of its own head's columns)
//   kt  [H][tiles][d][len]  K transposed per key tile (len = kKeyTile, the last tile n mod
//                     kKeyTile), RoPE applied: 16 or 32 consecutive keys of one dimension are one
//                     vector load
//   v   [H][n][d]     head-major rows
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

// Writes rows [p0, p0 + rows) of one layer's wqkv output ([rows][3Q], q|k|v) into q, kt and v
// (layouts above), rotating q and k: complex pair t = (2t, 2t+1) of each head is multiplied by
// cis(col·f_{t/2}) for even t and cis(row·f_{t/2}) for odd t, (a, b) → (a·cos − b·sin,
// a·sin + b·cos) in fp32.
void ScatterQkv(const VisionDims& dims, const RopeTables& rope, int64_t gw, int64_t n,
                const float* qkv, int64_t p0, int64_t rows, float* q, float* kt, float* v);

// Per-thread working floats of Attend (one slot per compute thread).
int64_t AttentionSlotFloats(const VisionDims& dims);

// Bidirectional attention over all n patches for every head, output over q (see above).
// slots: `threads` × AttentionSlotFloats(dims) floats.
void Attend(const VisionDims& dims, int64_t n, float* q, const float* kt, const float* v,
            float* slots, int threads);

}  // namespace k3::vision::internal
