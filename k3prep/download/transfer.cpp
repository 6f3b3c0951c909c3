#include "k3prep/download/transfer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/log.h"
#include "common/printable.h"
#include "k3prep/download/part_writer.h"

namespace k3::download {
namespace {

// libcurl's receive buffer for bodies. Its 16 KiB default costs a poll + recv per 16 KiB;
// 512 KiB cuts those syscalls 32-fold (libcurl still calls the sink per 16 KiB, which is cheap).
constexpr long kReceiveBuffer = 512L << 10;
// A slow transfer still reaches the .part every half second, so a kill loses little.
constexpr double kFlushSeconds = 0.5;
constexpr size_t kReadChunk = 8u << 20;
constexpr int kMaxRedirectHops = 5;

std::string StripEtag(std::string e) {
  if (e.rfind("W/", 0) == 0) e = e.substr(2);
  if (e.size() >= 2 && e.front() == '"' && e.back() == '"') e = e.substr(1, e.size() - 2);
  return e;
}

std::string Parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

// "bytes S-E/T" → S and T; false when malformed. "*" totals are not accepted here.
bool ParseContentRange(const std::string& v, uint64_t* start, uint64_t* total) {
  unsigned long long s = 0, e = 0, t = 0;
  char tail = 0;
  if (std::sscanf(v.c_str(), "bytes %llu-%llu/%llu%c", &s, &e, &t, &tail) != 3) return false;
  if (e < s || e >= t) return false;
  *start = s;
  *total = t;
  return true;
}

// Where the bytes of a file come from, as the resolve HEAD said.
struct Source {
  std::string url;
  bool send_token = false;
};

enum class Verdict { kOk, kRetry, kFatal };

struct Step {
  Verdict verdict = Verdict::kOk;
  Status status;                // kFatal
  std::string why;              // kRetry: last error, for the give-up message
  std::optional<double> wait;   // kRetry: server-requested wait
};

Step Retry(std::string why, std::optional<double> wait = std::nullopt) {
  Step s;
  s.verdict = Verdict::kRetry;
  s.why = std::move(why);
  s.wait = wait;
  return s;
}
Step Fatal(Status st) {
  Step s;
  s.verdict = Verdict::kFatal;
  s.status = std::move(st);
  return s;
}

// HEAD {endpoint}/{repo}/resolve/{commit}/{path}, with the token, not following the CDN
// redirect; checks what the Hub says about the file against the listing.
Step ResolveSource(HttpClient& http, const TransferSettings& ts, const HubFile& f, Source* out) {
  std::string url = ResolveUrl(ts.hub, ts.commit, f.path);
  for (int hop = 0; hop <= kMaxRedirectHops; ++hop) {
    HttpRequest req;
    req.method = "HEAD";
    req.url = url;
    if (SameOrigin(url, ts.hub.endpoint)) req.bearer_token = ts.hub.token;
    req.connect_timeout_s = ts.hub.connect_timeout_s;
    Result<HttpResponse> r = http.Perform(req);
    if (!r.ok()) return Fatal(r.status());
    const HttpResponse& resp = *r;
    if (resp.curl_code != 0) {
      if (IsRetryableCurl(resp.curl_code)) return Retry("resolve: " + resp.curl_error);
      return Fatal(Status::Io(f.path + ": resolve " + RedactUrl(url) + " failed: " +
                              resp.curl_error));
    }
    const long st = resp.status;
    if (st == 401 || st == 403) {
      return Fatal(Status::Invalid("token missing or without access to " + ts.hub.repo +
                                   " (HTTP " + std::to_string(st) + " resolving " + f.path +
                                   "): set HF_TOKEN, HF_TOKEN_PATH or --token-file"));
    }
    if (IsRetryableStatus(st)) {
      return Retry("resolve: HTTP " + std::to_string(st), ServerWaitSeconds(resp));
    }
    const std::string commit = resp.Header("x-repo-commit");
    if (!commit.empty() && commit != ts.commit) {
      return Fatal(Status::Invalid(f.path + ": the Hub resolved it at commit " + Printable(commit) +
                                   ", not the pinned " + ts.commit));
    }
    const std::string location = resp.Header("location");
    const std::string linked_size = resp.Header("x-linked-size");
    if (st >= 300 && st < 400 && !location.empty() && linked_size.empty() && location[0] == '/') {
      url = ResolveLocation(url, location);  // a relative redirect: repo renamed; follow it
      // "//host/x" is relative too, and may name another host; the scheme rule still applies.
      if (Status s = CheckFollowTarget(ts.hub.endpoint, url, f.path + ": resolve"); !s.ok()) {
        return Fatal(s);
      }
      continue;
    }
    const bool redirect = st >= 300 && st < 400 && !location.empty();
    if (!redirect && st != 200) {
      return Fatal(Status::Io(f.path + ": resolve " + RedactUrl(url) + " answered HTTP " +
                              std::to_string(st)));
    }
    // The size and etag the Hub publishes for this request must be the listing's.
    const std::string size_text = redirect ? linked_size
                                           : (linked_size.empty() ? resp.Header("content-length")
                                                                  : linked_size);
    if (size_text.empty() && f.lfs()) {
      return Fatal(Status::Invalid(f.path + ": resolve answer has no X-Linked-Size"));
    }
    if (!size_text.empty()) {
      char* end = nullptr;
      const unsigned long long size = std::strtoull(size_text.c_str(), &end, 10);
      if (end == size_text.c_str() || *end != 0 || size != f.size) {
        return Fatal(Status::Integrity(
            f.path + ": the Hub's resolve answer says " +
            std::string(redirect ? "X-Linked-Size" : "Content-Length") + " " +
            Printable(size_text) + " but the tree listing at " + ts.commit + " says " +
            std::to_string(f.size) +
            " bytes; nothing downloaded (a proxy may be rewriting answers, or the repo is "
            "inconsistent: report it to the repo owner)"));
      }
    }
    const std::string etag = StripEtag(
        resp.Header("x-linked-etag").empty() ? resp.Header("etag") : resp.Header("x-linked-etag"));
    const std::string want = f.lfs() ? f.sha256 : f.git_oid;
    if (!etag.empty() && etag != want) {
      return Fatal(Status::Integrity(f.path + ": the Hub's resolve answer has etag " +
                                     Printable(etag) + " but the tree listing says " + want +
                                     "; nothing downloaded"));
    }
    if (redirect) {
      out->url = ResolveLocation(url, location);
      if (out->url.empty()) {
        return Fatal(Status::Invalid(f.path + ": unusable redirect Location from the Hub (" +
                                     RedactUrl(location) + ")"));
      }
      // libcurl refuses other schemes anyway (CURLOPT_PROTOCOLS_STR); this names the file.
      if (Status s = CheckFollowTarget(ts.hub.endpoint, out->url, f.path); !s.ok()) {
        return Fatal(s);
      }
    } else {
      out->url = url;
    }
    // The token goes to the endpoint's origin only, never to a CDN.
    out->send_token = SameOrigin(out->url, ts.hub.endpoint);
    return Step{};
  }
  return Fatal(Status::Invalid(f.path + ": more than " + std::to_string(kMaxRedirectHops) +
                               " relative redirects resolving it"));
}

// Per-exchange state of the body sink.
struct Sink {
  PartWriter* writer = nullptr;
  uint64_t* offset = nullptr;  // bytes in the .part (written + pending in the writer)
  ContentHasher* hasher = nullptr;
  const TransferObserver* observer = nullptr;
  uint64_t expected_size = 0;
  bool decided = false;
  bool accept = false;
  bool restart = false;  // 200 to a Range request, or a Content-Range not starting at offset
  std::string restart_why;
  std::chrono::steady_clock::time_point last_flush = std::chrono::steady_clock::now();
  Status error;            // local write failure
  uint64_t arrived = 0;

