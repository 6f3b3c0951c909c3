#include "k3prep/download/download.h"

#include <sys/file.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <cstdio>
#include <ctime>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "common/log.h"
#include "common/parallel.h"
#include "formats/download_manifest.h"
#include "k3prep/download/http.h"
#include "k3prep/download/hub.h"
#include "k3prep/download/transfer.h"

namespace k3::download {
namespace {

std::string Parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

std::string NowRfc3339() {
  return dl::FormatRfc3339Utc(static_cast<int64_t>(std::time(nullptr)));
}

Status ValidateOptions(const DownloadOptions& o) {
  if (!IsValidRepoId(o.repo)) {
    return Status::Invalid("REPO '" + o.repo + "' is not a Hub repo id like 'org/name' "
                           "(letters, digits, '-', '_', '.')");
  }
  if (o.dest.empty()) return Status::Invalid("--dest: a download directory is required");
  if (o.revision.empty() || o.revision.size() > 256) {
    return Status::Invalid("--revision: must be a branch, tag or commit (1-256 characters)");
  }
  if (o.jobs < 1 || o.jobs > 64) return Status::Invalid("--jobs must be 1..64");
  if (o.stall_bytes_per_s < 1) return Status::Invalid("--stall-bytes-per-s must be >= 1");
  if (o.stall_seconds < 1) return Status::Invalid("--stall-seconds must be >= 1");
  if (o.retry_max < 0 || o.retry_max > 1000) return Status::Invalid("--retry-max must be 0..1000");
  if (o.backoff_base_ms < 0 || o.backoff_base_ms > 8000) {
    return Status::Invalid("--backoff-base-ms must be 0..8000 (waits are capped at 8 s)");
  }
  const std::string scheme = UrlScheme(o.endpoint);
  if (Origin(o.endpoint).empty() || (scheme != "https" && scheme != "http")) {
    return Status::Invalid("endpoint '" + RedactUrl(o.endpoint) +
                           "' (HF_ENDPOINT) is not an http(s) URL");
  }
  for (const std::string& g : o.includes) {
    if (g.empty()) return Status::Invalid("--include: empty pattern");
  }
  return Status::Ok();
}

// The manifest and its writer lock: workers record files as they finish.
class ManifestBook {
 public:
  ManifestBook(Env* env, std::string path, dl::DownloadManifest m)
      : env_(env), path_(std::move(path)), m_(std::move(m)) {}

  // Adds a verified file. The manifest on disk is rewritten at most once a second (each write
  // is a fsync'd atomic replace; 96 shards finishing together should not queue 96 of them);
  // the caller's final Write() makes everything durable. A file renamed into place but not yet
  // recorded when the process dies is hashed and adopted by the next run, never trusted blind.
  // `dir` received the file by rename: it is fsynced before the manifest next names the file
  // (one directory fsync per manifest write instead of one per file: each is a journal commit).
  Status Record(const std::string& path, uint64_t size, const std::string& sha256,
                const std::string& dir = "") {
    std::lock_guard<std::mutex> lock(mu_);
    if (!dir.empty()) dirs_to_sync_.insert(dir);
    Erase(path);
    m_.files.push_back({path, size, sha256, NowRfc3339()});
    const auto now = std::chrono::steady_clock::now();
    if (now - last_write_ < std::chrono::seconds(1)) {
      return Status::Ok();
    }
    return WriteLocked();
  }
  // Carries an entry of the previous manifest over (written by the next Write).
  void Keep(const dl::DownloadFile& f) {
    std::lock_guard<std::mutex> lock(mu_);
    Erase(f.path);
    m_.files.push_back(f);
  }
  void Forget(const std::string& path) {
    std::lock_guard<std::mutex> lock(mu_);
    Erase(path);
  }
  Status Write() {
    std::lock_guard<std::mutex> lock(mu_);
    return WriteLocked();
  }

