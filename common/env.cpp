// Env helpers that are independent of the operating system: exact reads/writes over short
// transfers, whole-file read, atomic whole-file write, path joining, buffered sequential writes.
#include "common/env.h"

#include <algorithm>
#include <cstring>

namespace k3 {

Status PrematureEofError(const std::string& path, uint64_t eof_at, uint64_t want_offset,
                         uint64_t want_len) {
  // A file shorter than its metadata promised: truncated, or still being written elsewhere.
  return Status::Io(path + ": premature end of file at byte offset " + std::to_string(eof_at) +
                    " (wanted " + std::to_string(want_len) + " bytes from offset " +
                    std::to_string(want_offset) + ", " +
                    std::to_string(want_offset + want_len - eof_at) +
                    " missing); the file is truncated: re-copy or re-download it");
}

Status File::ReadExact(uint64_t offset, size_t n, void* dst) {
  auto* out = static_cast<unsigned char*>(dst);
  size_t done = 0;
  while (done < n) {
    size_t got = 0;
    K3_RETURN_IF_ERROR(PRead(offset + done, n - done, out + done, &got));
    if (got == 0) return PrematureEofError(path_, offset + done, offset, n);
    done += got;
  }
  return Status::Ok();
}

Status File::WriteExact(uint64_t offset, const void* src, size_t n) {
  const auto* in = static_cast<const unsigned char*>(src);
  size_t done = 0;
  while (done < n) {
    size_t wrote = 0;
    K3_RETURN_IF_ERROR(PWrite(offset + done, in + done, n - done, &wrote));
    if (wrote == 0) {
      // write(2) returning 0 for a nonzero count never makes progress; looping would spin.
      return Status::Io(path_ + ": write at byte offset " + std::to_string(offset + done) +
                        " made no progress (" + std::to_string(n - done) +
                        " bytes not written); check free space and the device");
    }
    done += wrote;
  }
  return Status::Ok();
}

Result<std::string> ReadFileToString(Env* env, const std::string& path, uint64_t max_bytes) {
  K3_ASSIGN_OR_RETURN(std::unique_ptr<File> file, env->Open(path, OpenMode::kRead));
  K3_ASSIGN_OR_RETURN(uint64_t size, file->Size());
  if (size > max_bytes) {
    return Status::Invalid(path + ": file is " + std::to_string(size) +
                           " bytes, more than the limit of " + std::to_string(max_bytes) +
                           " bytes for this kind of file; is it the right file?");
  }
  std::string data(static_cast<size_t>(size), '\0');
  K3_RETURN_IF_ERROR(file->ReadExact(0, data.size(), data.data()));
  // A file that grew since Size() is read as of Size(); callers validate the content anyway.
  K3_RETURN_IF_ERROR(file->Close());
  return data;
}

namespace {

std::string ParentDir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

Status WriteTemp(Env* env, const std::string& tmp, const std::string& data) {
  K3_ASSIGN_OR_RETURN(std::unique_ptr<File> file, env->Open(tmp, OpenMode::kCreate));
  K3_RETURN_IF_ERROR(file->WriteExact(0, data.data(), data.size()));
  K3_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

}  // namespace

Status WriteFileAtomic(Env* env, const std::string& path, const std::string& data) {
  const std::string tmp = TempPathFor(path);
  Status s = WriteTemp(env, tmp, data);
  if (s.ok()) s = env->Rename(tmp, path);
  if (!s.ok()) {
    // Best effort: the original failure is what the user needs to see.
    if (env->Exists(tmp)) (void)env->Remove(tmp);
    return s;
  }
  return env->SyncDir(ParentDir(path));
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

std::string TempPathFor(const std::string& final_path) { return final_path + ".k3tmp"; }

BufferedWriter::BufferedWriter(File* file, uint64_t start_offset, size_t buffer_bytes)
    : file_(file), offset_(start_offset), capacity_(std::max<size_t>(buffer_bytes, 1)) {
  buffer_.reserve(capacity_);
}

Status BufferedWriter::Append(const void* data, size_t n) {
  const auto* in = static_cast<const char*>(data);
  while (n > 0) {
    if (buffer_.empty() && n >= capacity_) {
      // Large appends bypass the buffer: one copy fewer, same bytes at the same offsets.
      K3_RETURN_IF_ERROR(file_->WriteExact(offset_, in, n));
      offset_ += n;
      return Status::Ok();
    }
    const size_t take = std::min(n, capacity_ - buffer_.size());
    buffer_.append(in, take);
    in += take;
    n -= take;
    if (buffer_.size() == capacity_) K3_RETURN_IF_ERROR(Flush());
  }
  return Status::Ok();
}

Status BufferedWriter::AppendZeros(size_t n) {
  while (n > 0) {
    const size_t take = std::min(n, capacity_ - buffer_.size());
    buffer_.append(take, '\0');
    n -= take;
    if (buffer_.size() == capacity_) K3_RETURN_IF_ERROR(Flush());
  }
  return Status::Ok();
}

Status BufferedWriter::Flush() {
  if (buffer_.empty()) return Status::Ok();
  K3_RETURN_IF_ERROR(file_->WriteExact(offset_, buffer_.data(), buffer_.size()));
  offset_ += buffer_.size();
  buffer_.clear();
  return Status::Ok();
}

}  // namespace k3
