#include "k3run/mpi/wire.h"

#include <cstring>

namespace k3::run::mpi {
namespace {

constexpr uint32_t kWorkMagic = 0x574d334bu;   // "K3MW" little-endian
constexpr uint32_t kReplyMagic = 0x524d334bu;  // "K3MR"
constexpr size_t kHeaderBytes = 32;
constexpr uint64_t kMaxReasonBytes = 4096;

size_t Pad8(size_t n) { return (n + 7) / 8 * 8; }

// Appends little-endian fields to a byte string (the host is little-endian: wire.h).
class Writer {
 public:
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void Raw(const void* p, size_t n) {
    const auto* b = static_cast<const char*>(p);
    bytes_.insert(bytes_.end(), b, b + n);
  }
  void Align8() { bytes_.resize(Pad8(bytes_.size()), '\0'); }
  std::vector<uint64_t> Finish() {
    Align8();
    std::vector<uint64_t> out(bytes_.size() / 8);
    if (!bytes_.empty()) std::memcpy(out.data(), bytes_.data(), bytes_.size());
    return out;
  }

 private:
  std::string bytes_;
};

// Reads fields in order; every read is bounds-checked and the first failure sticks.
class Reader {
 public:
  Reader(std::span<const uint64_t> msg, std::string from)
      : p_(reinterpret_cast<const char*>(msg.data())), n_(msg.size() * 8), from_(std::move(from)) {}
  bool U32(uint32_t* v, const char* field) { return Raw(v, 4, field); }
  bool U64(uint64_t* v, const char* field) { return Raw(v, 8, field); }
  bool Raw(void* out, size_t n, const char* field) {
    if (!error_.empty()) return false;
    if (n > n_ - at_) {
      error_ = from_ + ": message of " + std::to_string(n_) + " bytes ends inside " + field +
               " at byte " + std::to_string(at_);
      return false;
    }
    std::memcpy(out, p_ + at_, n);
    at_ += n;
    return true;
  }
  void Align8() { at_ = std::min(Pad8(at_), n_); }
  void Fail(const std::string& what) {
    if (error_.empty()) error_ = from_ + ": " + what;
  }
  size_t at() const { return at_; }
  size_t size() const { return n_; }
  const char* data() const { return p_; }
  const std::string& error() const { return error_; }

