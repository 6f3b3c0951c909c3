// The POSIX Env: thin wrappers over open/pread/pwrite/fsync/rename/statx/statvfs that turn every
// errno into a Status naming the path (and the byte offset for reads and writes).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>

#include "common/env.h"

namespace k3 {
namespace {

// ENOENT and friends mean the user named something that is not there: invalid input (exit 2),
// not an I/O failure.
Status OpenError(const std::string& path, int err, bool creating) {
  if (err == ENOENT) {
    return Status::Invalid(creating ? path + ": no such directory to create the file in"
                                    : path + ": no such file");
  }
  if (err == ENOTDIR) return Status::Invalid(path + ": a component of the path is not a directory");
  if (err == EISDIR) return Status::Invalid(path + ": is a directory, expected a file");
  if (err == EACCES && !creating) return Status::Invalid(path + ": permission denied (not readable)");
  return Status::IoErrno(creating ? "create" : "open", path, err);
}

// What the file is instead, in words a user can act on.
Status NotARegularFile(const std::string& path, mode_t mode) {
  const char* what = S_ISFIFO(mode)   ? "a FIFO (named pipe)"
                     : S_ISSOCK(mode) ? "a socket"
                     : S_ISCHR(mode)  ? "a character device"
                     : S_ISBLK(mode)  ? "a block device"
                                      : "not a regular file";
  return Status::Invalid(path + ": is " + std::string(what) +
                         ", expected a regular file (or a symlink to one)");
}

class PosixFile final : public File {
 public:
  PosixFile(std::string path, int fd, bool direct) : fd_(fd), direct_(direct) {
    path_ = std::move(path);
  }
  ~PosixFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  Status PRead(uint64_t offset, size_t n, void* dst, size_t* got) override {
    *got = 0;
    if (fd_ < 0) return Closed();
    ssize_t r;
    do {
      r = ::pread(fd_, dst, n, static_cast<off_t>(offset));
    } while (r < 0 && errno == EINTR);
    if (r < 0) return Status::IoErrno("read", path_, errno, offset);
    *got = static_cast<size_t>(r);
    return Status::Ok();
  }

  Status PWrite(uint64_t offset, const void* src, size_t n, size_t* wrote) override {
    *wrote = 0;
    if (fd_ < 0) return Closed();
    ssize_t r;
    do {
      r = ::pwrite(fd_, src, n, static_cast<off_t>(offset));
    } while (r < 0 && errno == EINTR);
    if (r < 0) return Status::IoErrno("write", path_, errno, offset);
    *wrote = static_cast<size_t>(r);
    return Status::Ok();
  }

  Result<uint64_t> Size() override {
    if (fd_ < 0) return Closed();
    struct stat st {};
    if (::fstat(fd_, &st) != 0) return Status::IoErrno("fstat", path_, errno);
    return static_cast<uint64_t>(st.st_size);
  }

  Status Truncate(uint64_t size) override {
    if (fd_ < 0) return Closed();
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
      return Status::IoErrno("truncate to " + std::to_string(size) + " bytes", path_, errno);
    }
    return Status::Ok();
  }

  Status Sync() override {
    if (fd_ < 0) return Closed();
    if (::fsync(fd_) != 0) return Status::IoErrno("fsync", path_, errno);
    return Status::Ok();
  }

  Status Close() override {
    if (fd_ < 0) return Status::Ok();
    const int fd = fd_;
    fd_ = -1;
    // close(2) must not be retried on EINTR on Linux: the descriptor is already gone.
    if (::close(fd) != 0 && errno != EINTR) return Status::IoErrno("close", path_, errno);
    return Status::Ok();
  }

  int fd() const override { return fd_; }
  bool direct() const override { return direct_; }
  Status SetDirect(bool on) override {
    if (fd_ < 0) return Closed();
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags < 0) return Status::IoErrno("fcntl(F_GETFL)", path_, errno);
    const int want = on ? (flags | O_DIRECT) : (flags & ~O_DIRECT);
    if (want != flags && ::fcntl(fd_, F_SETFL, want) != 0) {
      return Status::IoErrno(on ? "enabling O_DIRECT" : "disabling O_DIRECT", path_, errno);
    }
    direct_ = on;
    return Status::Ok();
  }

 private:
  Status Closed() const { return Status::Io(path_ + ": file used after Close() (internal)"); }

  int fd_;
  bool direct_;
};

