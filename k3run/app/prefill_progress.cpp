#include "k3run/app/prefill_progress.h"

#include <cstdio>
#include <utility>

namespace k3::run {

std::string PrefillLine(int64_t done, int64_t total, double seconds) {
  const double rate = seconds > 0 ? double(done) / seconds : 0.0;
  const double eta = rate > 0 ? double(total - done) / rate : -1.0;
  char buf[160];
  std::snprintf(buf, sizeof buf, "prefill %lld/%lld tokens (%d%%), %.1f tok/s, %s %s",
                static_cast<long long>(done), static_cast<long long>(total),
                total > 0 ? static_cast<int>(100 * done / total) : 100, rate,
                done == total ? "took" : "ETA",
                FormatDuration(done == total ? seconds : eta).c_str());
  return buf;
}

PrefillProgress::PrefillProgress(ProgressMode mode, int64_t chunk, Sink sink)
    : mode_(mode), chunk_(chunk), sink_(std::move(sink)) {}

void PrefillProgress::Update(int64_t done, int64_t total, double seconds) {
  if (mode_ == ProgressMode::kNone || mode_ == ProgressMode::kAuto || total <= chunk_) return;
  const bool last = done == total;
  if (mode_ == ProgressMode::kBar) {
    if (!last && seconds - last_shown_ < Progress::kBarIntervalSeconds) return;
    sink_("\r\x1b[K" + PrefillLine(done, total, seconds) + (last ? "\n" : ""));
  } else {
    if (!last && seconds - last_shown_ < Progress::kPlainIntervalSeconds) return;
    sink_(PrefillLine(done, total, seconds) + "\n");
  }
  last_shown_ = seconds;
}

}  // namespace k3::run
