// The one dispatch point: validation, ISA choice, and the split of output rows over threads.
#include "k3run/kernels/matmul.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "common/log.h"
#include "k3run/kernels/kernels_internal.h"
#include "k3run/kernels/thread_pool.h"
#include "k3run/kernels/thread_scratch.h"

namespace k3::kernels {
namespace {

// Largest accepted rows·cols: far above any K3 matrix (embed/lm_head: 1.2e9), low enough that
// byte offsets cannot overflow int64.
constexpr int64_t kMaxElements = int64_t{1} << 40;

// Below this many multiply-adds a fork/join costs more than it saves; the result does not
// depend on it (each element is computed the same way by whichever thread owns its row).
constexpr int64_t kMinParallelWork = int64_t{1} << 16;

// Thread chunks start on a multiple of this, which matches the SIMD
// row blocking and keeps two threads off one cache line of y.
constexpr int64_t kRowAlign = 16;

// Cache blocking of wide calls (prefill). A body multiplies each block of weight rows by all
// the activation rows it is given, so at T = 512 (bench preset, hidden 768: 1.5 MB of x) it
// streamed x from L3 once per block of 4 weight rows. Wide calls go in tiles of at most
// kWeightBlockBytes of weight rows × kActivationBlockBytes of activation rows, row tile
// outermost: the row tile's weights stay in L2 for all its activation tiles and are read from
// memory once, and an activation tile stays in L2 for the row tile. Each output element is still
// computed whole by one body call (T rows in one call equal T one-row calls), so the tiling
// never changes a bit. The activation tile is in kernels_internal.h (the router's dispatch uses
// it too). A throwaway driver, bf16, T = 512, µs a call, untiled → tiled: 768×768 4,650 →
// 3,919 on one thread, 2,407 → 2,039 on two; 768×3584 (rows × cols) 20,698 → 17,019
// and 13,253 → 9,597; T = 256, two threads, 2048×7168 35,416 → 28,672, 7168×2048 30,086 → 26,707.
constexpr int64_t kWeightBlockBytes = 256 << 10;

std::atomic<int> g_isa{-1};     // -1: not chosen yet
std::atomic<int> g_threads{0};  // 0: not set, use omp_get_max_threads()

std::string SupportedList(const CpuFeatures& cpu) {
  std::string out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupportedBy(isa, cpu)) continue;
    if (!out.empty()) out += ", ";
    out += IsaName(isa);
  }
  return out;
}

Isa BestFor(const CpuFeatures& cpu) {
  if (IsaSupportedBy(Isa::kAvx512, cpu)) return Isa::kAvx512;
  if (IsaSupportedBy(Isa::kAvx2, cpu)) return Isa::kAvx2;
  return Isa::kScalar;
}

Isa ChooseDefaultIsa() {
  Result<Isa> isa = IsaFromEnvironment();
  if (isa.ok()) return *isa;
  const Isa fallback = BestSupportedIsa();
  LogWarn(isa.status().message() + "; using " + IsaName(fallback) + " instead");
  return fallback;
}

internal::RowsFn RowsFor(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return internal::MatMulRowsAvx512;
    case Isa::kAvx2:
      return internal::MatMulRowsAvx2;
    case Isa::kScalar:
      break;
  }
  return internal::MatMulRowsScalar;
}

}  // namespace

// MatMulScratch aligns its buffer to 64 bytes, so it holds this many floats beyond what is asked.
constexpr int64_t kScratchAlignFloats = 16;

namespace internal {
[[noreturn]] void Die(const std::string& msg) {
  LogError("k3 kernels (a bug in the caller): " + msg);
  std::abort();
}

int64_t ActivationBlockRows(int64_t cols) {
  const int64_t row_bytes = std::max<int64_t>(1, cols * int64_t{sizeof(float)});
  return std::max(kMinActivationBlock, kActivationBlockBytes / row_bytes);
}

float* MatMulScratch(int64_t n) {
  thread_local std::vector<float> buffer;
  // Exactly what is asked (resize could double it): MatMulThreadScratchBytes is the bound.
  if (int64_t(buffer.size()) < n + kScratchAlignFloats) {
    std::vector<float>(size_t(n + kScratchAlignFloats)).swap(buffer);
  }
  const auto at = reinterpret_cast<uintptr_t>(buffer.data());
  const int64_t misaligned = int64_t(at / sizeof(float)) % kScratchAlignFloats;  // malloc: 16-byte
  return buffer.data() + (kScratchAlignFloats - misaligned) % kScratchAlignFloats;
}
}  // namespace internal
using internal::Die;