class PosixEnv final : public Env {
 public:
  // Every open is O_NONBLOCK first: a FIFO named like a shard would otherwise block open(2)
  // (and later reads) forever. The descriptor is then fstat'ed, so what is checked is what was
  // opened (no check-then-open race): reads and read-write state files must be regular files
  // (symlinks to them are followed); a created output may also be a character device such as
  // /dev/null. O_NONBLOCK is cleared again before the file is handed out.
  Result<std::unique_ptr<File>> Open(const std::string& path, OpenMode mode) override {
    int flags = O_CLOEXEC | O_NONBLOCK;
    bool creating = false;
    switch (mode) {
      case OpenMode::kRead:
      case OpenMode::kReadDirect: flags |= O_RDONLY; break;
      case OpenMode::kCreate: flags |= O_WRONLY | O_CREAT | O_TRUNC; creating = true; break;
      case OpenMode::kReadWrite: flags |= O_RDWR | O_CREAT; creating = true; break;
    }
    int fd = -1;
    bool direct = false;
    if (mode == OpenMode::kReadDirect) {
      fd = ::open(path.c_str(), flags | O_DIRECT);
      direct = fd >= 0;
      // EINVAL: the file system has no O_DIRECT (tmpfs, some FUSE). Fall back to buffered
      // reads; callers see direct() == false and skip the alignment rules.
      if (fd < 0 && errno != EINVAL) return OpenError(path, errno, false);
    }
    while (fd < 0) {
      fd = ::open(path.c_str(), flags, 0644);
      // ENXIO: a FIFO opened for writing with no reader.
      if (fd < 0 && errno == ENXIO) return NotARegularFile(path, S_IFIFO);
      if (fd < 0 && errno != EINTR) return OpenError(path, errno, creating);
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      return Status::IoErrno("stat", path, err);
    }
    const bool allowed = S_ISREG(st.st_mode) || (mode == OpenMode::kCreate && S_ISCHR(st.st_mode));
    if (!allowed) {
      ::close(fd);
      // A directory keeps its own message: open(2) succeeds on one with O_RDONLY.
      if (S_ISDIR(st.st_mode)) return OpenError(path, EISDIR, false);
      return NotARegularFile(path, st.st_mode);
    }
    if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
      const int err = errno;
      ::close(fd);
      return Status::IoErrno("fcntl", path, err);
    }
    return std::unique_ptr<File>(new PosixFile(path, fd, direct));
  }

  Result<uint64_t> FileSize(const std::string& path) override {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return OpenError(path, errno, false);
    if (S_ISDIR(st.st_mode)) return OpenError(path, EISDIR, false);
    return static_cast<uint64_t>(st.st_size);
  }

  bool Exists(const std::string& path) override {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
  }

  bool IsDirectory(const std::string& path) override {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }

  Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return Status::IoErrno("rename to " + to, from, errno);
    }
    return Status::Ok();
  }

  Status Remove(const std::string& path) override {
    if (::unlink(path.c_str()) == 0) return Status::Ok();
    if (errno == EISDIR || errno == EPERM) {
      if (::rmdir(path.c_str()) == 0) return Status::Ok();
    }
    if (errno == ENOENT) return Status::Invalid(path + ": no such file");
    return Status::IoErrno("remove", path, errno);
  }

  Status MakeDirs(const std::string& path) override {
    if (path.empty()) return Status::Invalid("MakeDirs: empty path");
    size_t pos = 0;
    while (pos != std::string::npos) {
      pos = path.find('/', pos + 1);
      const std::string prefix = path.substr(0, pos);
      if (prefix.empty() || prefix == "/") continue;
      if (::mkdir(prefix.c_str(), 0755) == 0) continue;
      const int err = errno;
      if (err == EEXIST && IsDirectory(prefix)) continue;
      if (err == EEXIST) return Status::Invalid(prefix + ": exists and is not a directory");
      return Status::IoErrno("mkdir", prefix, err);
    }
    return Status::Ok();
  }

  Result<std::vector<DirEntry>> ListDir(const std::string& path) override {
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) {
      if (errno == ENOENT) return Status::Invalid(path + ": no such directory");
      if (errno == ENOTDIR) return Status::Invalid(path + ": not a directory");
      return Status::IoErrno("list directory", path, errno);
    }
    std::vector<DirEntry> entries;
    errno = 0;
    while (struct dirent* e = ::readdir(dir)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      DirEntry entry;
      entry.name = name;
      struct stat st {};
      // Follows symlinks: a linked shard counts as the file it points to.
      if (::fstatat(::dirfd(dir), e->d_name, &st, 0) == 0) {
        entry.is_dir = S_ISDIR(st.st_mode);
        entry.size = entry.is_dir ? 0 : static_cast<uint64_t>(st.st_size);
      }
      entries.push_back(std::move(entry));
      errno = 0;
    }
    const int err = errno;
    ::closedir(dir);
    if (err != 0) return Status::IoErrno("list directory", path, err);
    std::sort(entries.begin(), entries.end(),
              [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
    return entries;
  }

  Result<uint64_t> FreeSpace(const std::string& path) override {
    struct statvfs vfs {};
    if (::statvfs(path.c_str(), &vfs) != 0) {
      if (errno == ENOENT) return Status::Invalid(path + ": no such file or directory");
      return Status::IoErrno("statvfs", path, errno);
    }
    return static_cast<uint64_t>(vfs.f_bavail) * static_cast<uint64_t>(vfs.f_frsize);
  }

  Status SyncDir(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return OpenError(path, errno, false);
    Status s;
    if (::fsync(fd) != 0 && errno != EINVAL) s = Status::IoErrno("fsync directory", path, errno);
    ::close(fd);
    return s;
  }

  Result<std::string> CanonicalPath(const std::string& path) override {
    char* resolved = ::realpath(path.c_str(), nullptr);
    if (resolved == nullptr) {
      if (errno == ENOENT) return Status::Invalid(path + ": no such file or directory");
      return Status::IoErrno("resolve path", path, errno);
    }
    std::string out = resolved;
    std::free(resolved);
    return out;
  }

  uint32_t DirectAlignment(const std::string& path) override {
    struct statx stx {};
    if (::statx(AT_FDCWD, path.c_str(), 0, STATX_DIOALIGN, &stx) == 0 &&
        (stx.stx_mask & STATX_DIOALIGN) != 0) {
      // Both zero means the file system reports "no direct I/O" for this file.
      return std::max(stx.stx_dio_mem_align, stx.stx_dio_offset_align);
    }
    // Old kernel or a file system that does not report: probe O_DIRECT, assume 4096 (the
    // largest logical block size in common use) when it opens.
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return 4096;
    const int probe_flags =
        (S_ISDIR(st.st_mode) ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC | O_NONBLOCK;
    int fd = ::open(path.c_str(), probe_flags | O_DIRECT);
    if (fd < 0) return errno == EINVAL ? 0 : 4096;
    ::close(fd);
    return 4096;
  }
};

}  // namespace

Env* Env::Default() {
  static Env* env = new PosixEnv();  // never deleted: usable from static destructors
  return env;
}

}  // namespace k3
