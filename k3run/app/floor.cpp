// The floor of a run: the four probes and the arithmetic (see k3run/app/floor.h).
#include "k3run/app/floor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <thread>
#include <string>
#include <utility>
#include <vector>

#include "common/align.h"
#include "common/aligned_buffer.h"
#include "common/direct_reader.h"
#include "formats/prepared_layout.h"
#include "k3run/kernels/matmul.h"
#include "k3run/kernels/thread_pool.h"
#include "k3run/stream/trunk_ring.h"

namespace k3::run {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A rate over a measured interval; the floor on the interval only guards a clock that did not
// advance (a zero would read as "unmeasured" and an infinity would poison the floor).
double Rate(double amount, double seconds) { return amount / std::max(seconds, 1e-9); }

Status ValidateOptions(const ProbeOptions& o) {
  if (!std::isfinite(o.seconds_per_probe) || o.seconds_per_probe <= 0 ||
      o.seconds_per_probe > 60) {
    return Status::Invalid("bandwidth probe: seconds_per_probe is " +
                           std::to_string(o.seconds_per_probe) +
                           "; it must be a number of seconds in (0, 60]");
  }
  if (o.expert_queue_depth < 1) {
    return Status::Invalid("bandwidth probe: expert_queue_depth is " +
                           std::to_string(o.expert_queue_depth) +
                           "; it must be at least 1 (the engine's expert reads per wave)");
  }
  if (o.threads < 0) {
    return Status::Invalid("bandwidth probe: threads is " + std::to_string(o.threads) +
                           "; it must be 0 (the kernels' thread count) or more");
  }
  return Status::Ok();
}

// ---- experts: random record-sized reads, a wave at a time ----------------------------------

class ExpertProbe {
 public:
  ExpertProbe(Env* env, const prepared::PreparedDir& p, const ProbeOptions& o)
      : env_(env), p_(p), o_(o), files_(p.expert_paths.size()) {}

  // Allocates the batch buffer and the shuffled order and reads one untimed warm-up batch
  // (opening the files it needs). False: the checkpoint has no experts.
  Result<bool> Prepare() {
    const std::vector<prepared::ExpertRecord>& recs = p_.experts.records;
    if (recs.empty()) return false;
    uint64_t max_len = 0;
    for (size_t i = 0; i < recs.size(); ++i) {
      if (recs[i].file_id >= p_.expert_paths.size()) {
        return Status::Invalid("bandwidth probe: experts.idx record of " + Which(i) +
                               " names file_id " + std::to_string(recs[i].file_id) + " but only " +
                               std::to_string(p_.expert_paths.size()) +
                               " expert files are known; re-run k3prep pack");
      }
      max_len = std::max(max_len, recs[i].length);
    }
    // Only the experts this directory holds (a share's others are absent: no bytes to read).
    for (size_t i = 0; i < recs.size(); ++i) {
      if (!recs[i].absent()) order_.push_back(i);
    }
    if (order_.empty()) return false;
    std::mt19937_64 rng(12345);  // fixed: every run reads the same records
    std::shuffle(order_.begin(), order_.end(), rng);
    qd_ = std::min<size_t>(static_cast<size_t>(o_.expert_queue_depth), order_.size());
    // Slots 4096-aligned like the engine's arena, so each read lands where the engine's would.
    slot_ = AlignUp(max_len, 4096);
    K3_ASSIGN_OR_RETURN(buf_, AlignedBuffer::Allocate(qd_ * slot_, 4096));
    reader_ = BatchReader::Create(static_cast<int>(qd_), o_.force_pread);
    max_len_ = max_len;
    uint64_t bytes = 0;
    K3_RETURN_IF_ERROR(Batch(&bytes));  // warm-up: first submissions, file opens
    return true;
  }

