// The AVX-512F/BW path. One zmm holds the 16 lanes of one output element, so lane l of the
// register is lane l of the contract in matmul.h; each fmadd is the scalar fmaf per lane.
// Compiled with -mavx512f -mavx512bw (see CMakeLists.txt): everything here is internal linkage
// and calls nothing inline from a header (kernels_internal.h explains why).
#include <immintrin.h>

#include <cstdint>

#include "k3run/kernels/kernels_internal.h"

// GCC 12's AVX-512 intrinsics build their "don't care" operands as `__m512 __Y = __Y;`
// (_mm512_undefined_*), which -Wuninitialized reports at every expansion site in this file.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace k3::kernels::internal {
namespace {

// Loaders of the rows Tile multiplies, in contract lane order: Load gives the fp32 weights of
// row r, columns [c, c + 16) (c a multiple of 16); LoadTail the first lanes of `k` of 16 at the
// ragged end of a row (zeros elsewhere). MXFP4 has its own tile (Mxfp4Tile, below).
struct F32Rows {
  static constexpr int kStepBytes = 64;  // bytes of a row one Load reads
  // Where Tile's prefetch of the next tile lands: L2 for the streamed bf16/f32 rows (27.7 ->
  // 31.3 GB/s at 768 columns), L1 for MXFP4, whose decode leaves time to spare (21.4 vs 19.1).
  static constexpr _mm_hint kPrefetchHint = _MM_HINT_T1;
  const float* base;
  int64_t cols;
  __m512 Load(int64_t r, int64_t c) const { return _mm512_loadu_ps(base + r * cols + c); }
  const void* RowStart(int64_t r) const { return base + r * cols; }
  int64_t row_bytes() const { return cols * 4; }
  void PrefetchSide(int64_t, int64_t) const {}
  __m512 LoadTail(int64_t r, int64_t c, __mmask16 k) const {
    return _mm512_maskz_loadu_ps(k, base + r * cols + c);
  }
};

struct Bf16Rows {
  static constexpr int kStepBytes = 32;
  static constexpr _mm_hint kPrefetchHint = _MM_HINT_T1;
  const uint16_t* base;
  int64_t cols;
  static __m512 Widen(__m256i h) {  // bf16 bits become the high half of each fp32: exact
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  __m512 Load(int64_t r, int64_t c) const {
    return Widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + r * cols + c)));
  }
  const void* RowStart(int64_t r) const { return base + r * cols; }
  int64_t row_bytes() const { return cols * 2; }
  void PrefetchSide(int64_t, int64_t) const {}
  __m512 LoadTail(int64_t r, int64_t c, __mmask16 k) const {
    // Masked lanes are not read, so this never touches memory past the row.
    return Widen(_mm512_castsi512_si256(_mm512_maskz_loadu_epi16(k, base + r * cols + c)));
  }
};

// The MXFP4 rows Mxfp4Tile multiplies (the decode is there).
struct Mxfp4Rows {
  static constexpr int kStepBytes = 16;  // packed bytes of a row per 32-weight step
  static constexpr _mm_hint kPrefetchHint = _MM_HINT_T0;
  const uint8_t* packed;
  const uint8_t* scales;
  int64_t cols;
  const Mxfp4LutRow* lut;
  const void* RowStart(int64_t r) const { return packed + r * (cols / 2); }
  int64_t row_bytes() const { return cols / 2; }
  // The scales of rows [r, r + n): a few lines, fetched once per tile.
  void PrefetchSide(int64_t r, int64_t n) const {
    const char* p = reinterpret_cast<const char*>(scales + r * (cols / kMxfp4GroupSize));
    for (int64_t b = 0; b < n * (cols / kMxfp4GroupSize); b += 64) {
      _mm_prefetch(p + b, _MM_HINT_T0);
    }
  }
};

