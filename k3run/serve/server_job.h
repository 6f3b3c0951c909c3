// One completion request of the server (k3run/serve/server.h), from its parsed body to its
// response: the prompt's ids, the scheduler Request whose callbacks (engine thread) decide the
// text (StreamText) and stop on a stop string or a client gone, and the two ways of answering:
// the whole body when done, or SSE chunks as the text is decided (keep-alive comments while
// the prompt prefills or a pass runs, so a client that left is noticed and cancelled).
// Thread safety: a Job is shared by the engine thread (callbacks) and the one HTTP worker that
// answers its request; its fields are under `mu` except `text` (engine thread until `done`).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <httplib.h>

#include "k3run/serve/openai_request.h"
#include "k3run/serve/openai_response.h"
#include "k3run/serve/server_context.h"
#include "k3run/serve/stream_text.h"

namespace k3::run {

// The prompt of `r` as ids, checked against the vocabulary and the context (400 otherwise);
// `*max_tokens` gets the tokens it may generate (max_tokens, or up to the context).
bool BuildPrompt(const ServerContext& ctx, const ApiRequest& r, std::vector<int32_t>* ids,
                 int64_t* max_tokens, ApiError* error);

struct Job {
  Job(ServerContext& ctx, const ApiRequest& r);

  ServerContext& ctx;
  ApiRequest request;
  ResponseMeta meta;
  std::shared_ptr<TokenConstraint> constraint;  // structured output (structured_output.h)
  // Images: their rows, encoded at admission on the engine thread (server_images.h); null: none.
  MediaEncoder encode_media;
  std::shared_ptr<ImageStats> image_stats;  // what encode_media did (engine thread)
  int64_t id = -1;             // the scheduler's
  int64_t submitted_ns = 0;

  std::mutex mu;
  std::condition_variable cv;
  TextDelta pending;           // decided, not yet sent (streaming)
  int64_t prefill_ticks = 0;   // on_prefill calls not yet answered with a keep-alive
  bool done = false;
  RequestResult result;
  std::atomic<bool> gone{false};  // the client left: the next callback stops the request
  StreamText text;
};

// Submits the job (its prompt and token limit). false with *error: 429 (queue full, with
// Retry-After), 503 (shutting down) or 500.
bool SubmitJob(const std::shared_ptr<Job>& job, std::vector<int32_t> prompt, int64_t max_tokens,
               ApiError* error);
// Non-streamed: blocks until the request ends, then fills `res` (200, or the error). A client
// that closes its connection meanwhile cancels the request (its slot frees at the next pass).
void AnswerWhole(const std::shared_ptr<Job>& job, const httplib::Request& req,
                 httplib::Response& res);
// Streamed: sets `res` up to send SSE chunks as the text is decided.
void AnswerStream(const std::shared_ptr<Job>& job, httplib::Response& res);

}  // namespace k3::run