 private:
  const char* p_;
  size_t n_;
  size_t at_ = 0;
  std::string from_;
  std::string error_;
};

// The float payload: exactly n_rows × latent floats, then padding to 8 bytes, then nothing.
const float* Payload(Reader* r, uint64_t n_rows, int64_t latent) {
  r->Align8();
  const uint64_t floats = n_rows * static_cast<uint64_t>(latent);
  const uint64_t want = r->at() + Pad8(floats * 4);
  if (n_rows > (uint64_t{1} << 40) || want != r->size()) {
    r->Fail("message of " + std::to_string(r->size()) + " bytes does not hold " +
            std::to_string(n_rows) + " rows of " + std::to_string(latent) +
            " floats after its header (" + std::to_string(r->at()) + " bytes)");
    return nullptr;
  }
  return reinterpret_cast<const float*>(r->data() + r->at());
}

}  // namespace

std::vector<uint64_t> EncodeWork(const Work& w, const float* rows, int64_t latent) {
  Writer out;
  uint64_t n_rows = 0;
  for (const Job& j : w.jobs) n_rows += j.rows;
  out.U32(kWorkMagic);
  out.U32(w.layer);
  out.U64(w.pass);
  out.U32(static_cast<uint32_t>(w.jobs.size()));
  out.U32(0);
  out.U64(n_rows);
  for (const Job& j : w.jobs) {
    out.U32(j.expert);
    out.U32(j.rows);
  }
  if (n_rows > 0) out.Raw(rows, n_rows * static_cast<uint64_t>(latent) * sizeof(float));
  return out.Finish();
}

std::vector<uint64_t> EncodeShutdown() {
  Work w;
  w.layer = kShutdownLayer;
  return EncodeWork(w, nullptr, 0);
}

std::vector<uint64_t> EncodeReply(const Reply& r, const float* rows, int64_t latent) {
  Writer out;
  out.U32(kReplyMagic);
  out.U32(r.layer);
  out.U64(r.pass);
  out.U32(r.n_jobs);
  out.U32(static_cast<uint32_t>(r.failures.size()));
  out.U64(r.n_rows);
  for (const Failure& f : r.failures) {
    const std::string reason = f.reason.substr(0, kMaxReasonBytes);
    out.U32(f.job);
    out.U32(static_cast<uint32_t>(reason.size()));
    out.Raw(reason.data(), reason.size());
  }
  out.Align8();
  if (r.n_rows > 0) out.Raw(rows, r.n_rows * static_cast<uint64_t>(latent) * sizeof(float));
  return out.Finish();
}

Result<Work> DecodeWork(std::span<const uint64_t> msg, int64_t latent, const std::string& from) {
  Reader in(msg, from);
  Work w;
  uint32_t magic = 0, n_jobs = 0, reserved = 0;
  in.U32(&magic, "magic");
  if (in.error().empty() && magic != kWorkMagic) in.Fail("not a work message (magic)");
  in.U32(&w.layer, "layer");
  in.U64(&w.pass, "pass");
  in.U32(&n_jobs, "n_jobs");
  in.U32(&reserved, "reserved");
  in.U64(&w.n_rows, "n_rows");
  if (in.error().empty() && reserved != 0) in.Fail("reserved field is not zero");
  if (in.error().empty() && uint64_t{n_jobs} * 8 > in.size() - in.at()) {
    in.Fail(std::to_string(n_jobs) + " jobs do not fit the message");
  }
  uint64_t sum = 0;
  for (uint32_t i = 0; i < n_jobs && in.error().empty(); ++i) {
    Job j;
    in.U32(&j.expert, "job expert");
    in.U32(&j.rows, "job rows");
    if (in.error().empty() && j.rows == 0) in.Fail("job " + std::to_string(i) + " has no rows");
    sum += j.rows;
    w.jobs.push_back(j);
  }
  if (in.error().empty() && sum != w.n_rows) {
    in.Fail("jobs hold " + std::to_string(sum) + " rows, header says " + std::to_string(w.n_rows));
  }
  if (in.error().empty()) w.rows = Payload(&in, w.n_rows, latent);
  if (!in.error().empty()) return Status::Invalid(in.error());
  return w;
}

Result<Reply> DecodeReply(std::span<const uint64_t> msg, int64_t latent, const std::string& from) {
  Reader in(msg, from);
  Reply r;
  uint32_t magic = 0, n_failed = 0;
  in.U32(&magic, "magic");
  if (in.error().empty() && magic != kReplyMagic) in.Fail("not a reply message (magic)");
  in.U32(&r.layer, "layer");
  in.U64(&r.pass, "pass");
  in.U32(&r.n_jobs, "n_jobs");
  in.U32(&n_failed, "n_failed");
  in.U64(&r.n_rows, "n_rows");
  if (in.error().empty() && n_failed > r.n_jobs) {
    in.Fail(std::to_string(n_failed) + " failures for " + std::to_string(r.n_jobs) + " jobs");
  }
  for (uint32_t i = 0; i < n_failed && in.error().empty(); ++i) {
    Failure f;
    uint32_t len = 0;
    in.U32(&f.job, "failure job");
    in.U32(&len, "failure reason length");
    if (in.error().empty() && (f.job >= r.n_jobs || len > kMaxReasonBytes)) {
      in.Fail("failure " + std::to_string(i) + " names job " + std::to_string(f.job) +
              " with a " + std::to_string(len) + "-byte reason");
    }
    if (in.error().empty()) {
      f.reason.resize(len);
      in.Raw(f.reason.data(), len, "failure reason");
    }
    r.failures.push_back(std::move(f));
  }
  if (in.error().empty()) r.rows = Payload(&in, r.n_rows, latent);
  if (!in.error().empty()) return Status::Invalid(in.error());
  return r;
}

}  // namespace k3::run::mpi
