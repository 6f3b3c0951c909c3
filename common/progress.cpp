#include "common/progress.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "common/log.h"

namespace k3 {
namespace {

double SteadySeconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}


// Rate samples closer together than this are noise; the EMA time constant smooths the rest.
constexpr double kRateSampleSeconds = 0.5;
constexpr double kRateTauSeconds = 5.0;
constexpr int kBarWidth = 24;

}  // namespace

bool ParseProgressMode(std::string_view text, ProgressMode* mode) {
  if (text == "auto") *mode = ProgressMode::kAuto;
  else if (text == "bar") *mode = ProgressMode::kBar;
  else if (text == "plain") *mode = ProgressMode::kPlain;
  else if (text == "none") *mode = ProgressMode::kNone;
  else return false;
  return true;
}

std::string FormatIecBytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (!std::isfinite(bytes) || bytes < 0) bytes = 0;
  int unit = 0;
  while (bytes >= 1024.0 && unit < 5) {
    bytes /= 1024.0;
    ++unit;
  }
  char buf[48];
  if (unit == 0) std::snprintf(buf, sizeof(buf), "%.0f B", bytes);
  else std::snprintf(buf, sizeof(buf), "%.2f %s", bytes, kUnits[unit]);
  return buf;
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto total = static_cast<uint64_t>(std::llround(seconds));
  const uint64_t h = total / 3600, m = (total / 60) % 60, s = total % 60;
  char buf[64];
  if (h > 0) {
    std::snprintf(buf, sizeof(buf), "%lluh%02llum%02llus", static_cast<unsigned long long>(h),
                  static_cast<unsigned long long>(m), static_cast<unsigned long long>(s));
  } else if (m > 0) {
    std::snprintf(buf, sizeof(buf), "%llum%02llus", static_cast<unsigned long long>(m),
                  static_cast<unsigned long long>(s));
  } else {
    std::snprintf(buf, sizeof(buf), "%llus", static_cast<unsigned long long>(s));
  }
  return buf;
}

Progress::Progress(std::string label, uint64_t total_bytes, ProgressMode mode)
    : Progress(std::move(label), total_bytes, Quiet() ? ProgressMode::kNone : mode,
               SteadySeconds, WriteStderr, ::isatty(STDERR_FILENO) == 1) {
  if (mode_ == ProgressMode::kNone) return;
  // Without a ticker a stalled transfer (no Add calls) would never redraw or print.
  ticker_ = std::thread([this] {
    const auto period = std::chrono::milliseconds(mode_ == ProgressMode::kBar ? 100 : 1000);
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_ticker_) {
      ticker_cv_.wait_for(lock, period);
      if (!stop_ticker_ && !finished_) MaybeEmitLocked(false);
    }
  });
}

Progress::Progress(std::string label, uint64_t total_bytes, ProgressMode mode, Clock now,
                   Sink sink, bool sink_is_tty)
    : label_(std::move(label)),
      total_(total_bytes),
      mode_(mode),
      now_(std::move(now)),
      sink_(std::move(sink)) {
  if (mode_ == ProgressMode::kAuto) mode_ = sink_is_tty ? ProgressMode::kBar : ProgressMode::kPlain;
  start_ = now_();
  last_emit_ = start_;
  rate_time_ = start_;
}

Progress::~Progress() { Finish(); }

void Progress::Add(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  done_ += bytes;
  MaybeEmitLocked(false);
}

void Progress::SetStatus(std::string s) {
  std::lock_guard<std::mutex> lock(mu_);
  status_ = std::move(s);
  MaybeEmitLocked(false);
}

void Progress::SetStalled(bool stalled) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool changed = stalled != stalled_;
  stalled_ = stalled;
  // A change of state is news in a live bar; plain mode reports it in its next line.
  MaybeEmitLocked(changed && mode_ == ProgressMode::kBar);
}

void Progress::Tick() {
  std::lock_guard<std::mutex> lock(mu_);
  MaybeEmitLocked(false);
}