int64_t MatMulThreadScratchBytes(int64_t cols) {
  const int64_t floats = internal::ActivationBlockRows(cols) * std::max<int64_t>(cols, 0);
  return (floats + kScratchAlignFloats) * int64_t{sizeof(float)};
}

Status ValidateMatrix(const Matrix& w, std::string_view what) {
  const std::string name(what);
  if (w.type != WeightType::kF32 && w.type != WeightType::kBF16 && w.type != WeightType::kMXFP4) {
    return Status::Invalid(name + ": unknown weight type " +
                           std::to_string(static_cast<int>(w.type)) +
                           " (rule: weights are F32, BF16 or MXFP4)");
  }
  if (w.rows < 0 || w.cols < 0) {
    return Status::Invalid(name + ": negative shape [" + std::to_string(w.rows) + "][" +
                           std::to_string(w.cols) + "] (rule: rows and cols are >= 0)");
  }
  if (w.cols > 0 && w.rows > kMaxElements / w.cols) {
    return Status::Invalid(name + ": shape [" + std::to_string(w.rows) + "][" +
                           std::to_string(w.cols) + "] has more than 2^40 elements " +
                           "(rule: a weight matrix holds at most 2^40 elements)");
  }
  const bool empty = w.rows == 0 || w.cols == 0;
  if (!empty && w.data == nullptr) {
    return Status::Invalid(name + ": no weight data for a [" + std::to_string(w.rows) + "][" +
                           std::to_string(w.cols) + "] matrix (rule: data is set when the " +
                           "matrix is not empty)");
  }
  if (w.type == WeightType::kMXFP4) {
    if (w.cols % kMxfp4GroupSize != 0) {
      return Status::Invalid(name + ": MXFP4 matrix has " + std::to_string(w.cols) +
                             " columns, not a multiple of the group size 32 (rule: MXFP4 " +
                             "cols % 32 == 0; store this tensor as BF16 or F32 instead)");
    }
    if (!empty && w.scales == nullptr) {
      return Status::Invalid(name + ": MXFP4 matrix has no E8M0 scales (rule: scales " +
                             "[rows][cols/32] are set for MXFP4)");
    }
  }
  return Status::Ok();
}

int64_t WeightBytes(const Matrix& w) {
  switch (w.type) {
    case WeightType::kF32:
      return w.rows * w.cols * 4;
    case WeightType::kBF16:
      return w.rows * w.cols * 2;
    case WeightType::kMXFP4:
      return w.rows * (w.cols / 2 + w.cols / kMxfp4GroupSize);
  }
  return 0;
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

bool IsaSupportedBy(Isa isa, const CpuFeatures& cpu) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return cpu.avx2 && cpu.fma;
    case Isa::kAvx512:
      // -mavx512f lets the compiler use AVX2/FMA in that file too; every AVX-512F CPU has them.
      return cpu.avx512f && cpu.avx512bw && cpu.avx2 && cpu.fma;
  }
  return false;
}

bool IsaSupported(Isa isa) {
  static const CpuFeatures cpu = DetectCpu();
  return IsaSupportedBy(isa, cpu);
}

Isa BestSupportedIsa() { return BestFor(DetectCpu()); }

Result<Isa> ResolveIsaRequest(std::string_view value, const CpuFeatures& cpu) {
  if (value.empty()) return BestFor(cpu);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (value != IsaName(isa)) continue;
    if (!IsaSupportedBy(isa, cpu)) {
      return Status::Invalid("K3_ISA=" + std::string(value) + ": this CPU lacks the " +
                             "instructions for that path (supported here: " + SupportedList(cpu) +
                             "); unset K3_ISA or pick a supported one");
    }
    return isa;
  }
  return Status::Invalid("K3_ISA=" + std::string(value) + ": unknown kernel path (accepted: " +
                         "scalar, avx2, avx512; supported here: " + SupportedList(cpu) + ")");
}