// The fixed tree of matmul.h for up to 16 accumulators at once, in four levels of "pair two
// vectors, add": level k gathers the lower operands of the tree's step k from two vectors into
// one and the upper into another, so one add makes that step for both (half the adds and
// shuffles of reducing each accumulator alone, whose upper lanes idle). Each add is the
// scalar's a_l + a_{l+w} (lower contract index first), so the bits are the tree's. The loads of
// a permuted loader (lane 2j: element j, lane 2j+1: element 8+j) already pair the first step's
// operands in neighbouring lanes, so they need no permute back to contract order: the two
// layouts differ in the shuffles of levels 1-3. Slot s of `in` ends in lane LaneOfSlot(s) of
// the result; callers place accumulator j in the slot whose lane is j. Why: the bench preset's
// experts have rows of 256 columns, and one accumulator's reduction and permute back cost
// about as much as a quarter of its FMAs (MXFP4 512×256 at T = 4 ran 45 % slower than
// 32×4096).
template <bool kPermuted>
struct SixteenSums {
  // The lane of Reduce's result that holds slot s's sum.
  static constexpr int LaneOfSlot(int s) {
    constexpr int kContract[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
    constexpr int kLoaderOrder[16] = {0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15};
    return kPermuted ? kLoaderOrder[s] : kContract[s];
  }
  // Level 1 (a_l + a_{l+8}), level 2 (+4), level 3 (+2), level 4 (+1). Each pairs either the
  // 128-bit blocks or the lanes within them (kBlocks), taking either the first and second
  // halves of each four (1,0,1,0 / 3,2,3,2) or its even and odd members (2,0,2,0 / 3,1,3,1).
  template <int kLevel>
  static __m512 Step(__m512 a, __m512 b) {
    constexpr bool kBlocks = kPermuted ? (kLevel == 2 || kLevel == 3) : kLevel <= 2;
    constexpr bool kEvens = kPermuted ? kLevel != 2 : kLevel % 2 == 0;
    constexpr int kLo = kEvens ? _MM_SHUFFLE(2, 0, 2, 0) : _MM_SHUFFLE(1, 0, 1, 0);
    constexpr int kHi = kEvens ? _MM_SHUFFLE(3, 1, 3, 1) : _MM_SHUFFLE(3, 2, 3, 2);
    if constexpr (kBlocks) {
      return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, kLo), _mm512_shuffle_f32x4(a, b, kHi));
    } else {
      return _mm512_add_ps(_mm512_shuffle_ps(a, b, kLo), _mm512_shuffle_ps(a, b, kHi));
    }
  }
  static __m512 Reduce(const __m512 (&in)[16]) {
    __m512 v[8], w[4], x[2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) v[i] = Step<1>(in[2 * i], in[2 * i + 1]);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) w[i] = Step<2>(v[2 * i], v[2 * i + 1]);
    x[0] = Step<3>(w[0], w[1]);
    x[1] = Step<3>(w[2], w[3]);
    return Step<4>(x[0], x[1]);
  }
};

// Stores the RB×TB sums of a tile: y[(t0 + t)·rows + r0 + r] = acc[r][t] reduced, 16 at a time
// (accumulator j = t·RB + r; unused slots hold zeros, whose sums are dropped).
template <bool kPermuted, int RB, int TB>
void StoreSums(const __m512 (&acc)[RB][TB], int64_t rows, float* y, int64_t r0, int64_t t0) {
  using S = SixteenSums<kPermuted>;
  constexpr int kN = RB * TB;
#pragma GCC unroll 2
  for (int g = 0; g < kN; g += 16) {
    __m512 in[16];
#pragma GCC unroll 16
    for (int s = 0; s < 16; ++s) {
      const int j = g + S::LaneOfSlot(s);
      in[s] = j < kN ? acc[j % RB][j / RB] : _mm512_setzero_ps();
    }
    alignas(64) float sums[16];
    _mm512_store_ps(sums, S::Reduce(in));
#pragma GCC unroll 16
    for (int l = 0; l < 16; ++l) {
      const int j = g + l;
      if (j < kN) y[(t0 + j / RB) * rows + r0 + j % RB] = sums[l];
    }
  }
}

// The lane order of Mxfp4Tile's decode: lane p holds element Mxfp4Order()[p] of a 16-block.
__m512i Mxfp4Order() {
  return _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
}

