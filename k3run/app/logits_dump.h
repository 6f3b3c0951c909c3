// --dump-logits: float32 little-endian [vocab] per step, written under a temporary name and
// renamed when complete, so a failed run never leaves a plausible-looking dump. The prompt run
// writes one file; --batch writes one per input (FILE.<index>) in the same format, so the two
// can be compared byte for byte.
#pragma once

#include <bit>
#include <cstdint>
#include <memory>
#include <string>

#include "common/env.h"
#include "common/status.h"

namespace k3::run {

static_assert(std::endian::native == std::endian::little,
              "--dump-logits writes float32 little-endian by copying memory");

class LogitsDump {
 public:
  static Result<std::unique_ptr<LogitsDump>> Open(Env* env, const std::string& path);
  ~LogitsDump();  // without Finish: the temporary file is removed
  Status Append(const float* logits, int64_t n);
  Status Finish();

 private:
  LogitsDump(Env* env, std::string path) : env_(env), path_(std::move(path)) {}
  Env* env_;
  std::string path_;
  std::unique_ptr<File> file_;
  std::unique_ptr<BufferedWriter> writer_;
  bool done_ = false;
};

}  // namespace k3::run