 private:
  void Erase(const std::string& path) {
    m_.files.erase(std::remove_if(m_.files.begin(), m_.files.end(),
                                  [&](const dl::DownloadFile& f) { return f.path == path; }),
                   m_.files.end());
  }
  Status WriteLocked() {
    for (const std::string& d : dirs_to_sync_) K3_RETURN_IF_ERROR(env_->SyncDir(d));
    dirs_to_sync_.clear();
    last_write_ = std::chrono::steady_clock::now();
    std::sort(m_.files.begin(), m_.files.end(),
              [](const dl::DownloadFile& a, const dl::DownloadFile& b) { return a.path < b.path; });
    return dl::WriteDownloadManifest(env_, path_, m_);
  }

  Env* env_;
  std::string path_;
  std::mutex mu_;
  dl::DownloadManifest m_;
  std::chrono::steady_clock::time_point last_write_{};
  std::set<std::string> dirs_to_sync_;
};

// Finishing a verified .part (fsync, rename, record) waits on the disk for milliseconds per
// file; a small pool does it so transfer threads go straight on to their next file.
class Finisher {
 public:
  explicit Finisher(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
  }
  ~Finisher() { Drain(); }
  void Post(std::function<void()> job) {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
    cv_.notify_one();
  }
  // Runs every posted job, then stops the threads.
  void Drain() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  void Loop() {
    while (true) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

Status FsyncFile(Env* env, const std::string& path) {
  K3_ASSIGN_OR_RETURN(std::unique_ptr<File> f, env->Open(path, OpenMode::kRead));
  K3_RETURN_IF_ERROR(f->Sync());
  return f->Close();
}

// Trusted entries of an existing manifest: only those written for this repo and commit.
Result<dl::DownloadManifest> LoadPrevious(Env* env, const std::string& path,
                                          const std::string& repo, const std::string& commit) {
  dl::DownloadManifest empty;
  if (!env->Exists(path)) return empty;
  Result<dl::DownloadManifest> m = dl::LoadDownloadManifest(env, path);
  if (!m.ok()) {
    return m.status().WithContext("existing download manifest (fix or delete " + path +
                                  "; present files are then re-hashed, not re-downloaded)");
  }
  if (m->repo != repo || m->commit != commit) {
    LogInfo(path + " was written for " + m->repo + "@" + m->commit + "; files present in the "
            "directory are re-hashed against " + repo + "@" + commit);
    return empty;
  }
  return m;
}

std::string ShellQuote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789-_./=:@+,") == std::string::npos) {
    return s;
  }
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The command that continues this download at the same commit (the token is not part of it).
std::string ResumeCommand(const DownloadOptions& o, const std::string& commit) {
  std::string cmd = "k3prep download " + ShellQuote(o.repo) + " --dest " + ShellQuote(o.dest) +
                    " --revision " + commit;
  for (const std::string& g : o.includes) cmd += " --include " + ShellQuote(g);
  if (o.jobs != 4) cmd += " --jobs " + std::to_string(o.jobs);
  return cmd + " (with the same token source)";
}

HubContext MakeHubContext(const DownloadOptions& opts) {
  HubContext hub;
  hub.endpoint = opts.endpoint;
  while (!hub.endpoint.empty() && hub.endpoint.back() == '/') hub.endpoint.pop_back();
  hub.repo = opts.repo;
  hub.token = opts.token;
  hub.connect_timeout_s = opts.connect_timeout_s;
  hub.retry.retry_max = opts.retry_max;
  hub.retry.backoff_base_ms = opts.backoff_base_ms;
  hub.retry.wait = opts.wait_before_retry;
  return hub;
}

// One writer per DIR: two processes appending to the same .part would corrupt it (the
// Hub client's own flock lesson, ECOSYSTEM-NOTES §1.3). flock is advisory and a no-op on some
// network file systems; files that are not real descriptors (test Envs) are not locked.
Result<std::unique_ptr<File>> LockDest(Env* env, const DownloadOptions& opts,
                                       const std::string& lock_path) {
  K3_ASSIGN_OR_RETURN(std::unique_ptr<File> lock_file, env->Open(lock_path, OpenMode::kReadWrite));
  if (lock_file->fd() >= 0 && ::flock(lock_file->fd(), LOCK_EX | LOCK_NB) != 0) {
    return Status::Invalid("another k3prep download is writing " + opts.dest + " (it holds " +
                           lock_path + "); wait for it to finish or stop it, then run again");
  }
  return lock_file;
}

// The files still to fetch (indices into the selection) and the bytes they need.
struct Queue {
  std::vector<size_t> files;
  uint64_t need = 0;
};

// Plan: recorded → skip; present and matching → adopt; otherwise queue (moving bad bytes
// out of the final name first). Fills res->files' path, size and (skipped/adopted) kind.
Result<Queue> PlanQueue(Env* env, const DownloadOptions& opts, const std::vector<HubFile>& files,
                        const dl::DownloadManifest& previous, const std::string& partial,
                        ManifestBook* book, DownloadResult* result) {
  DownloadResult& res = *result;
  Queue q;
  std::vector<size_t>& queue = q.files;
  uint64_t& need = q.need;
  res.files.resize(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    const HubFile& f = files[i];
    FileOutcome& out = res.files[i];
    out.path = f.path;
    out.size = f.size;
    const std::string dst = JoinPath(opts.dest, f.path);
    const dl::DownloadFile* rec = previous.Find(f.path);
    if (env->Exists(dst)) {
      Result<uint64_t> size = env->FileSize(dst);
      if (rec != nullptr && size.ok() && *size == f.size && rec->size == f.size &&
          (!f.lfs() || rec->sha256 == f.sha256)) {
        out.kind = FileOutcome::Kind::kRecorded;
        continue;
      }
      bool matches = false;
      K3_ASSIGN_OR_RETURN(std::string sha,
                          HashLocalFile(env, dst, f, &matches, &res.bytes_read_local));
      if (matches) {
        K3_RETURN_IF_ERROR(book->Record(f.path, f.size, sha));
        out.kind = FileOutcome::Kind::kAdopted;
        LogInfo(f.path + ": already present and matching the published hash; adopted");
        continue;
      }
      const std::string aside = JoinPath(partial, f.path) + ".replaced";
      K3_RETURN_IF_ERROR(env->MakeDirs(Parent(aside)));
      K3_RETURN_IF_ERROR(env->Rename(dst, aside));
      LogWarn(f.path + ": the file in " + opts.dest + " does not match the published hash; "
              "moved to " + aside + " and downloading it again");
    }
    book->Forget(f.path);
    uint64_t have = 0;
    Result<uint64_t> part_size = env->FileSize(JoinPath(partial, f.path) + ".part");
    if (part_size.ok()) have = std::min(*part_size, f.size);
    need += f.size - have;  // cannot wrap: SelectFiles checked that the sizes' sum fits
    queue.push_back(i);
  }
  return q;
}

Status CheckFreeSpace(Env* env, const DownloadOptions& opts, const Queue& q) {
  if (q.need == 0) return Status::Ok();
  K3_ASSIGN_OR_RETURN(uint64_t free_bytes, env->FreeSpace(opts.dest));
  if (free_bytes < q.need) {
    return Status::Io("not enough disk in " + opts.dest + ": " + std::to_string(q.files.size()) +
                      " files still need " + std::to_string(q.need) + " bytes (" +
                      FormatIecBytes(static_cast<double>(q.need)) + "), " +
                      std::to_string(free_bytes) + " bytes are free; free space or choose "
                      "another --dest");
  }
  return Status::Ok();
}

// The queued transfers on --jobs workers (common/parallel.h), with the progress status and the
// finisher that fsyncs, renames and records each verified file.
class QueueRun {
 public:
  QueueRun(Env* env, const DownloadOptions& opts, const TransferSettings& ts,
           const std::vector<HubFile>& files, const Queue& queue, const std::string& partial,
           ManifestBook* book, DownloadResult* res)
      : env_(env), opts_(opts), ts_(ts), files_(files), queue_(queue.files), partial_(partial),
        book_(book), res_(res), progress_("download", queue.need, opts.progress),
        plain_(progress_.mode() == ProgressMode::kPlain),
        slots_(ParallelWorkers(queue_.size(), opts.jobs)) {}