// Where a tile of RB rows at r0 starts prefetching the block `ahead` blocks on (Tile explains
// the scheme): that block's first row, its scales fetched now; or, when there is no such block
// or it exceeds kMaxPrefetchBytes (kernels_internal.h, which the callers that pick prefetching
// tiles test too), the tile's own first row, so the loop needs no branch.
template <class L>
const char* PrefetchStart(const L& w, int64_t rows, int64_t r0, int64_t rb, int64_t ahead) {
  if (rows - r0 >= (ahead + 1) * rb && rb * w.row_bytes() <= kMaxPrefetchBytes) {
    w.PrefetchSide(r0 + ahead * rb, rb);
    return static_cast<const char*>(w.RowStart(r0 + ahead * rb));
  }
  return static_cast<const char*>(w.RowStart(r0));
}

// Rows [r, r + n) of w and their scales, all at once.
void PrefetchRows(const Mxfp4Rows& w, int64_t r, int64_t n) {
  const char* p = static_cast<const char*>(w.RowStart(r));
  for (int64_t b = 0; b < n * w.row_bytes(); b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
  w.PrefetchSide(r, n);
}

// One step of that prefetch: 4 lines from pf, which then advances the `stride` bytes a step
// consumes of the tile's rows (the lines past it run ahead).
template <class L>
void PrefetchStep(const char*& pf, int64_t stride) {
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) _mm_prefetch(pf + 64 * i, L::kPrefetchHint);
  pf += stride;
}