  Status Run(Bandwidths* b) {
    K3_ASSIGN_OR_RETURN(bool any, Prepare());
    if (!any) return Status::Ok();
    size_t consumed = qd_;
    uint64_t bytes = 0;
    int batches = 0;
    const auto t0 = Clock::now();
    while (true) {
      K3_RETURN_IF_ERROR(Batch(&bytes));
      ++batches;
      consumed += qd_;
      if (batches >= 2 && (consumed >= order_.size() || Since(t0) >= o_.seconds_per_probe)) break;
    }
    b->expert_bytes_per_s = Rate(static_cast<double>(bytes), Since(t0));
    b->expert_request_bytes = max_len_;
    b->expert_queue_depth = static_cast<int>(qd_);
    b->backend = std::string(reader_->backend());
    return Status::Ok();
  }

  // The next qd_ records of the order (wrapping), sorted by (file, offset) as the engine
  // submits a wave, read in one ReadAll; adds their bytes to *bytes.
  Status Batch(uint64_t* bytes) {
    const std::vector<prepared::ExpertRecord>& recs = p_.experts.records;
    std::vector<size_t> pick(qd_);
    for (size_t& i : pick) i = order_[next_++ % order_.size()];
    std::sort(pick.begin(), pick.end(), [&](size_t a, size_t b) {
      return recs[a].file_id != recs[b].file_id ? recs[a].file_id < recs[b].file_id
                                                : recs[a].offset < recs[b].offset;
    });
    std::vector<ReadRequest> reqs(qd_);
    for (size_t k = 0; k < qd_; ++k) {
      const prepared::ExpertRecord& r = recs[pick[k]];
      K3_ASSIGN_OR_RETURN(reqs[k].file, FileFor(r.file_id));
      reqs[k].offset = r.offset;
      reqs[k].length = r.length;
      reqs[k].dst = buf_.data() + k * slot_;
    }
    if (reader_->ReadAll(std::span<ReadRequest>(reqs)).ok()) {
      for (const ReadRequest& r : reqs) *bytes += r.length;
      return Status::Ok();
    }
    for (size_t k = 0; k < qd_; ++k) {
      if (reqs[k].status.ok()) continue;
      return Status::Io(p_.expert_paths[recs[pick[k]].file_id] +
                        ": bandwidth probe: reading the expert record of " + Which(pick[k]) +
                        " at byte offset " + std::to_string(reqs[k].offset) + " (+" +
                        std::to_string(reqs[k].length) + " bytes) failed: " +
                        reqs[k].status.ToString() +
                        "; check the disk (k3verify prepared --deep) or re-run k3prep pack");
    }
    return Status::Io("bandwidth probe: an expert batch failed without a failing request");
  }

 private:
  std::string Which(size_t index) const {
    const uint64_t n = std::max<uint32_t>(p_.experts.n_experts, 1);
    return "layer " + std::to_string(p_.experts.first_moe_layer + index / n) + " expert " +
           std::to_string(index % n);
  }

  Result<File*> FileFor(uint32_t file_id) {
    std::unique_ptr<File>& f = files_[file_id];
    if (!f) {
      const std::string& path = p_.expert_paths[file_id];
      Result<std::unique_ptr<File>> r = env_->Open(path, OpenMode::kReadDirect);
      if (!r.ok()) {
        return Status(r.status().WithContext("bandwidth probe: opening expert file " + path));
      }
      f = std::move(r).value();
    }
    return f.get();
  }

  Env* env_;
  const prepared::PreparedDir& p_;
  const ProbeOptions& o_;
  std::vector<std::unique_ptr<File>> files_;  // by file_id, opened on first use
  std::vector<size_t> order_;                 // record indices, shuffled
  size_t next_ = 0;
  size_t qd_ = 0;
  uint64_t slot_ = 0;
  uint64_t max_len_ = 0;
  AlignedBuffer buf_;
  std::unique_ptr<BatchReader> reader_;
};

// ---- trunk: ring-sized sequential reads ----------------------------------------------------

class TrunkProbe {
 public:
  TrunkProbe(Env* env, const prepared::PreparedDir& p, const ProbeOptions& o)
      : env_(env), p_(p), o_(o), runs_(p.manifest.runs) {}

