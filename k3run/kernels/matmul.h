// Weight × activation kernels: y = W·x for BF16, MXFP4 and F32 weights and fp32 activations,
// for one activation row (MatVec) or T rows that share one pass over the weights (MatMul).
//
// Goals: the numerics contract of DESIGN.md §7, bit for bit, on every path; one ISA-free API
// with ONE runtime dispatch point (scalar reference, AVX2+FMA, AVX-512F/BW); MXFP4 multiplied
// straight from nibbles + E8M0 scales, never dequantised to memory; rows split over threads.
// Non-goals: knowing about layers, files or tensor names (the caller validates shapes with
// ValidateMatrix and names the tensor); other activation dtypes; bf16 dot-product instructions
// (vdpbf16ps rounds differently, so it cannot meet the contract).
//
// Numerics contract (every path, every thread count, every T; see DESIGN.md §7):
//   For each output element y[t][r], 16 fp32 lanes a_0..a_15 start at +0.0f. For i = 0, 1, ...,
//   cols−1 in ascending order: a_{i mod 16} = fmaf(w_i, x_i, a_{i mod 16}) (one rounding).
//   When cols is not a multiple of 16, the missing elements past cols do not exist: their lanes
//   are left untouched (no padding value is ever added, so a −0.0 lane stays −0.0).
//   Reduction tree, fixed: for l < 8: a_l = a_l + a_{l+8}; then l < 4: a_l = a_l + a_{l+4};
//   then l < 2: a_l = a_l + a_{l+2}; then a_0 = a_0 + a_1. y[t][r] = a_0 (fp32).
//   Row t of MatMul(w, x, T, y) is therefore bit-identical to MatVec of that row alone.
// Weight values w_i:
//   F32: the float. BF16: the bf16 widened (exact, Bf16ToF32).
//   MXFP4: element i of row r is nibble (packed[r][i/2] >> (4·(i&1))) & 15 — the LOW nibble is
//   the EVEN element — and w_i = E2M1[nibble] · 2^(scale[r][i/32] − 127) as an fp32 value.
//   E2M1 magnitudes have at most two significant bits (0.5, 1, 1.5, 2, 3, 4, 6) and the smallest
//   scale is 2^−127, so every product's lowest set bit is ≥ 2^−128 > 2^−149: the fp32 value is
//   exact, subnormals included, except that |value| ≥ 2^128 (scale bytes 253 and 254 with the
//   larger codes) overflows to ±inf. Code 8 is −0.0. Scale byte 255 (NaN in the OCP spec) means
//   a zero scale: w_i = E2M1[nibble]·0 = ±0.0 (sign of the code), so the group contributes
//   exact zeros for finite x. DECISION: the zero weights are still multiplied, not skipped, so
//   an inf or NaN activation in a 255 group gives NaN — the same as a dense dot product over
//   the dequantised matrix (the PyTorch reference), and one rule for all paths.
// NaN: a NaN input gives a NaN output on every path; which NaN payload survives is not part
//   of the contract (x86 keeps the first operand's payload and compilers may commute a + b).
//
// Threads: MatMul cuts output rows into chunks of whole 16-row blocks that up to Threads()
// threads claim (thread_pool.h); each output element is computed by one thread in the order
// above, so neither the thread count nor scheduling changes a bit. MatMul may be called from one
// thread at a time.
// SetIsa/SetThreads are process-wide; call them before MatMul, not concurrently with it.
#pragma once

#include <bit>
#include <cstdint>
#include <string_view>

#include "common/status.h"
#include "common/sysinfo.h"

