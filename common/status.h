// Status and Result<T>: how every k3 function reports failure.
//
// Goals: a failure carries (1) a category that maps one-to-one onto the documented exit codes
// of every tool (DESIGN.md §6), and (2) a message a user can act on: which file, tensor, flag or
// byte offset, which rule was broken, and what to do. Non-goals: error chaining, stack traces.
// Success is cheap (no allocation). Asserts remain for our own invariants (bugs); Status is for
// anything caused by input, the disk, the network or the machine.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace k3 {

// The categories, numbered by the exit code each one produces.
enum class Code : int {
  kOk = 0,
  kIo = 1,          // could not complete: I/O, network, not enough disk or memory at run time
  kInvalid = 2,     // usage, invalid or unreadable input, untrusted manifest, refusal to start
  kIntegrity = 3,   // bytes differ from what they must be (hash or byte-compare mismatch)
  kUnreliable = 4,  // the run finished but its output cannot be trusted (k3run)
};

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK

  static Status Ok() { return Status(); }
  static Status Io(std::string msg) { return Status(Code::kIo, std::move(msg)); }
  static Status Invalid(std::string msg) { return Status(Code::kInvalid, std::move(msg)); }
  static Status Integrity(std::string msg) { return Status(Code::kIntegrity, std::move(msg)); }
  static Status Unreliable(std::string msg) { return Status(Code::kUnreliable, std::move(msg)); }
  // An I/O failure described by errno, e.g. IoErrno("read", path, EIO, offset).
  static Status IoErrno(const std::string& what, const std::string& path, int err,
                        std::optional<uint64_t> offset = std::nullopt);

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  int exit_code() const { return static_cast<int>(code_); }
  const std::string& message() const { return message_; }
  // "invalid input: <message>" and so on; "OK" for success.
  std::string ToString() const;

  // Returns a copy whose message is "<context>: <message>" (no-op on OK).
  Status WithContext(const std::string& context) const;

 private:
  Status(Code code, std::string msg) : code_(code), message_(std::move(msg)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

const char* CodeName(Code code);

// A value or the Status saying why there is none (absl::StatusOr in spirit).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.ok()) status_ = Status::Invalid("internal: Result built from OK status");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace k3

// Propagate a failed Status to the caller.
#define K3_RETURN_IF_ERROR(expr)            \
  do {                                      \
    ::k3::Status k3_status_ = (expr);       \
    if (!k3_status_.ok()) return k3_status_; \
  } while (0)

#define K3_CONCAT_INNER_(a, b) a##b
#define K3_CONCAT_(a, b) K3_CONCAT_INNER_(a, b)
// K3_ASSIGN_OR_RETURN(auto x, MakeX()); declares x from a Result or returns its Status.
#define K3_ASSIGN_OR_RETURN(decl, expr) \
  K3_ASSIGN_OR_RETURN_IMPL_(K3_CONCAT_(k3_result_, __LINE__), decl, expr)
#define K3_ASSIGN_OR_RETURN_IMPL_(tmp, decl, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  decl = std::move(tmp).value()
