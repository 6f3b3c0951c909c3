// Progress: how long-running tools (download, pack, verify, synth) show that they are working.
//
// Modes: kBar draws one live line on stderr (bytes done/total in IEC units, smoothed rate, ETA,
// a status text such as "layer 12/93", and "stalled" when the caller says so), redrawn at most
// 10 times per second. kPlain prints one summary line every 30 s (for logs and CI, where a bar
// would be noise). kAuto is kBar when stderr is a terminal, else kPlain. kNone prints nothing.
// Every mode except kNone prints one final summary line from Finish().
//
// Thread safety: Add, SetStatus and SetStalled may be called from any thread concurrently.
// Finish and the destructor must not race with other calls.
//
// Tests inject the clock and the output sink through the second constructor, so no test needs
// a terminal or real time.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <string>
#include <string_view>

namespace k3 {

enum class ProgressMode { kAuto, kBar, kPlain, kNone };

// "auto" | "bar" | "plain" | "none" (the --progress flag's values); false for anything else.
bool ParseProgressMode(std::string_view text, ProgressMode* mode);

// 1536 → "1.50 KiB"; bytes below 1024 print as "N B".
std::string FormatIecBytes(double bytes);
// Seconds as "1h02m03s", "4m05s" or "7s"; "?" for negative or non-finite values.
std::string FormatDuration(double seconds);

class Progress {
 public:
  using Clock = std::function<double()>;              // monotonic seconds
  using Sink = std::function<void(std::string_view)>;  // receives whole lines or bar redraws

  // Real clock (steady_clock) and stderr.
  Progress(std::string label, uint64_t total_bytes, ProgressMode mode);
  // Injected clock and sink (tests). kAuto resolves with `sink_is_tty`.
  Progress(std::string label, uint64_t total_bytes, ProgressMode mode, Clock now, Sink sink,
           bool sink_is_tty = false);
  ~Progress();  // Finish() if not called
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void Add(uint64_t bytes);
  void SetStatus(std::string s);
  void SetStalled(bool stalled);
  // Prints the final summary line: bytes, elapsed time, average rate. Idempotent.
  void Finish();
  // Re-evaluates the display without new bytes (time passes, so ETA and "stalled" change).
  // The real-clock constructor runs a ticker thread that calls this; tests call it directly.
  void Tick();

  // The mode after resolving kAuto.
  ProgressMode mode() const { return mode_; }
  uint64_t done_bytes() const;

  // Seconds between plain-mode lines and minimum seconds between bar redraws.
  static constexpr double kPlainIntervalSeconds = 30.0;
  static constexpr double kBarIntervalSeconds = 0.1;

 private:
  void MaybeEmitLocked(bool force);
  std::string BarLineLocked(double now) const;
  std::string PlainLineLocked(double now) const;
  void UpdateRateLocked(double now);

  const std::string label_;
  const uint64_t total_;
  ProgressMode mode_;
  Clock now_;
  Sink sink_;

  mutable std::mutex mu_;
  uint64_t done_ = 0;
  std::string status_;
  bool stalled_ = false;
  bool finished_ = false;
  bool bar_drawn_ = false;
  double start_ = 0;
  double last_emit_ = 0;
  std::thread ticker_;
  std::condition_variable ticker_cv_;
  bool stop_ticker_ = false;
  double rate_time_ = 0;     // time of the last rate sample
  uint64_t rate_bytes_ = 0;  // done_ at the last rate sample
  double rate_ = 0;          // EMA of bytes/s
  bool have_rate_ = false;
};

}  // namespace k3