Result<Isa> IsaFromEnvironment() {
  const char* env = std::getenv("K3_ISA");
  return ResolveIsaRequest(env == nullptr ? "" : env, DetectCpu());
}

Isa ActiveIsa() {
  int isa = g_isa.load(std::memory_order_acquire);
  if (isa < 0) {
    static std::once_flag once;
    std::call_once(once, [] {
      int expected = -1;  // a SetIsa that raced ahead of first use wins
      g_isa.compare_exchange_strong(expected, static_cast<int>(ChooseDefaultIsa()));
    });
    isa = g_isa.load(std::memory_order_acquire);
  }
  return static_cast<Isa>(isa);
}

void SetIsa(Isa isa) {
  if (!IsaSupported(isa)) {
    Die(std::string("SetIsa(") + IsaName(isa) + "): this CPU lacks that path; check " +
        "IsaSupported() first");
  }
  g_isa.store(static_cast<int>(isa), std::memory_order_release);
}

void SetThreads(int n) { g_threads.store(n < 1 ? 1 : n, std::memory_order_relaxed); }

int Threads() {
  const int n = g_threads.load(std::memory_order_relaxed);
  return n > 0 ? n : omp_get_max_threads();
}

namespace {

// The checks every MatMul entry makes; false when there is nothing to compute.
bool CheckMatMul(const Matrix& w, const float* x, int64_t T, float* y) {
  if (Status st = ValidateMatrix(w, "MatMul weight"); !st.ok()) Die(st.message());
  if (T < 0) Die("MatMul with T = " + std::to_string(T) + " activation rows");
  if (w.rows == 0 || T == 0) return false;
  if (x == nullptr || y == nullptr) Die("MatMul with a null activation or output pointer");
  return true;
}

// Rows [r0, r1) for all T activation rows, in the cache tiles described at kWeightBlockBytes.
void TiledRows(internal::RowsFn rows_fn, const Matrix& w, const float* x, int64_t T, float* y,
               int64_t r0, int64_t r1) {
  const int64_t tb = internal::ActivationBlockRows(w.cols);
  if (T <= tb) {
    rows_fn(w, x, T, y, r0, r1);
    return;
  }
  const int64_t row_bytes = std::max<int64_t>(1, WeightBytes(w) / std::max<int64_t>(w.rows, 1));
  const int64_t rb = std::max(kRowAlign, kWeightBlockBytes / row_bytes / kRowAlign * kRowAlign);
  for (int64_t r = r0; r < r1; r += rb) {
    const int64_t r_end = std::min(r1, r + rb);
    for (int64_t t = 0; t < T; t += tb) {
      rows_fn(w, x + t * w.cols, std::min(tb, T - t), y + t * w.rows, r, r_end);
    }
  }
}

}  // namespace

void MatMulOnThisThread(const Matrix& w, const float* x, int64_t T, float* y) {
  if (CheckMatMul(w, x, T, y)) TiledRows(RowsFor(ActiveIsa()), w, x, T, y, 0, w.rows);
}

void MatMul(const Matrix& w, const float* x, int64_t T, float* y) {
  if (!CheckMatMul(w, x, T, y)) return;
  const internal::RowsFn rows_fn = RowsFor(ActiveIsa());
  const int64_t work = w.rows * w.cols * T;
  // Blocks of kRowAlign rows, at least one block per thread.
  const int64_t blocks = (w.rows + kRowAlign - 1) / kRowAlign;
  int64_t threads = Threads();
  if (threads > blocks) threads = blocks;
  if (threads <= 1 || work < kMinParallelWork) {
    TiledRows(rows_fn, w, x, T, y, 0, w.rows);
    return;
  }
  // Chunks of whole row blocks, claimed by whichever thread is free (thread_pool.h): a few per
  // thread so a descheduled thread's share is taken over.
  const int64_t chunks = std::min<int64_t>(blocks, 4 * threads);
  ParallelChunks(static_cast<int>(threads), chunks, [&](int64_t c) {
    const int64_t r0 = blocks * c / chunks * kRowAlign;
    const int64_t r1 = std::min<int64_t>(blocks * (c + 1) / chunks * kRowAlign, w.rows);
    if (r0 < r1) TiledRows(rows_fn, w, x, T, y, r0, r1);
  });
}

}  // namespace k3::kernels