// RB weight rows × TB activation rows, each (row, t) pair one zmm accumulator; the weights of a
// 16-column block are loaded once and used for all TB activations.
template <class L, int RB, int TB, int kAhead>
void Tile(const L& w, int64_t rows, int64_t cols, const float* x, float* y, int64_t r0,
          int64_t t0) {
  __m512 acc[RB][TB];
  const float* xt[TB];
#pragma GCC unroll 16
  for (int t = 0; t < TB; ++t) xt[t] = x + (t0 + t) * cols;
#pragma GCC unroll 16
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 16
    for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  // acc stays in registers only while it is indexed by constants and its address is never
  // taken: the ragged end's loops are unrolled, and StoreSums gets a copy (`done`, below).
  // Before, a tile that prefetched stored all its accumulators to the stack at every step
  // (GCC's store motion gave up on the addressable array): the first tile of 4 activations ran
  // at 0.4× the speed of the others in cache, and the tiles of 1 activation (every matvec)
  // stored 8 a step.
  //
  // kAhead = -1: rows too long for that (their next block would evict x from L1) are
  // prefetched in place, kInRowAheadBytes ahead in each of the RB rows. The hardware alone kept
  // the first tile of a block of 7168-column bf16 rows at about half the read: k3_bench_roofline,
  // released shapes, alternating runs, one / two threads, GB/s: T = 4 11.1-12.7 -> 13.6-17.0 /
  // 21.5-24.6 -> 29.4-32.4, T = 2 13.1-16.3 -> 17.4-22.4 / 25.0-29.6 -> 28.4-38.5, T = 1
  // 16.2-19.5 -> 16.4-20.9 / 30.4-35.8 -> 32.1-42.0.
  //
  // Prefetch of the weight rows kAhead row blocks on (0: none), by the tiles RowBlock picks
  // (the weights stream from memory) and for short rows: the next tile's rows
  // follow this tile's contiguously, but rows of a few KB end before
  // the hardware prefetcher ramps up on each of the RB interleaved streams (bf16 with 768
  // columns ran at 2/3 of the rate of 7168). Longer rows are left to the hardware, and the
  // prefetched bytes stay small enough not to evict x from L1. A hint: no bits change. With
  // several activations too: bf16 3584×768 at T = 2 streamed at half the rate of T = 1 without.
  //
  // Each step reads kStepBytes of each of the RB rows; the next RB rows follow these
  // contiguously, so a pointer advancing RB·kStepBytes bytes a step has them in by the tile's end.
  // Each step prefetches 4 lines from it, the lines past the stride running ahead (avx2, bf16
  // with 768 columns from DRAM at T = 2: 19-21 µs a call with them, 25-26 without; f32 at
  // RB = 8 is half prefetched). The pointer walks this tile's own rows when there is nothing
  // to fetch (the last block, long rows): hints for lines read anyway, and no branch in the
  // loop.
  const char* pf = nullptr;
  if constexpr (kAhead > 0) pf = PrefetchStart(w, rows, r0, RB, kAhead);
  int64_t c = 0;
  for (; c + 16 <= cols; c += 16) {
    __m512 xv[TB];
    if constexpr (kAhead > 0) PrefetchStep<L>(pf, RB * L::kStepBytes);
    if constexpr (kAhead < 0) {
#pragma GCC unroll 16
      for (int r = 0; r < RB; ++r) {
        _mm_prefetch(static_cast<const char*>(w.RowStart(r0 + r)) + c / 16 * L::kStepBytes +
                         kInRowAheadBytes,
                     L::kPrefetchHint);
      }
    }
#pragma GCC unroll 16
    for (int t = 0; t < TB; ++t) xv[t] = _mm512_loadu_ps(xt[t] + c);
#pragma GCC unroll 16
    for (int r = 0; r < RB; ++r) {
      const __m512 wv = w.Load(r0 + r, c);
#pragma GCC unroll 16
      for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
  // The ragged end: lanes past cols keep their value (mask3 leaves them).
  if (c < cols) {
    const __mmask16 k = static_cast<__mmask16>((1u << (cols - c)) - 1u);
    __m512 xv[TB];
#pragma GCC unroll 16
    for (int t = 0; t < TB; ++t) xv[t] = _mm512_maskz_loadu_ps(k, xt[t] + c);
#pragma GCC unroll 16
    for (int r = 0; r < RB; ++r) {
      const __m512 wv = w.LoadTail(r0 + r, c, k);
#pragma GCC unroll 16
      for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_mask3_fmadd_ps(wv, xv[t], acc[r][t], k);
    }
  }
  __m512 done[RB][TB];  // see acc above: passing acc itself by reference kept it in memory
#pragma GCC unroll 16
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 16
    for (int t = 0; t < TB; ++t) done[r][t] = acc[r][t];
  }
  StoreSums<false, RB, TB>(done, rows, y, r0, t0);
}

// Row k (0..4) of rows `stride` bytes apart from `base`, with stride3 = 3·stride: with k a
// constant, one addressing mode ([base + stride·1/2/4] or [base + stride3]), no pointer of
// its own.
const uint8_t* RowAt(const uint8_t* base, int k, int64_t stride, int64_t stride3) {
  return k == 3 ? base + stride3 : base + k * stride;
}

// One row's step of Mxfp4Tile: its 32 weights at p (scale byte `scale`) into acc[t] for every
// activation, elements 0..15 then 16..31, as the contract orders them.
// Inlined, so acc stays in registers (see Tile's acc).
template <int TB>
[[gnu::always_inline]] inline void DecodeAndMultiply(const uint8_t* p, uint8_t scale,
                                                     const Mxfp4LutRow* lut, __m512i shift,
                                                     const __m512 (&xv)[2][TB],
                                                     __m512 (&acc)[TB]) {
  const __m512i q0 =
      _mm512_broadcastq_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m512i q1 =
      _mm512_broadcastq_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)));
  const __m512 row = _mm512_load_ps(lut[scale].v);
  const __m512 w0 = _mm512_permutexvar_ps(_mm512_srlv_epi32(q0, shift), row);
  const __m512 w1 = _mm512_permutexvar_ps(_mm512_srlv_epi32(q1, shift), row);
#pragma GCC unroll 16
  for (int t = 0; t < TB; ++t) acc[t] = _mm512_fmadd_ps(w0, xv[0][t], acc[t]);
#pragma GCC unroll 16
  for (int t = 0; t < TB; ++t) acc[t] = _mm512_fmadd_ps(w1, xv[1][t], acc[t]);
}

