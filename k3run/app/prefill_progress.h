// How the CLI shows a long prompt being fed (DESIGN.md §11.3 "progress events"): the engine's
// kPrefill events rendered under the --progress rules of common/progress.h. On a terminal (bar)
// one line redrawn in place at most 10 times a second; in plain mode (logs, CI) a line every
// 30 s; the final line always, when the prompt took more than one pass. Nothing with none.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "common/progress.h"

namespace k3::run {

// "prefill 1,024/4,096 tokens (25%), 85.3 tok/s, ETA 36s".
std::string PrefillLine(int64_t done, int64_t total, double seconds);

class PrefillProgress {
 public:
  using Sink = std::function<void(std::string_view)>;
  // `mode` already resolved (kBar, kPlain or kNone); `chunk`: rows per pass.
  PrefillProgress(ProgressMode mode, int64_t chunk, Sink sink);
  void Update(int64_t done, int64_t total, double seconds);

 private:
  ProgressMode mode_;
  int64_t chunk_;
  Sink sink_;
  double last_shown_ = -1e9;
};

}  // namespace k3::run