  // Opens trunk.bin, allocates one request's buffer, reads a warm-up. False: nothing to read.
  Result<bool> Prepare() {
    if (runs_.empty()) return false;
    std::stable_sort(runs_.begin(), runs_.end(),
                     [](const prepared::TrunkRun& x, const prepared::TrunkRun& y) {
                       return x.length > y.length;
                     });
    req_ = o_.trunk_request_bytes > 0 ? o_.trunk_request_bytes : runs_[0].length;
    req_ = std::min({req_, kMaxTrunkProbeRequest, runs_[0].length});
    if (req_ == 0) return false;  // only empty runs: nothing a token could read
    path_ = JoinPath(p_.dir, std::string(prepared::kTrunkFile));
    Result<std::unique_ptr<File>> opened = env_->Open(path_, OpenMode::kReadDirect);
    if (!opened.ok()) return opened.status().WithContext("bandwidth probe: opening " + path_);
    file_ = std::move(opened).value();
    K3_ASSIGN_OR_RETURN(buf_, AlignedBuffer::Allocate(req_, 4096));
    // QD 16 and the ring's piece size (k3run/stream/trunk_ring.cpp): a request is cut into pieces read
    // together.
    reader_ = BatchReader::Create(BatchReader::kDefaultQueueDepth, o_.force_pread, 4096,
                                  RingPieceBytes(req_));
    uint64_t warm = 0;
    K3_RETURN_IF_ERROR(Read(std::min<uint64_t>(req_, 1 << 20), &warm));
    return true;
  }

  // The next request of the walk over the runs (largest first, wrapping).
  Status Read(uint64_t max_len, uint64_t* bytes) {
    while (runs_[run_].length == 0) run_ = (run_ + 1) % runs_.size();
    const prepared::TrunkRun& r = runs_[run_];
    ReadRequest q;
    q.file = file_.get();
    q.offset = r.offset + pos_;
    q.length = std::min(max_len, r.length - pos_);
    q.dst = buf_.data();
    if (Status s = reader_->ReadAll(std::span<ReadRequest>(&q, 1)); !s.ok()) {
      return Status::Io(path_ + ": bandwidth probe: reading layer " + std::to_string(r.layer) +
                        "'s trunk run at byte offset " + std::to_string(q.offset) + " (+" +
                        std::to_string(q.length) + " bytes) failed: " + s.ToString() +
                        "; check the disk (k3verify prepared --deep) or re-run k3prep pack");
    }
    *bytes += q.length;
    pos_ += q.length;
    if (pos_ == r.length) {
      pos_ = 0;
      run_ = (run_ + 1) % runs_.size();
    }
    return Status::Ok();
  }

  uint64_t request() const { return req_; }
  std::string_view backend() const { return reader_->backend(); }