// RB MXFP4 weight rows (1, 4 or 8) × TB activation rows, by the contract of Tile above, decoding
// a whole scale group (32 elements, 16 bytes) of each row per step with ONE shuffle per 16
// weights (the LUT's permutexvar): each 8-byte half is broadcast to every qword (a load, not a
// shuffle) and a per-lane shift brings one nibble to the low 4 bits of each dword, which is all
// permutexvar reads. That puts the elements of a 16-block in the lane order Mxfp4Order (lane
// 2j: element j, lane 2j+1: element 8+j; j < 8) instead of 0..15; x arrives permuted the same
// way (RowsMxfp4), so each contract lane l still receives w_l·x_l, w_{16+l}·x_{16+l}, ... in
// ascending order, and the reduction (SixteenSums<true>) takes the lanes where they are: the
// bits are the contract's. cols % 32 == 0 (ValidateMatrix), so there is no ragged end.
//
// The rows, their scales and the activations are addressed from one pointer each plus strides
// (RowAt). Written like Tile, GCC gave each row a pointer for its bytes and one for its scales:
// 16 induction variables at RB = 8, more than the general registers, so it kept them in xmm
// registers and moved each to a general one at every use (two more instructions per row and
// step, in a loop bound by instruction issue). The empty asm hides the pointers from that
// rewrite. k3_bench_roofline, avx512, T = 1, three alternating runs: released 3072×3584 20.7-21.7
// -> 23.9-24.1 GB/s on one thread, 40.5-41.4 -> 43.6-45.7 on two; in L2 21.3-21.6 -> 24.2-25.4.
// At T = 2..5 (bench 256×512, one thread, in L2 and from DRAM) calls take 7-15 % less time.
//
// kPrefetchNext: the tile prefetches the block of RB rows `ahead` blocks on (PrefetchStart).
template <int RB, int TB, bool kPrefetchNext>
void Mxfp4Tile(const Mxfp4Rows& w, int64_t rows, int64_t cols, const float* x, float* y,
               int64_t r0, int64_t t0, int64_t ahead = 1) {
  static_assert((RB == 1 || RB == 4 || RB == 8) && TB <= 5);  // RowAt reaches row 4
  const int64_t rb = cols / 2, rb3 = 3 * rb;                       // packed bytes
  const int64_t sb = cols / kMxfp4GroupSize, sb3 = 3 * sb;         // scale bytes
  const int64_t xb = cols * int64_t{sizeof(float)}, xb3 = 3 * xb;  // activation bytes
  const uint8_t* p0 = w.packed + r0 * rb;
  const uint8_t* p4 = p0 + 4 * rb;
  const uint8_t* s0 = w.scales + r0 * sb;
  const uint8_t* s4 = s0 + 4 * sb;
  const uint8_t* const p_end = p0 + rb;
  const uint8_t* x0 = reinterpret_cast<const uint8_t*>(x + t0 * cols);
  // Byte m holds element 2m (low nibble) and 2m+1 (high nibble): element e of a dword sits at
  // bits 4e. Dword lanes of a broadcast qword alternate low (elements 0..7) and high (8..15)
  // halves; lanes 2j and 2j+1 shift by 4j.
  const __m512i shift =
      _mm512_setr_epi32(0, 0, 4, 4, 8, 8, 12, 12, 16, 16, 20, 20, 24, 24, 28, 28);
  const char* pf = nullptr;  // Tile's prefetch of the next block
  if constexpr (kPrefetchNext) pf = PrefetchStart(w, rows, r0, RB, ahead);
  __m512 acc[RB][TB];
#pragma GCC unroll 16
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 16
    for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  for (; p0 < p_end; p0 += 16, p4 += 16, s0 += 1, s4 += 1, x0 += 32 * int64_t{sizeof(float)}) {
    asm("" : "+r"(p0), "+r"(s0));
    if constexpr (RB == 8) asm("" : "+r"(p4), "+r"(s4));
    if constexpr (TB > 1) asm("" : "+r"(x0));
    if constexpr (kPrefetchNext) PrefetchStep<Mxfp4Rows>(pf, RB * Mxfp4Rows::kStepBytes);
    __m512 xv[2][TB];
#pragma GCC unroll 16
    for (int t = 0; t < TB; ++t) {
      const uint8_t* xt = RowAt(x0, t, xb, xb3);
      xv[0][t] = _mm512_load_ps(xt);
      xv[1][t] = _mm512_load_ps(xt + 64);
    }
#pragma GCC unroll 16
    for (int r = 0; r < RB; ++r) {
      const uint8_t* p = RowAt(r < 4 ? p0 : p4, r % 4, rb, rb3);
      const uint8_t scale = *RowAt(r < 4 ? s0 : s4, r % 4, sb, sb3);
      DecodeAndMultiply<TB>(p, scale, w.lut, shift, xv, acc[r]);
    }
  }
  __m512 done[RB][TB];  // see Tile's acc
#pragma GCC unroll 16
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 16
    for (int t = 0; t < TB; ++t) done[r][t] = acc[r][t];
  }
  StoreSums<true, RB, TB>(done, rows, y, r0, t0);
}

