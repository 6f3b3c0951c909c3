// Disk checks and the random-read probe (see k3prep/doctor/probe.h).
#include "k3prep/doctor/probe.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>

#include "common/align.h"
#include "common/aligned_buffer.h"
#include "common/direct_reader.h"
#include "common/progress.h"

namespace k3::prep {
namespace {

constexpr uint64_t kBlock = 4096;                   // the largest logical block size in use
constexpr uint64_t kWriteChunk = uint64_t{8} << 20;  // scratch file written in these pieces


std::string ScratchPath(const std::string& dir, const char* what) {
  return JoinPath(dir, std::string(kScratchPrefix) + what + "-" + std::to_string(::getpid()) +
                           ".k3tmp");
}

// ---------------------------------------------------------------------------------------------
// Ctrl-C: the handler only records the signal; the probe loops poll it, unwind (removing the
// scratch file) and the guard's destructor re-raises with the previous disposition restored.

volatile sig_atomic_t g_signal = 0;
extern "C" void RecordSignal(int signo) { g_signal = signo; }

class InterruptGuard {
 public:
  InterruptGuard() {
    g_signal = 0;
    for (size_t i = 0; i < kSignals.size(); ++i) {
      struct sigaction sa {};
      sa.sa_handler = RecordSignal;
      sigemptyset(&sa.sa_mask);
      installed_[i] = ::sigaction(kSignals[i], nullptr, &old_[i]) == 0 &&
                      old_[i].sa_handler != SIG_IGN &&  // nohup: stay ignored
                      ::sigaction(kSignals[i], &sa, nullptr) == 0;
    }
  }
  ~InterruptGuard() {
    for (size_t i = 0; i < kSignals.size(); ++i) {
      if (installed_[i]) ::sigaction(kSignals[i], &old_[i], nullptr);
    }
    if (g_signal != 0) ::raise(g_signal);
  }
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

  static Status Check(const std::string& path) {
    if (g_signal == 0) return Status::Ok();
    return Status::Io(std::string("interrupted by ") + strsignal(g_signal) + "; removed " + path);
  }

