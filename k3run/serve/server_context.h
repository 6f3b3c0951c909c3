// What every part of the server shares (k3run/serve/server.h): the engine, the scheduler once the
// weights are loaded, the served model, limits, and the lifecycle state.
// Thread safety: the fields set before the listener starts are read-only afterwards; `phase`
// is atomic; `scheduler` is set by the engine thread before `phase` becomes kReady (release)
// and may be used by any thread that saw kReady or kStopping (acquire), until the listener has
// stopped.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "k3run/engine/grammar_constraint.h"
#include "k3run/engine/scheduler.h"
#include "k3run/engine/session.h"
#include "k3run/serve/server_images.h"
#include "k3run/text/chat_template.h"

namespace k3::run {

inline int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

enum class ServerPhase { kLoading, kReady, kStopping };

struct ServerContext {
  Engine* engine = nullptr;
  const tok::Tokenizer* tokenizer = nullptr;  // null: the prepared directory has none
  std::optional<ChatTemplate> chat;           // null: no chat template tokens
  // Compiled constraint grammars (response_format, forced tool calls); null without a tokenizer.
  std::unique_ptr<GrammarLibrary> grammars;
  std::string model;
  int64_t context = 0;     // positions per sequence (--ctx)
  int64_t max_seqs = 1;
  int64_t max_queue = 0;
  std::string api_key;     // "": no key required
  bool web = false;        // --web: GET / serves the chat page
  int64_t created = 0;     // Unix seconds at start (/v1/models)
  ServerVision vision;     // images: the encoder (or why there is none) and the limits

  std::atomic<ServerPhase> phase{ServerPhase::kLoading};
  std::unique_ptr<Scheduler> scheduler;
  std::atomic<int64_t> rejected{0};       // 429s
  // Requests submitted and not yet ended (running or waiting): admission allows max_seqs +
  // max_queue. Counted here rather than by the scheduler's queue bound, which counts a request
  // as waiting until the next pass gives it a free slot (so a bound of 0 would refuse all).
  std::atomic<int64_t> in_flight{0};
  std::atomic<int64_t> open_requests{0};  // submitted, response not yet complete
  // When shutdown began (steady clock): requests not ended by CancelAll within the grace end
  // themselves with an error.
  std::atomic<int64_t> stop_ns{0};
  std::atomic<bool> engine_done{false};   // the engine thread has returned

  bool stopping() const { return phase.load(std::memory_order_acquire) == ServerPhase::kStopping; }
  bool ready() const { return phase.load(std::memory_order_acquire) == ServerPhase::kReady; }
  // Shutdown has lasted longer than `seconds`.
  bool StoppedFor(double seconds) const {
    const int64_t t0 = stop_ns.load();
    if (t0 == 0) return false;
    return static_cast<double>(SteadyNs() - t0) * 1e-9 > seconds;
  }
};

}  // namespace k3::run