 private:
  Env* env_;
  const prepared::PreparedDir& p_;
  const ProbeOptions& o_;
  std::vector<prepared::TrunkRun> runs_;
  uint64_t req_ = 0;
  std::string path_;
  std::unique_ptr<File> file_;
  AlignedBuffer buf_;
  std::unique_ptr<BatchReader> reader_;
  size_t run_ = 0;
  uint64_t pos_ = 0;  // within runs_[run_]
};

Status ProbeTrunk(Env* env, const prepared::PreparedDir& p, const ProbeOptions& o, Bandwidths* b) {
  TrunkProbe t(env, p, o);
  K3_ASSIGN_OR_RETURN(bool any, t.Prepare());
  if (!any) return Status::Ok();
  uint64_t bytes = 0;
  int requests = 0;
  const auto t0 = Clock::now();
  while (requests < 2 || Since(t0) < o.seconds_per_probe) {
    K3_RETURN_IF_ERROR(t.Read(t.request(), &bytes));
    ++requests;
  }
  b->trunk_bytes_per_s = Rate(static_cast<double>(bytes), Since(t0));
  b->trunk_request_bytes = t.request();
  const std::string backend(t.backend());
  if (b->backend.empty()) {
    b->backend = backend;
  } else if (b->backend != backend) {
    b->backend = "experts: " + b->backend + "; trunk: " + backend;
  }
  return Status::Ok();
}

// Both streams at once, as the engine runs them (the ring's reader and a wave's batch): the disk
// may deliver more in total than either stream alone.
Status ProbeCombined(Env* env, const prepared::PreparedDir& p, const ProbeOptions& o, Bandwidths* b) {
  ExpertProbe experts(env, p, o);
  TrunkProbe trunk(env, p, o);
  K3_ASSIGN_OR_RETURN(bool have_experts, experts.Prepare());
  K3_ASSIGN_OR_RETURN(bool have_trunk, trunk.Prepare());
  if (!have_experts || !have_trunk) return Status::Ok();
  std::atomic<bool> stop{false};
  uint64_t trunk_bytes = 0, expert_bytes = 0;
  Status trunk_status;
  const auto t0 = Clock::now();
  std::thread reader([&] {
    while (!stop.load() && trunk_status.ok()) trunk_status = trunk.Read(trunk.request(), &trunk_bytes);
  });
  Status st;
  int batches = 0;
  while (st.ok() && (batches < 2 || Since(t0) < o.seconds_per_probe)) {
    st = experts.Batch(&expert_bytes);
    ++batches;
  }
  stop.store(true);
  reader.join();
  const double seconds = Since(t0);
  K3_RETURN_IF_ERROR(st);
  K3_RETURN_IF_ERROR(trunk_status);
  b->combined_bytes_per_s = Rate(static_cast<double>(trunk_bytes + expert_bytes), seconds);
  return Status::Ok();
}

// ---- memory: a streaming read far beyond the caches ----------------------------------------

Status ProbeMemory(const ProbeOptions& o, int threads, Bandwidths* b) {
  // 1 GiB is beyond any last-level cache (64 MiB was not: this machine's L3 served it at up to
  // 50 GB/s). A plan smaller than that caps it (whole MiB, at least one) so that the probe never
  // sets the run's peak RSS; such a plan's weights are as cache-resident as the probe.
  uint64_t kBytes = uint64_t{1} << 30;
  if (o.max_buffer_bytes > 0) {
    kBytes = std::max<uint64_t>(std::min(kBytes, o.max_buffer_bytes) >> 20 << 20, 1 << 20);
  }
  const int64_t n = static_cast<int64_t>(kBytes / 8);
  double seconds = 0;
  int passes = 0;
  {
    K3_ASSIGN_OR_RETURN(AlignedBuffer buf, AlignedBuffer::AllocateHuge(kBytes));
    uint64_t* w = reinterpret_cast<uint64_t*>(buf.data());
    // The engine's own compute threads (kernels/thread_pool.h) read it in chunks.
    const int64_t chunks = 8 * std::max(threads, 1);
    std::vector<uint64_t> part(static_cast<size_t>(chunks));
    kernels::ParallelChunks(threads, chunks, [&](int64_t c) {
      for (int64_t i = n * c / chunks; i < n * (c + 1) / chunks; ++i) {
        w[i] = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
      }
    });
    volatile uint64_t sink = 0;  // keeps the reduction from being optimised away
    auto pass = [&] {
      kernels::ParallelChunks(threads, chunks, [&](int64_t c) {
        uint64_t acc = 0;
        for (int64_t i = n * c / chunks; i < n * (c + 1) / chunks; ++i) acc ^= w[i];
        part[static_cast<size_t>(c)] = acc;
      });
      uint64_t acc = 0;
      for (uint64_t v : part) acc ^= v;
      sink = sink ^ acc;
    };
    pass();  // warm-up: thread team start, TLB
    const auto t0 = Clock::now();
    while (passes < 2 || Since(t0) < o.seconds_per_probe) {
      pass();
      ++passes;
    }
    seconds = Since(t0);
  }  // the buffer is freed here, before the weights are allocated
  b->memory_bytes_per_s = Rate(static_cast<double>(kBytes) * passes, seconds);
  return Status::Ok();
}

// ---- kernel: bf16 matvec on cache-resident weights -----------------------------------------

// Restores the process-wide kernel thread count on every return path.
class ThreadsScope {
 public:
  explicit ThreadsScope(int threads) : saved_(kernels::Threads()) {
    if (threads != saved_) kernels::SetThreads(threads);
  }
  ~ThreadsScope() {
    if (kernels::Threads() != saved_) kernels::SetThreads(saved_);
  }
  ThreadsScope(const ThreadsScope&) = delete;
  ThreadsScope& operator=(const ThreadsScope&) = delete;