  Status Flush() {
    last_flush = std::chrono::steady_clock::now();
    return writer->Flush();
  }

  bool OnBytes(const HttpResponse& resp, const char* data, size_t n) {
    if (!decided) {
      decided = true;
      if (resp.status == 206) {
        uint64_t start = 0, total = 0;
        if (!ParseContentRange(resp.Header("content-range"), &start, &total) ||
            start != *offset || total != expected_size) {
          restart = true;
          restart_why = "206 with Content-Range '" + Printable(resp.Header("content-range")) +
                        "' for a request from byte " + std::to_string(*offset);
          return false;
        }
        accept = true;
      } else if (resp.status == 200) {
        if (*offset != 0) {
          restart = true;
          restart_why = "the server answered 200 (whole file) to a Range request from byte " +
                        std::to_string(*offset);
          return false;
        }
        accept = true;
      }
      writer->Reset(*offset);
    }
    if (!accept) return true;  // an error body: read and dropped, never written
    if (*offset + n > expected_size) {
      restart = true;
      restart_why = "the server sent more bytes than the listed size";
      return false;
    }
    hasher->Update(data, n);
    error = writer->Append(data, n);
    if (!error.ok()) return false;
    *offset += n;
    arrived += n;
    if (observer->on_bytes) observer->on_bytes(n);
    if (writer->pending() > 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - last_flush).count() >
            kFlushSeconds) {
      error = Flush();
      if (!error.ok()) return false;
    }
    return true;
  }
};

}  // namespace