// All activation rows for weight rows [r0, r0+RB), in tiles of up to 4 activations.
template <class L, int RB>
void RowBlock(const L& w, int64_t rows, int64_t cols, const float* x, int64_t T, float* y,
              int64_t r0) {
  constexpr int kTB = 4;
  int64_t t = 0;
  // bf16/f32 rows short enough for Tile's prefetch: the first tile prefetches the next rows
  // (bf16 3584×768 at T = 4 streamed at a third of T = 1's rate without), and the second the
  // rows after those: with the first alone, the memory idled while the later tiles of a block
  // multiplied from L1, and the next block came in only during the first tile. A throwaway
  // driver, bf16 3584×768 from DRAM, µs a call, two alternating rounds: T = 12 525-648 ->
  // 455-466 on one thread, 274-365 -> 236-281 on two; T = 16 741-772 -> 635-650 and 431-453 ->
  // 340-400; k3_bench_roofline at T = 8, two threads, 20.0-25.1 -> 27.3-31.5 GB/s. Up to 8
  // activations (a decode pass of 8 sequences) went in pairs until the tiles stopped storing their
  // accumulators at every step (see Tile); since, tiles of 4 are faster (bf16 256×768 from
  // DRAM, one thread, µs a call, pairs -> 4: T = 4 28-32 -> 25-29, T = 8 46-51 -> 37-39).
  const bool short_rows = RB * w.row_bytes() <= kMaxPrefetchBytes;
  if (T >= kTB && short_rows) {
    Tile<L, RB, kTB, 1>(w, rows, cols, x, y, r0, 0);
    t = kTB;
    if (t + kTB <= T) {
      Tile<L, RB, kTB, 2>(w, rows, cols, x, y, r0, t);
      t += kTB;
    }
  } else if (T >= kTB) {
    Tile<L, RB, kTB, -1>(w, rows, cols, x, y, r0, 0);
    t = kTB;
  }
  for (; t + kTB <= T; t += kTB) Tile<L, RB, kTB, 0>(w, rows, cols, x, y, r0, t);
  // The rest in a pair, then alone: each decoded weight still feeds every activation it can.
  if (t == 0 && T >= 2) {
    if (short_rows) {
      Tile<L, RB, 2, 1>(w, rows, cols, x, y, r0, 0);
    } else {
      Tile<L, RB, 2, -1>(w, rows, cols, x, y, r0, 0);
    }
    t = 2;
  } else if (t + 2 <= T) {
    Tile<L, RB, 2, 0>(w, rows, cols, x, y, r0, t);
    t += 2;
  }
  for (; t < T; ++t) Tile<L, RB, 1, 1>(w, rows, cols, x, y, r0, t);
}