 private:
  int saved_;
};

Status ProbeKernel(const ProbeOptions& o, int threads, Bandwidths* b) {
  constexpr int64_t kCols = 1024;
  const int64_t rows = 128 * int64_t{threads};
  K3_ASSIGN_OR_RETURN(AlignedBuffer wbuf,
                      AlignedBuffer::Allocate(static_cast<size_t>(rows * kCols) * 2, 64));
  uint16_t* w = reinterpret_cast<uint16_t*>(wbuf.data());
  // Normal values in [-1, 1): subnormals or NaNs could slow a path and flatter nothing.
  for (int64_t i = 0; i < rows * kCols; ++i) {
    const float v = static_cast<float>((i * 7919) % 2000 - 1000) / 1000.0f;
    w[i] = kernels::F32ToBf16RoundNearestEven(v == 0.0f ? 0.5f : v);
  }
  const kernels::Matrix m{kernels::WeightType::kBF16, rows, kCols, w, nullptr};
  K3_RETURN_IF_ERROR(kernels::ValidateMatrix(m, "bandwidth probe matrix"));
  std::vector<float> x(static_cast<size_t>(kCols), 0.25f), y(static_cast<size_t>(rows));
  ThreadsScope scope(threads);
  kernels::MatVec(m, x.data(), y.data());  // warm-up: caches, thread team
  constexpr int kCallsPerCheck = 16;       // calls are microseconds: read the clock less often
  int64_t calls = 0;
  volatile float sink = 0;
  const auto t0 = Clock::now();
  while (calls < 2 || Since(t0) < o.seconds_per_probe) {
    for (int k = 0; k < kCallsPerCheck; ++k) kernels::MatVec(m, x.data(), y.data());
    calls += kCallsPerCheck;
    sink = sink + y[0];
  }
  const double seconds = Since(t0);
  b->kernel_flops_per_s =
      Rate(2.0 * static_cast<double>(rows * kCols) * static_cast<double>(calls), seconds);
  // The prefill's compute floor is taken at the best rate MatMul reaches at prefill widths
  // (T = 64 activation rows; a chunk is up to 256) on cache-resident weights, over two row
  // lengths: this matrix (rows of 1024: tiles of 4 activations) and rows of 3072 (long rows:
  // tiles of 6). T = 16 on this matrix alone, the probe until 2026-12-06, read 148 GFLOP/s on
  // this machine where the same kernel ran the bench preset's prefill products at 190-220: a
  // floor taken at a peak that reads low flatters time ÷ floor.
  constexpr int64_t kRows = 64;
  constexpr int64_t kLongCols = 3072;
  const int64_t long_rows = 64 * int64_t{threads};
  K3_ASSIGN_OR_RETURN(AlignedBuffer lbuf, AlignedBuffer::Allocate(
                                              static_cast<size_t>(long_rows * kLongCols) * 2, 64));
  uint16_t* lw = reinterpret_cast<uint16_t*>(lbuf.data());
  for (int64_t i = 0; i < long_rows * kLongCols; ++i) lw[i] = w[i % (rows * kCols)];
  const kernels::Matrix long_m{kernels::WeightType::kBF16, long_rows, kLongCols, lw, nullptr};
  K3_RETURN_IF_ERROR(kernels::ValidateMatrix(long_m, "bandwidth probe matrix (long rows)"));
  const kernels::Matrix* shapes[] = {&m, &long_m};
  std::vector<float> xs(static_cast<size_t>(kRows * kLongCols), 0.25f);
  std::vector<float> ys(static_cast<size_t>(kRows * std::max(rows, long_rows)));
  for (const kernels::Matrix* s : shapes) kernels::MatMul(*s, xs.data(), kRows, ys.data());
  // A peak is the best rate seen: the best of 20 short windows, not the average of the whole
  // probe. A neighbour taking a core for part of it lowered the average (117-150 GFLOP/s within
  // an hour on this VM), and a floor taken at a low peak flatters the prefill's time ÷ floor.
  // The windows alternate between the shapes.
  const double window = o.seconds_per_probe / 40;
  double best = 0;
  int64_t windows = 0;
  const auto t1 = Clock::now();
  while (windows < 4 || Since(t1) < o.seconds_per_probe / 2) {
    const kernels::Matrix& s = *shapes[windows % 2];
    const double flops_per_call = 2.0 * static_cast<double>(s.rows * s.cols * kRows);
    int64_t mm_calls = 0;
    const auto w0 = Clock::now();
    while (mm_calls < 2 || Since(w0) < window) {
      kernels::MatMul(s, xs.data(), kRows, ys.data());
      ++mm_calls;
      sink = sink + ys[0];
    }
    best = std::max(best, Rate(flops_per_call * static_cast<double>(mm_calls), Since(w0)));
    ++windows;
  }
  b->kernel_matmul_flops_per_s = best;
  return Status::Ok();
}

}  // namespace

