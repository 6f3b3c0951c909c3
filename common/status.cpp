#include "common/status.h"

#include <cerrno>
#include <cstring>

namespace k3 {

const char* CodeName(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kIo: return "I/O error";
    case Code::kInvalid: return "invalid input";
    case Code::kIntegrity: return "integrity failure";
    case Code::kUnreliable: return "unreliable output";
  }
  return "unknown";
}

Status Status::IoErrno(const std::string& what, const std::string& path, int err,
                       std::optional<uint64_t> offset) {
  std::string msg = path + ": " + what;
  if (offset) msg += " at byte offset " + std::to_string(*offset);
  msg += " failed: ";
  msg += std::strerror(err);
  if (err == ENOSPC) msg += " (free disk space, or write to another directory)";
  return Io(std::move(msg));
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(CodeName(code_)) + ": " + message_;
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

}  // namespace k3