  // Transfers every queued file; each file's outcome lands in res->files.
  Status Run(std::mt19937_64& rng) {
    UpdateStatus();
    std::vector<std::unique_ptr<Worker>> workers;
    for (size_t w = 0; w < slots_.size(); ++w) workers.push_back(MakeWorker(w, rng()));
    ParallelFor(queue_.size(), opts_.jobs,
                [&](size_t q, size_t w) { TransferOne(q, *workers[w], slots_[w]); });
    finisher_.Drain();
    progress_.Finish();
    K3_RETURN_IF_ERROR(book_->Write());
    res_->bytes_fetched = fetched_.load();
    return Status::Ok();
  }

 private:
  // The file a worker is on, for the per-file part of the progress status.
  struct Slot {
    std::string path;  // guarded by mu_; empty when idle
    uint64_t size = 0;
    std::atomic<uint64_t> done{0};
  };
  // Per transfer worker: its connection, random stream (retry jitter) and progress callbacks.
  struct Worker {
    HttpClient client;
    std::mt19937_64 rng;
    TransferObserver obs;
    std::chrono::steady_clock::time_point last_status = std::chrono::steady_clock::now();
  };

  std::unique_ptr<Worker> MakeWorker(size_t w, uint64_t seed) {
    auto wk = std::make_unique<Worker>();
    wk->rng.seed(seed);
    Worker* self = wk.get();
    Slot* slot = &slots_[w];
    wk->obs.on_bytes = [this, self, slot](uint64_t n) {
      progress_.Add(n);
      fetched_ += n;
      slot->done += n;
      const auto now = std::chrono::steady_clock::now();
      if (now - self->last_status > std::chrono::milliseconds(250)) {
        self->last_status = now;
        UpdateStatus();
      }
    };
    wk->obs.on_note = [this](const std::string& what) {
      if (what == "stall") ++stalls_;
      if (what == "retry") ++retries_;
      UpdateStatus();
    };
    return wk;
  }

