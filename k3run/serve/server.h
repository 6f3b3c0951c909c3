// `k3run PREPARED --serve`: an OpenAI-compatible HTTP server over the multi-sequence scheduler
// (DESIGN.md §11.5; the user's view: docs/SERVER.md).
//
// Threads: the front door (front_door.h), which reads every request whole within its deadlines
// and answers /health itself; a worker pool that runs whole requests through cpp-httplib's
// routing (gated_http.h): max_seqs + queue + kSpareWorkers workers (a streamed response holds
// its worker until it ends, so admission — 429 when the scheduler's queue is full — is decided
// by a worker that never blocks on a full queue); one
// engine thread that loads the weights, then runs `while running { WaitForWork(); RunPass(); }`
// (every scheduler callback runs there); the caller's thread, which waits for SIGTERM/SIGINT or
// a failed load and then shuts down: stop admitting, CancelAll, let streams end with an error
// chunk, stop the front door, exit within kShutdownSeconds.
// The front door starts before the weights load: /health answers 503 until they are loaded.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"
#include "k3run/engine/session.h"
#include "k3run/serve/front_door.h"
#include "k3run/serve/openai_request.h"
#include "k3run/serve/server_images.h"

namespace k3::run {

struct ServeOptions {
  bool serve = false;                 // --serve
  std::string host = "127.0.0.1";     // --host
  int port = 8080;                    // --port; 0: any free port (printed)
  int64_t queue = 16;                 // --queue: requests that may wait for a slot
  std::string api_key_file;           // --api-key-file
  double prompt_cache_gb = 0;         // --prompt-cache-gb (0: off)
  // --spec N, --spec-fixed: greedy requests without tools or response_format speculate in the
  // shared passes (scheduler.h); the others decode without drafts. The plan holds spec_rows N.
  int64_t spec = 0;
  bool spec_fixed = false;
  bool web = false;                   // --web: the chat page at / (web_page.h)
  // --max-image-tokens: the image tokens one request may hold (server_images.h); the memory
  // plan holds the tower for them.
  int64_t max_image_tokens = kDefaultMaxImageTokens;
  // --header-timeout, --body-timeout, --max-connections; bodies up to kMaxBodyBytes.
  FrontDoorLimits limits = [] {
    FrontDoorLimits l;
    l.max_body_bytes = kMaxBodyBytes;
    return l;
  }();
};

// Workers beyond max_seqs + queue: they answer /health, /metrics and 429s while every slot and
// queue place holds a worker.
inline constexpr int64_t kSpareWorkers = 4;
// A response write that cannot proceed this long (a client that stopped reading) fails it.
inline constexpr double kWriteSeconds = 10;
// SIGTERM to exit, at most.
inline constexpr double kShutdownSeconds = 5;

// `engine`: opened with a tokenizer or not, planned for `max_seqs` sequences of the context the
// caller chose; its weights are NOT loaded (the server loads them behind /health). `model`: the
// one model /v1/models lists and requests may name. `vision`: the tower, opened once (the plan
// holds VisionEncoder::PlanBytes(max_image_tokens)); null on a text-only directory, then image
// requests get 400 "no vision: " + `no_vision`. Blocks until shut down; Ok after a signal.
Status RunServer(Engine* engine, const ServeOptions& o, const std::string& model,
                 int64_t max_seqs, VisionEncoder* vision = nullptr,
                 const std::string& no_vision = "");

}  // namespace k3::run
