// Env: every file-system operation k3 performs goes through this interface.
//
// Why: tests replace the real file system with a fault-injecting one (short reads, EIO at a
// chosen offset, ENOSPC, truncation, a crash before rename) and check that every failure ends in
// a clear Status and never in a half-written file under its final name (LevelDB's Env idea).
//
// Thread safety: Env methods are safe to call concurrently. A File may be used by several
// threads at once for PRead/PWrite at different offsets (pread/pwrite semantics); Sync and
// Close must not race with other calls on the same File.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace k3 {

enum class OpenMode {
  kRead,          // existing file, read only
  kReadDirect,    // existing file, read only, O_DIRECT when the file system supports it
  kCreate,        // create or truncate, write only
  kReadWrite,     // existing file (or created), read and write, no truncation
};

class File {
 public:
  virtual ~File() = default;
  File() = default;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // Reads up to n bytes at offset into dst; *got < n only at end of file or when the OS returns
  // a short read (callers that need n bytes use ReadExact).
  virtual Status PRead(uint64_t offset, size_t n, void* dst, size_t* got) = 0;
  // Writes up to n bytes at offset; *wrote < n is a short write (callers use WriteExact).
  virtual Status PWrite(uint64_t offset, const void* src, size_t n, size_t* wrote) = 0;
  virtual Result<uint64_t> Size() = 0;
  virtual Status Truncate(uint64_t size) = 0;
  virtual Status Sync() = 0;
  // Releases the descriptor and reports a failed close(2) (some file systems report deferred
  // write errors only there). Optional: the destructor closes too, ignoring errors. After
  // Close every other call fails.
  virtual Status Close() { return Status::Ok(); }
  // The OS descriptor for io_uring submission, or -1 when the file is not a real descriptor
  // (fault-injecting or in-memory files); readers then fall back to PRead.
  virtual int fd() const { return -1; }
  // True when opened with O_DIRECT: offsets, lengths and buffers must honour DirectAlignment().
  virtual bool direct() const { return false; }
  // Switches O_DIRECT on or off for later reads and writes of this open file (a writer that
  // knows its windows are aligned skips the page-cache copy). Files that cannot (fault-injecting
  // or in-memory files, file systems without direct I/O) return an error and stay as they are.
  virtual Status SetDirect(bool /*on*/) {
    return Status::Invalid(path_ + ": direct I/O is not available for this file");
  }
  const std::string& path() const { return path_; }

  // Reads exactly n bytes, looping over short reads. Premature end of file is an I/O error that
  // names the file, the offset and how many bytes were missing.
  Status ReadExact(uint64_t offset, size_t n, void* dst);
  // Writes exactly n bytes, looping over short writes.
  Status WriteExact(uint64_t offset, const void* src, size_t n);

 protected:
  std::string path_;
};

struct DirEntry {
  std::string name;  // without the directory
  bool is_dir = false;
  uint64_t size = 0;
};

class Env {
 public:
  virtual ~Env() = default;

  // The process-wide POSIX implementation. Never deleted.
  static Env* Default();

  virtual Result<std::unique_ptr<File>> Open(const std::string& path, OpenMode mode) = 0;
  virtual Result<uint64_t> FileSize(const std::string& path) = 0;
  virtual bool Exists(const std::string& path) = 0;
  virtual bool IsDirectory(const std::string& path) = 0;
  // Atomic within one file system (rename(2)); replaces `to` if it exists.
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  virtual Status Remove(const std::string& path) = 0;
  // mkdir -p.
  virtual Status MakeDirs(const std::string& path) = 0;
  // Entries of a directory, sorted by name, without "." and "..".
  virtual Result<std::vector<DirEntry>> ListDir(const std::string& path) = 0;
  // Bytes available to an unprivileged writer on the file system holding `path`.
  virtual Result<uint64_t> FreeSpace(const std::string& path) = 0;
  // Makes a directory's entries (after create/rename) durable.
  virtual Status SyncDir(const std::string& path) = 0;
  // Canonical absolute path (realpath).
  virtual Result<std::string> CanonicalPath(const std::string& path) = 0;
  // O_DIRECT alignment for a file: statx(STATX_DIOALIGN) memory/offset alignment, or 4096 when
  // the kernel does not report it. Returns 0 when the file system has no direct I/O.
  virtual uint32_t DirectAlignment(const std::string& path) = 0;
};

// Forwards every call to another Env, so a test Env overrides only what it changes.
class EnvWrapper : public Env {
 public:
  explicit EnvWrapper(Env* target) : target_(target) {}
  Env* target() const { return target_; }

  Result<std::unique_ptr<File>> Open(const std::string& p, OpenMode m) override {
    return target_->Open(p, m);
  }
  Result<uint64_t> FileSize(const std::string& p) override { return target_->FileSize(p); }
  bool Exists(const std::string& p) override { return target_->Exists(p); }
  bool IsDirectory(const std::string& p) override { return target_->IsDirectory(p); }
  Status Rename(const std::string& f, const std::string& t) override {
    return target_->Rename(f, t);
  }
  Status Remove(const std::string& p) override { return target_->Remove(p); }
  Status MakeDirs(const std::string& p) override { return target_->MakeDirs(p); }
  Result<std::vector<DirEntry>> ListDir(const std::string& p) override {
    return target_->ListDir(p);
  }
  Result<uint64_t> FreeSpace(const std::string& p) override { return target_->FreeSpace(p); }
  Status SyncDir(const std::string& p) override { return target_->SyncDir(p); }
  Result<std::string> CanonicalPath(const std::string& p) override {
    return target_->CanonicalPath(p);
  }
  uint32_t DirectAlignment(const std::string& p) override { return target_->DirectAlignment(p); }

 private:
  Env* target_;
};

// Convenience helpers over an Env.
Result<std::string> ReadFileToString(Env* env, const std::string& path,
                                     uint64_t max_bytes = uint64_t{1} << 30);
// Writes `data` to `path` atomically: a temporary name in the same directory, fsync, rename,
// directory fsync. On failure the temporary is removed and `path` is untouched.
Status WriteFileAtomic(Env* env, const std::string& path, const std::string& data);
// "dir/name" joining that tolerates a trailing slash on dir.
std::string JoinPath(const std::string& dir, const std::string& name);
// The name used for a file being written before its final rename: "<path>.k3tmp".
std::string TempPathFor(const std::string& final_path);
// The error for a file that ended before [want_offset, want_offset+want_len) was read: names
// the file, the offset where the data ran out and how many bytes are missing (kIo).
Status PrematureEofError(const std::string& path, uint64_t eof_at, uint64_t want_offset,
                         uint64_t want_len);

// Sequential writer over a File with a large buffer; flushes with WriteExact. Tracks the offset.
class BufferedWriter {
 public:
  explicit BufferedWriter(File* file, uint64_t start_offset = 0, size_t buffer_bytes = 8 << 20);
  Status Append(const void* data, size_t n);
  Status AppendZeros(size_t n);
  Status Flush();
  uint64_t offset() const { return offset_ + buffer_.size(); }

 private:
  File* file_;
  uint64_t offset_;  // file offset of buffer_[0]
  size_t capacity_;
  std::string buffer_;
};

}  // namespace k3