  void UpdateStatus() {
    std::string text = std::to_string(done_files_.load()) + "/" + std::to_string(queue_.size()) +
                       " files, " + std::to_string(retries_.load()) + " retries, " +
                       std::to_string(stalls_.load()) + " stalls";
    std::string active;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const Slot& sl : slots_) {
        if (sl.path.empty() || sl.size == 0) continue;
        const int pct = static_cast<int>(100.0 * static_cast<double>(sl.done.load()) /
                                         static_cast<double>(sl.size));
        // A log line can name the files; a terminal bar has room for percentages only.
        active += (active.empty() ? "" : plain_ ? ", " : " ") +
                  (plain_ ? sl.path + " " : std::string()) + std::to_string(pct) + "%";
      }
    }
    if (!active.empty()) text += plain_ ? "; active: " + active : " [" + active + "]";
    progress_.SetStatus(text);
  }

  // Records a file's outcome (any thread).
  void Conclude(size_t q, const TransferStats& st, const Status& s) {
    const HubFile& f = files_[queue_[q]];
    {
      std::lock_guard<std::mutex> lock(mu_);
      FileOutcome& out = res_->files[queue_[q]];
      out.retries = st.retries;
      out.stalls = st.stalls;
      out.restarts = st.restarts;
      out.resumed_from = st.resumed_from;
      res_->bytes_read_local += st.prefix_bytes_read;
      out.kind = s.ok() ? FileOutcome::Kind::kDownloaded : FileOutcome::Kind::kFailed;
      if (!s.ok()) {
        out.error = s.message();
        out.error_code = s.code();
      }
    }
    if (!s.ok()) {
      LogError(s.message());
    } else if (plain_) {
      LogInfo("downloaded " + f.path + " (" + FormatIecBytes(static_cast<double>(f.size)) +
              (st.retries > 0 ? ", " + std::to_string(st.retries) + " retries" : "") + ")");
    }
    ++done_files_;
    UpdateStatus();
  }