namespace k3::kernels {

enum class WeightType : uint8_t { kF32, kBF16, kMXFP4 };

// A [rows][cols] weight, row-major, y = W·x. Does not own its bytes.
struct Matrix {
  WeightType type;
  int64_t rows = 0, cols = 0;
  const void* data = nullptr;       // F32: float[rows][cols]; BF16: uint16_t[rows][cols];
                                    // MXFP4: uint8_t packed[rows][cols/2] (low nibble = even)
  const uint8_t* scales = nullptr;  // MXFP4 only: E8M0 [rows][cols/32]; byte 255 → zeros
};

// The MXFP4 group: one E8M0 scale per 32 consecutive elements of a row.
inline constexpr int64_t kMxfp4GroupSize = 32;

// Checks what MatMul requires of a Matrix (non-negative shape, data present, MXFP4 cols a
// multiple of 32 and scales present). `what` names the tensor in the message. MatMul itself
// treats a matrix failing these rules as a bug in the caller (message on stderr, abort).
Status ValidateMatrix(const Matrix& w, std::string_view what);

// Number of weight bytes one pass over `w` reads (packed + scales for MXFP4).
int64_t WeightBytes(const Matrix& w);

// ---- instruction set dispatch ----
enum class Isa : uint8_t { kScalar, kAvx2, kAvx512 };

// The path MatMul uses. Chosen once on first use: K3_ISA if set and valid, else the best the
// CPU supports. An invalid or unsupported K3_ISA value is NOT fatal inside the library: it
// logs a warning naming the value and the path used instead. Tools that want a hard failure
// (k3run: exit 2) call IsaFromEnvironment() at start-up and stop on its Status.
Isa ActiveIsa();
const char* IsaName(Isa isa);  // "scalar", "avx2", "avx512"
// kAvx2 needs AVX2+FMA; kAvx512 needs AVX-512F+BW (with OS register support). kScalar: always.
bool IsaSupported(Isa isa);
bool IsaSupportedBy(Isa isa, const CpuFeatures& cpu);
Isa BestSupportedIsa();
// For tests and benchmarks. Setting a path the CPU lacks is a bug (message, abort): check
// IsaSupported first.
void SetIsa(Isa isa);

// Resolves a K3_ISA value for a CPU: "" → the best `cpu` supports; "scalar" | "avx2" |
// "avx512" → that path if `cpu` supports it. Anything else, or an unsupported path, is
// kInvalid naming K3_ISA, the value, the accepted values and the paths this CPU supports.
Result<Isa> ResolveIsaRequest(std::string_view value, const CpuFeatures& cpu);
// ResolveIsaRequest(getenv("K3_ISA") or "", DetectCpu()).
Result<Isa> IsaFromEnvironment();

// ---- threads ----
// Default: omp_get_max_threads() (honours OMP_NUM_THREADS). n < 1 is treated as 1.
// kMaxThreads bounds --threads: past a few per core more threads only add switches, and a
// typo such as 1000000 would otherwise die in pthread_create with EAGAIN.
inline constexpr int kMaxThreads = 1024;
void SetThreads(int n);
int Threads();

// ---- the kernels ----
// y[t][r] = Σ_c W[r][c]·x[t][c] for t < T, in the order of the contract above.
// x: [T][cols] fp32, y: [T][rows] fp32; y must not overlap x or the weights. The weights are
// read once per call for all T rows (prefill, speculative verification).
void MatMul(const Matrix& w, const float* x, int64_t T, float* y);
inline void MatVec(const Matrix& w, const float* x, float* y) { MatMul(w, x, 1, y); }
// MatMul on the calling thread only, same bits: for callers that spread many small independent
// products over the compute threads themselves (the routed experts of a MoE layer, whose
// matrices are too small for a fork/join each). Safe to call from inside ParallelChunks.
void MatMulOnThisThread(const Matrix& w, const float* x, int64_t T, float* y);

// ---- bf16 ----
// Widening is exact: the bf16 bits are the high half of the fp32.
inline float Bf16ToF32(uint16_t b) { return std::bit_cast<float>(uint32_t{b} << 16); }
// Round to nearest, ties to even; overflow rounds to ±inf; NaN stays NaN (quietened, sign and
// top payload bits kept) instead of rounding into inf.
inline uint16_t F32ToBf16RoundNearestEven(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

}  // namespace k3::kernels