// MXFP4 weight rows [r0, r0 + RB) for T >= 2 activations: each tile decodes every weight again,
// so the rows per expert that prefill gives (about 4.6 at the bench preset, spread 1..10) go in
// as few tiles as the registers allow, of even sizes: 3 = one tile of 3 (was 2 + 1), 5 = one of
// 5 (4 + 1), 6 = 3 + 3 (4 + 2), 7 = 4 + 3 (4 + 2 + 1), and beyond, tiles of 4 with the same
// endings. k3_bench_roofline (its T list set to 2, 3, 5, 6, 7, 16 for the run), avx512, 256×512,
// one thread, µs per call in three alternating runs, old → new: T = 3 13.3-13.4 → 10.3-10.7,
// T = 5 17.9-18.0 → 16.7-16.8, T = 6 21.9-22.1 → 20.6-21.5, T = 7 25.5-25.8 → 22.9-24.1;
// T = 2 and 16 unchanged. A tile of 6 spilled its accumulators (T = 6: 21.7-27.5).
template <int RB>
void Mxfp4RowBlock(const Mxfp4Rows& w, int64_t rows, int64_t cols, const float* x, int64_t T,
                   float* y, int64_t r0, int64_t ahead) {
  // A tile of 3 at t; the block's first tile prefetches the next rows.
  auto three = [&](int64_t at) {
    if (at == 0) {
      Mxfp4Tile<RB, 3, true>(w, rows, cols, x, y, r0, at, ahead);
    } else {
      Mxfp4Tile<RB, 3, false>(w, rows, cols, x, y, r0, at);
    }
  };
  int64_t t = 0;
  // the tiles of 4 before the ending; the first prefetches nothing (it needs its registers)
  const int64_t rem = T % 4;
  const int64_t fours = T / 4 - (rem == 1 || rem == 2 ? 1 : 0);
  for (int64_t i = 0; i < fours; ++i, t += 4) Mxfp4Tile<RB, 4, false>(w, rows, cols, x, y, r0, t);
  switch (T - t) {
    case 6:
      three(t);
      three(t + 3);
      break;
    case 5: Mxfp4Tile<RB, 5, false>(w, rows, cols, x, y, r0, t); break;
    case 3: three(t); break;
    case 2: Mxfp4Tile<RB, 2, true>(w, rows, cols, x, y, r0, t, ahead); break;  // T = 2 only
    default: break;
  }
}

// Blocks of RB rows that a tile prefetches ahead (PrefetchStart): at least kShortRowsAheadBytes.
// The blocks before the first tile's target are prefetched here, all at once.
// (No std::min/max here: this file calls no inline function from a header, kernels_internal.h.)
int64_t Mxfp4Ahead(const Mxfp4Rows& w, int64_t rb, int64_t r, int64_t r_end) {
  const int64_t block = rb * w.row_bytes();
  const int64_t ahead =
      block >= kShortRowsAheadBytes ? 1 : (kShortRowsAheadBytes + block - 1) / block;
  if (ahead > 1) {
    const int64_t end = r + ahead * rb < r_end ? r + ahead * rb : r_end;
    PrefetchRows(w, r, end - r);
  }
  return ahead;
}

void RowsMxfp4(const Mxfp4Rows& w, int64_t rows, int64_t cols, const float* x, int64_t T,
               float* y, int64_t r_begin, int64_t r_end) {
  // The tiles read x already in Mxfp4Order, permuted here once per call instead of once per
  // block of rows: at T = 4 that was as many shuffles as the weights' decode took, on the
  // ports the FMAs share. 64-byte aligned, cols % 32 == 0: whole aligned loads.
  // k3_bench_roofline, avx512, one thread, µs a call in two alternating runs, before → after:
  // released 3072×3584 T = 2 374-379 → 322, T = 4 592-623 → 518, T = 16 2,909 → 2,213;
  // bench 512×256 T = 2 5.5-5.6 → 4.9, T = 16 25.9 → 24.7; T = 1 unchanged.
  float* const permuted = MatMulScratch(T * cols);
  const __m512i order = Mxfp4Order();
  for (int64_t i = 0; i < T * cols; i += 16) {
    _mm512_store_ps(permuted + i, _mm512_permutexvar_ps(order, _mm512_loadu_ps(x + i)));
  }
  x = permuted;
  // The tiles that prefetch fetch the block at least kShortRowsAheadBytes on: an expert's short
  // rows (256 columns: 1 KiB a block of 8) take less than the DRAM latency a block, so one
  // block ahead came too late, and no tile fetched the first. k3_bench_roofline, avx512, T = 1,
  // one thread, four alternating runs, GB/s: bench 512×256 13.4-14.5 -> 17.2-19.2, 256×512
  // 18.4-19.7 -> 19.2-20.5; T = 2 (first tiles of 4 rows), 512×256 12.2-12.5 -> 13.5-14.0;
  // released shapes (one block ahead, as before) within the noise.
  int64_t r = r_begin;
  if (T == 1) {
    // One activation: 8 rows in flight hide the FMA latency and keep 8 streams reading.
    const int64_t ahead = Mxfp4Ahead(w, 8, r, r_end);
    for (; r + 8 <= r_end; r += 8) Mxfp4Tile<8, 1, true>(w, rows, cols, x, y, r, 0, ahead);
    for (; r < r_end; ++r) Mxfp4Tile<1, 1, true>(w, rows, cols, x, y, r, 0);
    return;
  }
  const int64_t ahead = Mxfp4Ahead(w, 4, r, r_end);
  for (; r + 4 <= r_end; r += 4) Mxfp4RowBlock<4>(w, rows, cols, x, T, y, r, ahead);
  for (; r < r_end; ++r) Mxfp4RowBlock<1>(w, rows, cols, x, T, y, r, 1);
}