uint64_t Progress::done_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void Progress::Finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ticker_ = true;
  }
  ticker_cv_.notify_all();
  if (ticker_.joinable()) ticker_.join();

  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  if (mode_ == ProgressMode::kNone) return;
  const double now = now_();
  const double elapsed = now - start_;
  std::string line;
  if (bar_drawn_) line += "\r\033[K";
  line += label_ + ": ";
  if (total_ == 0 || done_ == total_) {
    line += "done, " + FormatIecBytes(static_cast<double>(done_));
  } else {
    line += "stopped at " + FormatIecBytes(static_cast<double>(done_)) + " of " +
            FormatIecBytes(static_cast<double>(total_));
  }
  line += " in " + FormatDuration(elapsed);
  if (elapsed > 0) {
    line += " (" + FormatIecBytes(static_cast<double>(done_) / elapsed) + "/s average)";
  }
  if (!status_.empty()) line += ", " + status_;
  line += "\n";
  sink_(line);
}

void Progress::UpdateRateLocked(double now) {
  const double dt = now - rate_time_;
  if (dt < kRateSampleSeconds) return;
  const double inst = static_cast<double>(done_ - rate_bytes_) / dt;
  if (!have_rate_) {
    rate_ = inst;
    have_rate_ = true;
  } else {
    // Exponential smoothing with a time constant, so irregular sample spacing weighs right.
    const double alpha = 1.0 - std::exp(-dt / kRateTauSeconds);
    rate_ = alpha * inst + (1.0 - alpha) * rate_;
  }
  rate_time_ = now;
  rate_bytes_ = done_;
}

void Progress::MaybeEmitLocked(bool force) {
  if (finished_ || mode_ == ProgressMode::kNone) return;
  const double now = now_();
  UpdateRateLocked(now);
  const double interval =
      mode_ == ProgressMode::kBar ? kBarIntervalSeconds : kPlainIntervalSeconds;
  if (!force && now - last_emit_ < interval) return;
  last_emit_ = now;
  if (mode_ == ProgressMode::kBar) {
    sink_(BarLineLocked(now));
    bar_drawn_ = true;
  } else {
    sink_(PlainLineLocked(now));
  }
}

namespace {

std::string RateAndEta(bool have_rate, double rate, uint64_t done, uint64_t total) {
  std::string s;
  if (!have_rate) return "-- /s";
  s += FormatIecBytes(rate) + "/s";
  if (total > done && rate > 0) {
    s += ", ETA " + FormatDuration(static_cast<double>(total - done) / rate);
  }
  return s;
}

}  // namespace

std::string Progress::BarLineLocked(double /*now*/) const {
  std::string line = "\r" + label_ + " ";
  if (total_ > 0) {
    const double frac = std::min(1.0, static_cast<double>(done_) / static_cast<double>(total_));
    const int filled = static_cast<int>(frac * kBarWidth);
    // Appended piece by piece: GCC 12 at -O3 reports a false -Wrestrict for "[" + string&&.
    line += '[';
    line.append(static_cast<size_t>(filled), '#');
    line.append(static_cast<size_t>(kBarWidth - filled), '-');
    line += "] ";
    char pct[16];
    std::snprintf(pct, sizeof(pct), "%3.0f%% ", frac * 100.0);
    line += pct;
    line += FormatIecBytes(static_cast<double>(done_)) + "/" +
            FormatIecBytes(static_cast<double>(total_));
  } else {
    line += FormatIecBytes(static_cast<double>(done_));
  }
  line += "  " + RateAndEta(have_rate_, rate_, done_, total_);
  if (!status_.empty()) line += "  " + status_;
  if (stalled_) line += "  STALLED";
  line += "\033[K";  // clear what a longer previous line left behind
  return line;
}

std::string Progress::PlainLineLocked(double now) const {
  std::string line = label_ + ": " + FormatIecBytes(static_cast<double>(done_));
  if (total_ > 0) {
    char pct[16];
    std::snprintf(pct, sizeof(pct), " (%.0f%%)",
                  100.0 * std::min(1.0, static_cast<double>(done_) / static_cast<double>(total_)));
    line += " of " + FormatIecBytes(static_cast<double>(total_)) + pct;
  }
  line += ", " + RateAndEta(have_rate_, rate_, done_, total_);
  line += ", elapsed " + FormatDuration(now - start_);
  if (!status_.empty()) line += ", " + status_;
  if (stalled_) line += ", stalled";
  line += "\n";
  return line;
}

}  // namespace k3
