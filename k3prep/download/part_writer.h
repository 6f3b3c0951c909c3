// Appends a download's body to its .part file.
//
// Goals: libcurl hands the body over in 16 KiB pieces; each piece costs one copy into a 1 MiB
// window, and full windows go to the file with O_DIRECT where the file system allows it, so the
// bytes are not copied a second time into the page cache and the fsync before the rename has
// almost nothing left to write (measured in docs/DOWNLOAD.md "Testing and benchmark"). A
// checkpoint download also no longer pushes everything else out of the page cache.
// Non-goals: hashing (the caller hashes each piece as it arrives), resume decisions.
//
// How: a second handle to the same .part is opened with O_DIRECT. Direct writes always start
// at an aligned offset and are whole multiples of the alignment, from an aligned buffer.
// Everything else goes through the caller's ordinary handle: the bytes before the first aligned
// offset of a resumed .part, and the tail of a window flushed early (end of an exchange, or the
// periodic flush that bounds what a kill loses). Both handles see one page cache, and no 4 KiB
// block is written both ways. When direct I/O is unavailable (tmpfs, test Envs) or a direct write
// fails, everything goes through the ordinary handle.
//
// Thread safety: one writer per transfer, used by one thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "common/aligned_buffer.h"
#include "common/env.h"
#include "common/log.h"
#include "common/status.h"

namespace k3::download {

class PartWriter {
 public:
  // Window size: a direct write per MiB keeps the syscall and device-request count low, and
  // the window stays in L2 while it fills.
  static constexpr size_t kWindow = 1u << 20;

  // `part` (opened read-write, owned by the caller) receives the buffered writes; the direct
  // handle, if any, is opened here on `path`.
  static Result<std::unique_ptr<PartWriter>> Open(Env* env, File* part, const std::string& path);
  ~PartWriter();

  // The next Append lands at `offset` (the .part's length); nothing may be pending.
  void Reset(uint64_t offset);
  // Takes n bytes; writes whole windows as they fill.
  Status Append(const char* data, size_t n);
  // Writes everything taken so far (a short window's aligned part directly, the rest buffered).
  Status Flush();
  // Flushes, then closes the direct handle (the caller closes `part`).
  Status Close();

  bool direct() const { return direct_ != nullptr; }
  size_t pending() const { return fill_; }

 private:
  PartWriter(File* part, std::unique_ptr<File> direct, uint32_t align, AlignedBuffer window)
      : part_(part), direct_(std::move(direct)), align_(align), window_(std::move(window)) {}
  Status WriteWindow(size_t n);
  // One window kept per thread between files (transfers run one file at a time per thread).
  static AlignedBuffer& Spare() {
    thread_local AlignedBuffer spare;
    return spare;
  }

  File* part_;
  std::unique_ptr<File> direct_;  // null: buffered only
  uint32_t align_;
  AlignedBuffer window_;
  uint64_t window_at_ = 0;  // file offset of window_[0] (aligned whenever direct_ is set)
  size_t fill_ = 0;         // bytes in window_
};

// Defined here (header-only) so the class needs no build-file change of its own.
inline Result<std::unique_ptr<PartWriter>> PartWriter::Open(Env* env, File* part,
                                                           const std::string& path) {
  AlignedBuffer window = std::move(Spare());
  if (window.size() < kWindow) {
    // On a huge page where the kernel grants one: each direct write pins the window's pages.
    K3_ASSIGN_OR_RETURN(window, AlignedBuffer::AllocateHuge(kWindow));
  }
  std::unique_ptr<File> direct;
  const uint32_t reported = env->DirectAlignment(path);
  // Direct writes start and end on page boundaries even where the device allows 512: a buffered
  // write into a page that a direct write filled only partly makes the kernel read that block
  // back first (measured: one 4 KiB read per file). Odd or larger alignments: no direct I/O.
  const uint32_t align = 4096;
  if (reported != 0 && reported <= align && (reported & (reported - 1)) == 0) {
    Result<std::unique_ptr<File>> f = env->Open(path, OpenMode::kReadWrite);
    if (f.ok() && (*f)->SetDirect(true).ok()) direct = std::move(*f);
  }
  const uint32_t used_align = direct != nullptr ? align : 1;
  return std::unique_ptr<PartWriter>(
      new PartWriter(part, std::move(direct), used_align, std::move(window)));
}

// The window goes back to this thread's spare: a fresh 1 MiB per file would cost 256 page
// faults each time (measured: 14 % of the downloader's CPU on the small preset).
inline PartWriter::~PartWriter() { Spare() = std::move(window_); }

inline void PartWriter::Reset(uint64_t offset) {
  window_at_ = offset;
  fill_ = 0;
}

inline Status PartWriter::Append(const char* data, size_t n) {
  if (direct_ != nullptr && fill_ == 0 && window_at_ % align_ != 0) {
    // A resumed .part (or an early flush) left the end unaligned: the bytes up to the next
    // aligned offset go through the page cache, so that windows start aligned again.
    const size_t head =
        static_cast<size_t>(std::min<uint64_t>(n, align_ - window_at_ % align_));
    K3_RETURN_IF_ERROR(part_->WriteExact(window_at_, data, head));
    window_at_ += head;
    data += head;
    n -= head;
  }
  while (n > 0) {
    const size_t take = std::min(n, kWindow - fill_);
    std::memcpy(window_.data() + fill_, data, take);
    fill_ += take;
    data += take;
    n -= take;
    if (fill_ == kWindow) K3_RETURN_IF_ERROR(WriteWindow(kWindow));
  }
  return Status::Ok();
}

inline Status PartWriter::Flush() { return fill_ == 0 ? Status::Ok() : WriteWindow(fill_); }

inline Status PartWriter::Close() {
  K3_RETURN_IF_ERROR(Flush());
  if (direct_ == nullptr) return Status::Ok();
  Status s = direct_->Close();
  direct_.reset();
  return s;
}

inline Status PartWriter::WriteWindow(size_t n) {
  const char* p = reinterpret_cast<const char*>(window_.data());
  size_t done = 0;
  if (direct_ != nullptr) {
    const size_t aligned = n / align_ * align_;
    if (aligned > 0) {
      Status s = direct_->WriteExact(window_at_, p, aligned);
      if (s.ok()) {
        done = aligned;
      } else {
        // Direct I/O can be refused where statx promised it (some FUSE and network file
        // systems): the page cache still works, and a real disk error repeats there.
        LogWarn(s.message() + "; writing " + part_->path() + " through the page cache instead");
        (void)direct_->Close();
        direct_.reset();
      }
    }
  }
  if (done < n) K3_RETURN_IF_ERROR(part_->WriteExact(window_at_ + done, p + done, n - done));
  window_at_ += n;
  fill_ = 0;
  return Status::Ok();
}

}  // namespace k3::download