  void TransferOne(size_t q, Worker& wk, Slot& slot) {
    const HubFile& f = files_[queue_[q]];
    const std::string part = JoinPath(partial_, f.path) + ".part";
    const std::string dst = JoinPath(opts_.dest, f.path);
    TransferStats st;
    {
      std::lock_guard<std::mutex> lock(mu_);
      slot.path = f.path;
      slot.size = f.size;
      Result<uint64_t> have = env_->FileSize(part);
      slot.done = have.ok() ? std::min(*have, f.size) : 0;
    }
    Result<std::string> sha = TransferFile(env_, wk.client, ts_, f, part, wk.obs, wk.rng, &st);
    {
      std::lock_guard<std::mutex> lock(mu_);
      slot.path.clear();
    }
    if (!sha.ok()) {
      Conclude(q, st, sha.status());
      return;
    }
    // fsync → rename → record, in that order, on the finisher.
    finisher_.Post([this, q, st, part, dst, digest = *sha] {
      const HubFile& ff = files_[queue_[q]];
      Status s = FsyncFile(env_, part);
      if (s.ok()) s = env_->MakeDirs(Parent(dst));
      if (s.ok()) s = env_->Rename(part, dst);
      if (s.ok()) s = book_->Record(ff.path, ff.size, digest, Parent(dst));
      Conclude(q, st, s);
    });
  }

  Env* env_;
  const DownloadOptions& opts_;
  const TransferSettings& ts_;
  const std::vector<HubFile>& files_;
  const std::vector<size_t>& queue_;
  const std::string& partial_;
  ManifestBook* book_;
  DownloadResult* res_;
  Progress progress_;
  const bool plain_;
  std::mutex mu_;  // res_->files, res_->bytes_read_local and the slots' paths
  std::vector<Slot> slots_;
  std::atomic<int> done_files_{0}, retries_{0}, stalls_{0};
  std::atomic<uint64_t> fetched_{0};
  Finisher finisher_{2};
};

// The run's exit: Ok (lock and empty .k3-partial removed) when every file arrived, else the
// worst failure (kIntegrity over kInvalid over kIo) with the files left and how to resume.
Status Outcome(Env* env, const DownloadOptions& opts, const std::string& commit,
               const std::string& partial, const std::string& lock_path, File* lock_file,
               const DownloadResult& res) {
  std::vector<std::string> failed;
  Code worst = Code::kOk;
  for (const FileOutcome& o : res.files) {
    if (o.kind != FileOutcome::Kind::kFailed) continue;
    failed.push_back(o.path);
    const Code c = o.error_code;
    if (c == Code::kIntegrity || (c == Code::kInvalid && worst != Code::kIntegrity) ||
        worst == Code::kOk) {
      worst = c;
    }
  }
  if (failed.empty()) {
    (void)lock_file->Close();
    (void)env->Remove(lock_path);
    (void)env->Remove(partial);  // only succeeds when empty: .part.bad/.replaced stay
    return Status::Ok();
  }
  std::string list;
  for (size_t i = 0; i < failed.size() && i < 10; ++i) list += (i ? ", " : "") + failed[i];
  if (failed.size() > 10) list += ", …";
  std::string msg = std::to_string(failed.size()) + " of " + std::to_string(res.files.size()) +
                    " files not downloaded (" + list + "); see the errors above";
  if (worst == Code::kIntegrity) {
    msg += "; files whose bytes did not match their published hash are kept as " +
           partial + "/NAME.part.bad";
  }
  msg += "; to resume, run: " +
         (opts.resume_command.empty() ? ResumeCommand(opts, commit) : opts.resume_command);
  switch (worst) {
    case Code::kIntegrity: return Status::Integrity(msg);
    case Code::kInvalid: return Status::Invalid(msg);
    default: return Status::Io(msg);
  }
}

}  // namespace