// bf16/f32 rows [r_begin, r_end).
template <class L>
void Rows(const L& w, int64_t rows, int64_t cols, const float* x, int64_t T, float* y,
          int64_t r_begin, int64_t r_end) {
  int64_t r = r_begin;
  if (T == 1) {
    // One activation: 8 rows in flight hide the FMA latency and keep 8 streams reading.
    if (8 * w.row_bytes() <= kMaxPrefetchBytes) {
      for (; r + 8 <= r_end; r += 8) Tile<L, 8, 1, 1>(w, rows, cols, x, y, r, 0);
    } else {
      for (; r + 8 <= r_end; r += 8) Tile<L, 8, 1, -1>(w, rows, cols, x, y, r, 0);
    }
  } else if (T >= 12 && 4 * w.row_bytes() > kMaxPrefetchBytes) {
    // Long bf16/f32 rows at prefill widths: tiles of 6 activations (24 accumulators), each
    // widened weight feeding 6 FMAs instead of 4. k3_bench_roofline, T = 16, bf16 12288×7168:
    // 77 -> 85 % of the FMA floor on one thread, 73-77 -> 83-84 % on two. Short rows keep the
    // tiles of 4 whose first prefetches the next rows (768 columns ran at 0.9× in tiles of 6).
    for (; r + 4 <= r_end; r += 4) {
      Tile<L, 4, 6, -1>(w, rows, cols, x, y, r, 0);
      int64_t t = 6;
      for (; t + 6 <= T; t += 6) Tile<L, 4, 6, 0>(w, rows, cols, x, y, r, t);
      switch (T - t) {
        case 5: Tile<L, 4, 5, 0>(w, rows, cols, x, y, r, t); break;
        case 4: Tile<L, 4, 4, 0>(w, rows, cols, x, y, r, t); break;
        case 3: Tile<L, 4, 3, 0>(w, rows, cols, x, y, r, t); break;
        case 2: Tile<L, 4, 2, 0>(w, rows, cols, x, y, r, t); break;
        case 1: Tile<L, 4, 1, 0>(w, rows, cols, x, y, r, t); break;
        default: break;
      }
    }
  } else {
    for (; r + 4 <= r_end; r += 4) RowBlock<L, 4>(w, rows, cols, x, T, y, r);
  }
  for (; r < r_end; ++r) RowBlock<L, 1>(w, rows, cols, x, T, y, r);
}

}  // namespace

void MatMulRowsAvx512(const Matrix& w, const float* x, int64_t T, float* y, int64_t r_begin,
                      int64_t r_end) {
  switch (w.type) {
    case WeightType::kF32:
      Rows(F32Rows{static_cast<const float*>(w.data), w.cols}, w.rows, w.cols, x, T, y, r_begin,
           r_end);
      return;
    case WeightType::kBF16:
      Rows(Bf16Rows{static_cast<const uint16_t*>(w.data), w.cols}, w.rows, w.cols, x, T, y, r_begin,
           r_end);
      return;
    case WeightType::kMXFP4:
      RowsMxfp4(Mxfp4Rows{static_cast<const uint8_t*>(w.data), w.scales, w.cols, Mxfp4Lut()},
                w.rows, w.cols, x, T, y, r_begin, r_end);
      return;
  }
}

}  // namespace k3::kernels::internal

#pragma GCC diagnostic pop