 private:
  static constexpr std::array<int, 3> kSignals = {SIGINT, SIGTERM, SIGHUP};
  std::array<struct sigaction, 3> old_{};
  std::array<bool, 3> installed_{};
};

// Removes `path` when it goes out of scope (declare it before the File so the File closes
// first). Removal failures are ignored: the file is a scratch file and the error that led here
// is the one to report.
class ScratchFile {
 public:
  ScratchFile(Env* env, std::string path) : env_(env), path_(std::move(path)) {}
  ~ScratchFile() {
    if (env_->Exists(path_)) (void)env_->Remove(path_);
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  Env* env_;
  std::string path_;
};

// Fills with splitmix64 output so compressing or deduplicating file systems cannot shortcut.
void FillRandom(uint8_t* p, size_t n, uint64_t seed) {
  uint64_t x = seed;
  for (size_t i = 0; i < n; i += 8) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    std::memcpy(p + i, &z, std::min<size_t>(8, n - i));
  }
}

// One aligned block written with O_DIRECT and read back (the file is already created).
Status DirectRoundTrip(Env* env, const std::string& path, File* file, uint32_t* alignment) {
  K3_RETURN_IF_ERROR(file->SetDirect(true));
  *alignment = env->DirectAlignment(path);
  const uint64_t block = std::max<uint64_t>(kBlock, *alignment);
  K3_ASSIGN_OR_RETURN(AlignedBuffer out, AlignedBuffer::Allocate(block, block));
  K3_ASSIGN_OR_RETURN(AlignedBuffer in, AlignedBuffer::Allocate(block, block));
  FillRandom(out.data(), block, 1);
  K3_RETURN_IF_ERROR(file->WriteExact(0, out.data(), block));
  K3_RETURN_IF_ERROR(file->ReadExact(0, block, in.data()));
  if (std::memcmp(in.data(), out.data(), block) != 0) {
    return Status::Io(path + ": an O_DIRECT block read back differs from what was written");
  }
  return Status::Ok();
}

}  // namespace

WritableReport CheckWritable(Env* env, const std::string& dir) {
  WritableReport r;
  ScratchFile scratch(env, ScratchPath(dir, "check"));
  Status s = [&]() -> Status {
    K3_ASSIGN_OR_RETURN(std::unique_ptr<File> f, env->Open(scratch.path(), OpenMode::kCreate));
    char block[kBlock] = {};
    K3_RETURN_IF_ERROR(f->WriteExact(0, block, sizeof block));
    return f->Close();
  }();
  r.writable = s.ok();
  if (!s.ok()) r.reason = s.message();
  return r;
}

DirectIoReport CheckDirectIo(Env* env, const std::string& dir) {
  DirectIoReport r;
  ScratchFile scratch(env, ScratchPath(dir, "direct"));
  Status s = [&]() -> Status {
    K3_ASSIGN_OR_RETURN(std::unique_ptr<File> f, env->Open(scratch.path(), OpenMode::kReadWrite));
    K3_RETURN_IF_ERROR(DirectRoundTrip(env, scratch.path(), f.get(), &r.alignment));
    return f->Close();
  }();
  r.available = s.ok();
  if (!s.ok()) r.reason = s.message();
  return r;
}

Result<ProbeReport> RunDiskProbe(Env* env, const ProbeOptions& o) {
  ProbeReport report;
  const uint64_t file_bytes = std::max(kBlock, o.file_bytes / kBlock * kBlock);
  K3_ASSIGN_OR_RETURN(uint64_t free_bytes, env->FreeSpace(o.dir));
  if (free_bytes < file_bytes + kProbeFreeMargin) {
    const uint64_t fits = free_bytes > kProbeFreeMargin + (uint64_t{1} << 20)
                              ? (free_bytes - kProbeFreeMargin) >> 20
                              : 0;
    return Status::Io(
        "read probe refused: " + o.dir + " has " + FormatIecBytes(double(free_bytes)) +
        " free, the probe needs its scratch file (" + FormatIecBytes(double(file_bytes)) +
        ") + 1 GB to spare; " +
        (fits > 0 ? "pass --probe-mb " + std::to_string(fits) + " or less"
                  : std::string("free some space first")));
  }
  report.file_bytes = file_bytes;
  report.read_bytes = std::min(o.read_bytes, file_bytes);

  InterruptGuard interrupt;  // destroyed last: re-raises after the scratch file is gone
  ScratchFile scratch(env, ScratchPath(o.dir, "probe"));
  const std::string& path = scratch.path();
  auto ctx = [&](const Status& s) { return s.WithContext("read probe (" + path + ")"); };

  // 1. Write the scratch file once, sequentially, with O_DIRECT (the page cache never holds it).
  {
    Result<std::unique_ptr<File>> opened = env->Open(path, OpenMode::kCreate);
    if (!opened.ok()) return ctx(opened.status());
    std::unique_ptr<File> f = std::move(opened).value();
    if (o.require_direct) {
      Status d = f->SetDirect(true);
      if (!d.ok()) return ctx(d);
    }
    const uint64_t chunk = std::min(kWriteChunk, file_bytes);
    Result<AlignedBuffer> buf = AlignedBuffer::Allocate(chunk, kBlock);
    if (!buf.ok()) return ctx(buf.status());
    FillRandom(buf->data(), chunk, o.seed);
    const auto t0 = std::chrono::steady_clock::now();
    for (uint64_t off = 0; off < file_bytes; off += chunk) {
      // A different first word in each chunk: no two chunks are identical (deduplication).
      std::memcpy(buf->data(), &off, sizeof off);
      const uint64_t n = std::min(chunk, file_bytes - off);
      Status s = f->WriteExact(off, buf->data(), n);
      if (s.ok()) s = InterruptGuard::Check(path);
      if (!s.ok()) return ctx(s);
    }
    Status s = f->Sync();
    if (s.ok()) s = f->Close();
    if (!s.ok()) return ctx(s);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    report.write_mb_per_s = secs > 0 ? double(file_bytes) / 1e6 / secs : 0;
  }

  // 2. Random reads of read_bytes at 4 KiB-aligned offsets, one batch of `depth` at a time (the
  //    way k3run issues a layer's experts), for seconds_per_depth each.
  Result<std::unique_ptr<File>> opened = env->Open(path, OpenMode::kReadDirect);
  if (!opened.ok()) return ctx(opened.status());
  std::unique_ptr<File> f = std::move(opened).value();
  if (o.require_direct && !f->direct()) {
    return ctx(Status::Io("the file system accepted O_DIRECT for writing but not for reading"));
  }
  const uint32_t alignment = env->DirectAlignment(path);
  const uint64_t step = std::max<uint64_t>(kBlock, alignment);
  const uint64_t slots = (file_bytes - report.read_bytes) / step + 1;
  const uint64_t stride = AlignUp(report.read_bytes, step);
  std::mt19937_64 rng(o.seed);
  for (int depth : o.queue_depths) {
    std::unique_ptr<BatchReader> reader =
        BatchReader::Create(depth, o.force_pread, std::max<uint32_t>(alignment, 1));
    report.backend = std::string(reader->backend());
    Result<AlignedBuffer> buf = AlignedBuffer::Allocate(stride * uint64_t(depth), step);
    if (!buf.ok()) return ctx(buf.status());
    std::vector<ReadRequest> requests(static_cast<size_t>(depth));
    DepthResult d;
    d.queue_depth = depth;
    const auto t0 = std::chrono::steady_clock::now();
    do {
      for (size_t i = 0; i < requests.size(); ++i) {
        requests[i].file = f.get();
        requests[i].offset = (rng() % slots) * step;
        requests[i].length = report.read_bytes;
        requests[i].dst = buf->data() + i * stride;
      }
      Status s = reader->ReadAll(requests);
      if (s.ok()) s = InterruptGuard::Check(path);
      if (!s.ok()) return ctx(s);
      d.reads += requests.size();
      d.bytes += requests.size() * report.read_bytes;
      d.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (d.seconds < o.seconds_per_depth);
    report.depths.push_back(d);
  }
  return report;
}

std::vector<std::string> LeftoverScratchFiles(Env* env, const std::string& dir) {
  std::vector<std::string> found;
  Result<std::vector<DirEntry>> entries = env->ListDir(dir);
  if (!entries.ok()) return found;
  for (const DirEntry& e : *entries) {
    if (!e.is_dir && e.name.rfind(kScratchPrefix, 0) == 0) found.push_back(JoinPath(dir, e.name));
  }
  return found;
}

}  // namespace k3::prep