Status RunDownload(Env* env, const DownloadOptions& opts, DownloadResult* result) {
  DownloadResult local;
  DownloadResult& res = result != nullptr ? *result : local;
  res = DownloadResult{};
  const auto t0 = std::chrono::steady_clock::now();
  K3_RETURN_IF_ERROR(ValidateOptions(opts));

  // The commit and the files selected at it.
  const HubContext hub = MakeHubContext(opts);
  std::mt19937_64 rng(std::random_device{}());
  HttpClient http;
  K3_ASSIGN_OR_RETURN(std::string commit, ResolveCommit(http, hub, opts.revision, rng));
  res.commit = commit;
  LogInfo("resolved " + opts.repo + "@" + opts.revision + " to commit " + commit);
  K3_ASSIGN_OR_RETURN(std::vector<HubFile> listed, ListTree(http, hub, commit, rng));
  K3_ASSIGN_OR_RETURN(std::vector<HubFile> files,
                      SelectFiles(listed, opts.includes, opts.repo, commit));

  // DIR, locked, and what it already holds.
  K3_RETURN_IF_ERROR(env->MakeDirs(opts.dest));
  const std::string partial = JoinPath(opts.dest, kPartialDir);
  K3_RETURN_IF_ERROR(env->MakeDirs(partial));
  const std::string lock_path = JoinPath(partial, "lock");
  K3_ASSIGN_OR_RETURN(std::unique_ptr<File> lock_file, LockDest(env, opts, lock_path));
  const std::string manifest_path = JoinPath(opts.dest, std::string(dl::kFileName));
  K3_ASSIGN_OR_RETURN(dl::DownloadManifest previous,
                      LoadPrevious(env, manifest_path, opts.repo, commit));
  dl::DownloadManifest start;
  start.repo = opts.repo;
  start.commit = commit;
  // Never the credentials of an HF_ENDPOINT like https://user:password@mirror/: the manifest is
  // shared and read by other tools; it records where the bytes came from, not how to log in.
  start.endpoint = WithoutUserinfo(hub.endpoint);
  ManifestBook book(env, manifest_path, start);
  for (const dl::DownloadFile& e : previous.files) {
    if (env->Exists(JoinPath(opts.dest, e.path))) book.Keep(e);
  }

  // What to fetch, then fetch it.
  K3_ASSIGN_OR_RETURN(const Queue queue,
                      PlanQueue(env, opts, files, previous, partial, &book, &res));
  K3_RETURN_IF_ERROR(book.Write());
  K3_RETURN_IF_ERROR(CheckFreeSpace(env, opts, queue));
  LogInfo(std::to_string(files.size()) + " files selected, " +
          std::to_string(queue.files.size()) + " to download (" +
          FormatIecBytes(static_cast<double>(queue.need)) + ")");
  TransferSettings ts;
  ts.hub = hub;
  ts.commit = commit;
  ts.stall_bytes_per_s = opts.stall_bytes_per_s;
  ts.stall_seconds = opts.stall_seconds;
  K3_RETURN_IF_ERROR(QueueRun(env, opts, ts, files, queue, partial, &book, &res).Run(rng));
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Outcome(env, opts, commit, partial, lock_path, lock_file.get(), res);
}

std::string FormatDownloadTable(const DownloadResult& r) {
  std::string out;
  char line[512];
  for (const FileOutcome& o : r.files) {
    const char* kind = o.kind == FileOutcome::Kind::kRecorded     ? "recorded"
                       : o.kind == FileOutcome::Kind::kAdopted    ? "adopted"
                       : o.kind == FileOutcome::Kind::kDownloaded ? "downloaded"
                                                                  : "FAILED";
    std::snprintf(line, sizeof line, "  %-44s %12s  %-10s retries %d stalls %d%s\n",
                  o.path.c_str(), FormatIecBytes(static_cast<double>(o.size)).c_str(), kind,
                  o.retries, o.stalls,
                  o.resumed_from > 0 ? (" resumed@" + std::to_string(o.resumed_from)).c_str()
                                     : "");
    out += line;
  }
  const double mbps = r.seconds > 0 ? static_cast<double>(r.bytes_fetched) / 1e6 / r.seconds : 0;
  std::snprintf(line, sizeof line,
                "  fetched %s in %.1f s (%.1f MB/s), read back from disk %s, commit %s\n",
                FormatIecBytes(static_cast<double>(r.bytes_fetched)).c_str(), r.seconds, mbps,
                FormatIecBytes(static_cast<double>(r.bytes_read_local)).c_str(),
                r.commit.c_str());
  out += line;
  return out;
}

}  // namespace k3::download