ContentHasher::ContentHasher(uint64_t size, bool git_sha1) {
  if (git_sha1) {
    sha1_ = std::make_unique<Sha1Stream>();
    const std::string header = "blob " + std::to_string(size) + std::string(1, '\0');
    sha1_->Update(header.data(), header.size());
  }
}

void ContentHasher::Update(const void* data, size_t n) {
  sha256_.Update(data, n);
  if (sha1_ != nullptr) sha1_->Update(data, n);
}

std::string ContentHasher::Sha256Hex() { return sha256_.HexDigest(); }

std::string ContentHasher::GitSha1Hex() { return sha1_ != nullptr ? sha1_->HexDigest() : ""; }

bool DigestsMatch(const HubFile& f, uint64_t size, const std::string& sha256,
                  const std::string& git_sha1) {
  if (size != f.size) return false;
  return f.lfs() ? sha256 == f.sha256 : git_sha1 == f.git_oid;
}

Result<std::string> HashLocalFile(Env* env, const std::string& path, const HubFile& f,
                                  bool* matches, uint64_t* bytes_read) {
  K3_ASSIGN_OR_RETURN(std::unique_ptr<File> file, env->Open(path, OpenMode::kRead));
  K3_ASSIGN_OR_RETURN(uint64_t size, file->Size());
  ContentHasher h(size, !f.lfs());
  std::vector<char> buf(kReadChunk);
  for (uint64_t off = 0; off < size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - off));
    K3_RETURN_IF_ERROR(file->ReadExact(off, n, buf.data()));
    h.Update(buf.data(), n);
    off += n;
    *bytes_read += n;
  }
  const std::string sha = h.Sha256Hex();
  *matches = DigestsMatch(f, size, sha, h.GitSha1Hex());
  return sha;
}

namespace {

// One file's transfer: the .part, its writer and hash state, and the retry bookkeeping.
class Transfer {
 public:
  Transfer(Env* env, HttpClient& http, const TransferSettings& ts, const HubFile& f,
           const std::string& part_path, const TransferObserver& observer, std::mt19937_64& rng,
           TransferStats* stats)
      : env_(env), http_(http), ts_(ts), f_(f), part_path_(part_path), observer_(observer),
        rng_(rng), stats_(stats) {}