Result<Bandwidths> ProbeBandwidths(Env* env, const prepared::PreparedDir& p, const ProbeOptions& o) {
  K3_RETURN_IF_ERROR(ValidateOptions(o));
  Bandwidths b;
  const int threads = o.threads > 0 ? o.threads : kernels::Threads();
  K3_RETURN_IF_ERROR(ProbeMemory(o, threads, &b));
  K3_RETURN_IF_ERROR(ProbeKernel(o, threads, &b));
  {
    ExpertProbe experts(env, p, o);  // its buffer and files are released before the next probe
    K3_RETURN_IF_ERROR(experts.Run(&b));
  }
  K3_RETURN_IF_ERROR(ProbeTrunk(env, p, o, &b));
  K3_RETURN_IF_ERROR(ProbeCombined(env, p, o, &b));
  return b;
}

namespace {

// amount / rate, or 0 with `rate_name` recorded when the rate is needed but was not measured.
double Term(double amount, double rate, const char* rate_name, Floor* f) {
  if (!(amount > 0)) return 0;
  if (!(rate > 0) || !std::isfinite(rate)) {
    if (std::find(f->unmeasured.begin(), f->unmeasured.end(), rate_name) == f->unmeasured.end()) {
      f->unmeasured.emplace_back(rate_name);
    }
    return 0;
  }
  return amount / rate;
}

}  // namespace

PassWeights PassWeightBytes(const prepared::PreparedDir& p, int layers) {
  PassWeights w;
  for (const prepared::TrunkRun& t : p.manifest.runs) {
    if (t.layer < layers) w.weights_used += t.length;
  }
  if (const prepared::Region* lm = p.manifest.FindRegion(prepared::kLmHeadName)) {
    w.weights_used += lm->length;
  }
  for (const prepared::ExpertRecord& rec : p.experts.records) {
    w.expert_record = std::max<uint64_t>(w.expert_record, rec.length);
  }
  return w;
}

Floor ComputeFloor(const PerToken& t, const Bandwidths& b) {
  Floor f;
  f.disk_s = Term(t.trunk_bytes + t.lm_head_bytes + t.other_bytes, b.trunk_bytes_per_s,
                  "trunk_bytes_per_s", &f) +
             Term(t.expert_bytes, b.expert_bytes_per_s, "expert_bytes_per_s", &f);
  // The engine reads both kinds at once; when the disk serves them together faster than one
  // after the other, that is the bound.
  if (b.combined_bytes_per_s > 0 && t.expert_bytes > 0 &&
      t.trunk_bytes + t.lm_head_bytes > 0) {
    const double all = t.trunk_bytes + t.lm_head_bytes + t.other_bytes + t.expert_bytes;
    f.disk_s = std::min(f.disk_s, all / b.combined_bytes_per_s);
  }
  f.memory_s = Term(t.weight_bytes_used, b.memory_bytes_per_s, "memory_bytes_per_s", &f);
  f.compute_s = Term(2 * t.multiply_adds, b.kernel_flops_per_s, "kernel_flops_per_s", &f);
  f.floor_s = std::max({f.disk_s, f.memory_s, f.compute_s});
  if (f.floor_s > 0) {
    f.bound = f.floor_s == f.disk_s ? "disk" : f.floor_s == f.memory_s ? "memory" : "compute";
  }
  return f;
}

}  // namespace k3::run