  // Opens the .part (a longer one than the listed size starts over) and hashes the prefix a
  // previous run left, once; later bytes are hashed as they arrive.
  Status Open() {
    K3_RETURN_IF_ERROR(env_->MakeDirs(Parent(part_path_)));
    K3_ASSIGN_OR_RETURN(part_, env_->Open(part_path_, OpenMode::kReadWrite));
    K3_ASSIGN_OR_RETURN(offset_, part_->Size());
    if (offset_ > f_.size) {
      LogWarn(f_.path + ": " + part_path_ + " holds " + std::to_string(offset_) +
              " bytes, more than the listed " + std::to_string(f_.size) + "; starting over");
      K3_RETURN_IF_ERROR(part_->Truncate(0));
      offset_ = 0;
    }
    hasher_ = std::make_unique<ContentHasher>(f_.size, !f_.lfs());
    K3_ASSIGN_OR_RETURN(writer_, PartWriter::Open(env_, part_.get(), part_path_));
    stats_->resumed_from = offset_;
    std::vector<char> buf(offset_ > 0 ? kReadChunk : 0);
    for (uint64_t off = 0; off < offset_;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), offset_ - off));
      K3_RETURN_IF_ERROR(part_->ReadExact(off, n, buf.data()));
      hasher_->Update(buf.data(), n);
      off += n;
      stats_->prefix_bytes_read += n;
    }
    from_zero_ = offset_ == 0;
    return Status::Ok();
  }

  // Fetches until the .part holds the listed size, retrying (with waits) until --retry-max
  // attempts in a row brought no bytes.
  Status FetchRest() {
    while (offset_ < f_.size) {
      Step step;
      if (source_.url.empty()) step = ResolveSource(http_, ts_, f_, &source_);
      if (step.verdict == Verdict::kOk) step = Exchange();
      if (step.verdict == Verdict::kOk) break;  // the body reached the listed size
      if (step.verdict == Verdict::kFatal) return step.status;
      last_error_ = step.why;
      ++failures_;
      ++stats_->retries;
      if (observer_.on_note) observer_.on_note("retry");
      if (failures_ > ts_.hub.retry.retry_max) {
        return Status::Io(f_.path + ": gave up after " + std::to_string(failures_) +
                          " attempts in a row without new bytes; last error: " + last_error_ +
                          "; " + std::to_string(offset_) + " of " + std::to_string(f_.size) +
                          " bytes kept in " + part_path_ + " for the next run");
      }
      WaitBeforeRetry(ts_.hub.retry,
                      step.wait ? *step.wait : BackoffSeconds(ts_.hub.retry, failures_, rng_));
    }
    return Status::Ok();
  }

  // After FetchRest: the sha256 when size and hash match the listing (the .part closed). A
  // resumed .part that does not match is tried once more from byte 0 (*again set); a full
  // download that does not match becomes NAME.part.bad (kIntegrity).
  Result<std::string> Verify(bool* again) {
    *again = false;
    const std::string sha = hasher_->Sha256Hex();
    if (DigestsMatch(f_, offset_, sha, hasher_->GitSha1Hex())) {
      // Not fsynced here: the caller does that off the transfer thread, before the rename.
      K3_RETURN_IF_ERROR(writer_->Close());
      K3_RETURN_IF_ERROR(part_->Close());
      return sha;
    }
    if (!from_zero_) {
      // The prefix came from an earlier run; a crash may have left it stale. One clean pass.
      K3_RETURN_IF_ERROR(Restart("hash mismatch after resuming from byte " +
                                 std::to_string(stats_->resumed_from)));
      *again = true;
      return std::string();
    }
    K3_RETURN_IF_ERROR(writer_->Close());
    K3_RETURN_IF_ERROR(part_->Close());
    const std::string bad = part_path_ + ".bad";
    K3_RETURN_IF_ERROR(env_->Rename(part_path_, bad));
    const std::string want = f_.lfs() ? "SHA-256 " + f_.sha256 : "git blob sha1 " + f_.git_oid;
    const std::string got =
        f_.lfs() ? "SHA-256 " + sha : "git blob sha1 " + hasher_->GitSha1Hex();
    return Status::Integrity(f_.path + ": downloaded " + std::to_string(offset_) +
                             " bytes (the listed size) but their " + got +
                             " does not match the published " + want + " at " + ts_.commit +
                             "; kept as " + bad + " for inspection; run again to re-download");
  }

 private:
  Status Restart(const std::string& why) {
    LogWarn(f_.path + ": " + why + "; truncating " + part_path_ + " and starting from byte 0");
    K3_RETURN_IF_ERROR(part_->Truncate(0));
    offset_ = 0;
    hasher_ = std::make_unique<ContentHasher>(f_.size, !f_.lfs());
    from_zero_ = true;
    ++stats_->restarts;
    return Status::Ok();
  }

  // One GET of the rest of the file from source_. kOk: the .part now holds the listed size;
  // kRetry: try again (after the wait in the step); kFatal: give up with the status.
  Step Exchange() {
    HttpRequest req;
    req.url = source_.url;
    if (source_.send_token) req.bearer_token = ts_.hub.token;
    if (offset_ > 0) req.range_from = offset_;
    req.connect_timeout_s = ts_.hub.connect_timeout_s;
    req.low_speed_bytes_per_s = ts_.stall_bytes_per_s;
    req.low_speed_seconds = ts_.stall_seconds;
    req.receive_buffer_bytes = kReceiveBuffer;
    Sink sink;
    sink.writer = writer_.get();
    sink.offset = &offset_;
    sink.hasher = hasher_.get();
    sink.observer = &observer_;
    sink.expected_size = f_.size;
    Result<HttpResponse> r =
        http_.Perform(req, [&sink](const HttpResponse& resp, const char* d, size_t n) {
          return sink.OnBytes(resp, d, n);
        });
    // Bytes already hashed must reach the file whatever happened afterwards.
    Status flushed = sink.Flush();
    if (!sink.error.ok()) return Fatal(sink.error);
    if (!flushed.ok()) return Fatal(flushed);
    if (!r.ok()) return Fatal(r.status());
    stats_->bytes_fetched += sink.arrived;
    if (sink.arrived > 0) failures_ = 0;
    return Classify(*r, req, sink);
  }

  // What the exchange's outcome means for the next step.
  Step Classify(const HttpResponse& resp, const HttpRequest& req, const Sink& sink) {
    const long st = resp.status;
    if (sink.restart) {
      if (Status s = Restart(sink.restart_why); !s.ok()) return Fatal(s);
      return Retry(sink.restart_why, 0.0);
    }
    if (resp.curl_code == 0 && (st == 200 || st == 206)) {
      if (offset_ == f_.size) return Step{};
      return Retry("body ended at byte " + std::to_string(offset_) + " of " +
                   std::to_string(f_.size));
    }
    if (resp.curl_code == 0 && st == 416) {
      Status s = Restart("416 Range Not Satisfiable from byte " + std::to_string(offset_) +
                         " (Content-Range '" + Printable(resp.Header("content-range")) + "')");
      if (!s.ok()) return Fatal(s);
      return Retry("416", 0.0);
    }
    if (resp.curl_code == 0 && (st == 401 || st == 403)) {
      // A signed URL expires; the Hub hands out a fresh one.
      source_.url.clear();
      ++stats_->reresolves;
      return Retry("HTTP " + std::to_string(st) + " from " + RedactUrl(req.url) +
                   " (signed URL expired?)", 0.0);
    }
    if (resp.curl_code != 0) {
      if (resp.StalledOrTimedOut()) {
        ++stats_->stalls;
        if (observer_.on_note) observer_.on_note("stall");
      }
      if (!IsRetryableCurl(resp.curl_code)) {
        return Fatal(Status::Io(f_.path + ": download from " + RedactUrl(req.url) +
                                " failed: " + resp.curl_error));
      }
      return Retry(resp.curl_error);
    }
    if (IsRetryableStatus(st)) {
      return Retry("HTTP " + std::to_string(st) + " from " + RedactUrl(req.url),
                   ServerWaitSeconds(resp));
    }
    return Fatal(Status::Io(f_.path + ": download from " + RedactUrl(req.url) +
                            " answered HTTP " + std::to_string(st) + "; " +
                            std::to_string(offset_) + " of " + std::to_string(f_.size) +
                            " bytes kept in " + part_path_));
  }

  Env* env_;
  HttpClient& http_;
  const TransferSettings& ts_;
  const HubFile& f_;
  const std::string& part_path_;
  const TransferObserver& observer_;
  std::mt19937_64& rng_;
  TransferStats* stats_;
  std::unique_ptr<File> part_;
  std::unique_ptr<PartWriter> writer_;
  std::unique_ptr<ContentHasher> hasher_;
  uint64_t offset_ = 0;    // bytes in the .part (written + pending in the writer)
  bool from_zero_ = true;  // the hash covers only bytes fetched by this transfer
  Source source_;
  int failures_ = 0;  // consecutive attempts that brought no bytes
  std::string last_error_;
};

}  // namespace

Result<std::string> TransferFile(Env* env, HttpClient& http, const TransferSettings& ts,
                                 const HubFile& f, const std::string& part_path,
                                 const TransferObserver& observer, std::mt19937_64& rng,
                                 TransferStats* stats) {
  Transfer t(env, http, ts, f, part_path, observer, rng, stats);
  K3_RETURN_IF_ERROR(t.Open());
  while (true) {
    K3_RETURN_IF_ERROR(t.FetchRest());
    bool again = false;
    K3_ASSIGN_OR_RETURN(std::string sha, t.Verify(&again));
    if (!again) return sha;
  }
}

}  // namespace k3::download
