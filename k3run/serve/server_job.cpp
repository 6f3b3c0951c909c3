#include "k3run/serve/server_job.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <random>

#include "common/log.h"
#include "k3run/serve/client_socket.h"
#include "k3run/engine/stop_rules.h"

namespace k3::run {
namespace {

using std::chrono::milliseconds;

// Shutdown: a request that CancelAll has not ended after this long ends itself with an error
// (a pass of the released model takes tens of seconds; the process must exit within 5 s).
constexpr double kStopGraceSeconds = 2.0;
// A stream with nothing to send for this long sends a keep-alive comment: clients and proxies
// see a live connection, and a client that left is noticed at the write.
constexpr milliseconds kKeepAliveEvery{1000};

const char* IdPrefix(Endpoint e) { return e == Endpoint::kChat ? "chatcmpl-" : "cmpl-"; }

ApiError ServerError(int http, std::string message, std::string code) {
  ApiError e;
  e.http = http;
  e.message = std::move(message);
  e.type = http == 503 ? "server_unavailable" : "server_error";
  e.code = std::move(code);
  return e;
}

void SetError(httplib::Response& res, const ApiError& e) {
  res.status = e.http;
  res.set_content(ErrorBody(e), "application/json");
}

// The error a request that did not complete answers with.
ApiError NotCompleted(const ServerContext& ctx, const RequestResult& r, bool finished) {
  if (!finished || r.reason == FinishReason::kCancelled) {
    return ServerError(503, ctx.stopping() ? "the server is shutting down" : "request cancelled",
                       ctx.stopping() ? "shutting_down" : "cancelled");
  }
  // Shutdown interrupts the pass in flight (Engine::Interrupt): its requests end with that.
  if (ctx.stopping() && r.status.code() == Code::kIo) {
    return ServerError(503, "the server is shutting down (" + r.status.message() + ")",
                       "shutting_down");
  }
  return ServerError(500, r.status.ToString(), r.status.code() == Code::kUnreliable
                                                   ? "run_invalid"
                                                   : "engine_error");
}

// `text`: the job's, finished (its tool calls decide "tool_calls").
Outcome OutcomeOf(const RequestResult& r, const StreamText& text) {
  Outcome o;
  o.finish_reason = OpenAiFinishReason(r.reason);
  // A message that ended with its tools section (at an end token) asks for the calls' results.
  if (text.ended_with_calls() && r.reason == FinishReason::kStopId) o.finish_reason = "tool_calls";
  o.prompt_tokens = r.prompt_tokens;
  o.completion_tokens = static_cast<int64_t>(r.generated.size());
  o.cached_tokens = r.prompt_tokens - r.prompt_fed;
  o.generated_ids = r.generated;
  return o;
}

// One stderr line per request: id, tokens in (of which from the prompt cache) and out, time.
void LogRequest(Endpoint e, const RequestResult& r, const ImageStats* images) {
  const double decode = r.seconds - r.first_token_seconds;
  const auto out = static_cast<double>(r.generated.size());
  char line[256];
  std::snprintf(line, sizeof line,
                "request %s%lld: %lld tokens in (%lld cached), %zu out, %.2f s (queued %.2f, "
                "first token %.2f), %.1f tok/s, %s",
                IdPrefix(e), static_cast<long long>(r.id), static_cast<long long>(r.prompt_tokens),
                static_cast<long long>(r.prompt_tokens - r.prompt_fed), r.generated.size(),
                r.seconds, r.queued_seconds, r.first_token_seconds,
                out > 1 && decode > 0 ? (out - 1) / decode : 0.0, FinishReasonName(r.reason));
  std::string text = line;
  if (images != nullptr && images->images > 0) {  // this request's images were encoded
    std::snprintf(line, sizeof line, ", %lld image%s (%lld tokens, tower %.2f s%s",
                  static_cast<long long>(images->images), images->images == 1 ? "" : "s",
                  static_cast<long long>(images->tokens), images->tower_seconds,
                  images->load_seconds > 0 ? ", vision.bin read" : "");
    text += line;
    if (images->reused > 0) {  // rows the prompt cache held: no tower run for these
      std::snprintf(line, sizeof line, ", %lld held", static_cast<long long>(images->reused));
      text += line;
    }
    text += ")";
  }
  if (r.spec.drafted > 0) {  // --spec: this request's drafts
    std::snprintf(line, sizeof line, ", %lld of %lld drafted kept",
                  static_cast<long long>(r.spec.accepted), static_cast<long long>(r.spec.drafted));
    text += line;
  }
  LogInfo(text);
}

Request MakeRequest(const std::shared_ptr<Job>& job, std::vector<int32_t> prompt,
                    int64_t max_tokens) {
  Request q;
  q.prompt = std::move(prompt);
  q.max_tokens = max_tokens;
  q.sampling = job->request.sampling;
  // Sampled without a seed: a fresh one (OpenAI's behaviour); greedy ignores it.
  q.seed = job->request.seed ? *job->request.seed
                             : (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  if (!job->request.ignore_eos) q.stop_ids = EndTokenIds(job->ctx.tokenizer);
  q.constraint = job->constraint;
  q.encode_media = job->encode_media;
  Job* j = job.get();  // the callbacks keep `job` alive through on_done
  q.on_token = [job](int32_t token, const float*) {
    TextDelta d = job->text.Token(token);
    const bool stop = job->text.stopped();
    {
      std::lock_guard<std::mutex> lock(job->mu);
      AppendDelta(&job->pending, std::move(d));
    }
    job->cv.notify_all();
    return !stop && !job->gone.load();
  };
  q.on_prefill = [j](int64_t, int64_t) {
    {
      std::lock_guard<std::mutex> lock(j->mu);
      ++j->prefill_ticks;
    }
    j->cv.notify_all();
  };
  q.on_done = [job](const RequestResult& r) {
    job->ctx.in_flight.fetch_sub(1);
    const bool completed = OpenAiFinishReason(r.reason) != nullptr;
    const TextDelta d = completed ? job->text.Finish() : TextDelta{};
    LogRequest(job->request.endpoint, r, job->image_stats.get());
    {
      std::lock_guard<std::mutex> lock(job->mu);
      AppendDelta(&job->pending, d);
      job->result = r;
      job->done = true;
    }
    job->cv.notify_all();
  };
  return q;
}

}  // namespace

bool BuildPrompt(const ServerContext& ctx, const ApiRequest& r, std::vector<int32_t>* ids,
                 int64_t* max_tokens, ApiError* error) {
  if (r.endpoint == Endpoint::kChat) {
    if (!ctx.chat) {
      *error = BadRequest("this model has no chat template (its tokenizer lacks the chat "
                          "tokens): use /v1/completions", "messages");
      return false;
    }
    Result<std::vector<int32_t>> rendered =
        ctx.chat->RenderChecked(r.messages, r.tmpl, /*generation_prompt=*/true);
    if (!rendered.ok()) {
      *error = BadRequest(rendered.status().message(), "messages");
      return false;
    }
    *ids = std::move(rendered).value();
  } else if (r.prompt) {
    if (ctx.tokenizer == nullptr) {
      *error = BadRequest("this model has no tokenizer: send the prompt as token ids", "prompt");
      return false;
    }
    // As the CLI's --prompt: the text may name special tokens (the upstream default).
    *ids = ctx.tokenizer->Encode(*r.prompt, /*allow_special=*/true);
  } else {
    *ids = r.prompt_ids;
  }
  const int64_t vocab = ctx.engine->config().vocab;
  for (int32_t id : *ids) {
    if (id >= vocab) {
      *error = BadRequest("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                          std::to_string(vocab) + ")", "prompt");
      return false;
    }
  }
  const auto P = static_cast<int64_t>(ids->size());
  if (P == 0) {
    *error = BadRequest("the prompt is empty (0 tokens)", "prompt");
    return false;
  }
  // N generated tokens need P + N − 1 positions (the last one is never fed back).
  const int64_t room = ctx.context - P + 1;
  const int64_t want = r.max_tokens.value_or(room);
  if (room < 1 || want > room) {
    int64_t image_tokens = 0;
    for (const ChatMessage& m : r.messages) {
      for (const ChatImage& i : m.images) image_tokens += i.tokens;
    }
    *error = BadRequest("the prompt has " + std::to_string(P) + " tokens" +
                            (image_tokens > 0 ? " (of which " + std::to_string(image_tokens) +
                                                    " image tokens)"
                                              : "") +
                            (r.max_tokens ? " and max_tokens is " + std::to_string(want) : "") +
                            ": more than the context of " + std::to_string(ctx.context) +
                            " positions (--ctx) holds",
                        r.max_tokens && room >= 1 ? "max_tokens" : "messages",
                        "context_length_exceeded");
    if (r.endpoint == Endpoint::kCompletion && !(r.max_tokens && room >= 1)) {
      error->param = "prompt";
    }
    return false;
  }
  *max_tokens = want;
  return true;
}

Job::Job(ServerContext& c, const ApiRequest& r)
    : ctx(c), request(r),
      text(c.tokenizer, r.endpoint == Endpoint::kChat && c.chat ? &*c.chat : nullptr,
           r.tmpl.thinking, r.stop, /*tools=*/!r.tools.empty(),
           // Call ids: reproducible with a seed, fresh otherwise (as OpenAI's are).
           r.seed ? *r.seed : (uint64_t{std::random_device{}()} << 32) | std::random_device{}()) {
  meta.created = static_cast<int64_t>(std::time(nullptr));
  meta.model = c.model;
  meta.endpoint = r.endpoint;
  meta.thinking = r.endpoint == Endpoint::kChat && r.tmpl.thinking;
}

bool SubmitJob(const std::shared_ptr<Job>& job, std::vector<int32_t> prompt, int64_t max_tokens,
               ApiError* error) {
  ServerContext& ctx = job->ctx;
  if (!ctx.ready()) {
    *error = ServerError(503, ctx.stopping() ? "the server is shutting down"
                                             : "the model is loading; retry when /health is 200",
                         ctx.stopping() ? "shutting_down" : "loading");
    return false;
  }
  // Admission before anything waits: a slot or a queue place, or 429 now.
  int64_t n = ctx.in_flight.load();
  do {
    if (n >= ctx.max_seqs + ctx.max_queue) {
      ctx.rejected.fetch_add(1);
      *error = ServerError(429, "the server is busy: " + std::to_string(ctx.max_seqs) +
                                    " requests run and " + std::to_string(ctx.max_queue) +
                                    " wait (--max-seqs, --queue); retry later", "queue_full");
      error->type = "rate_limit_error";
      return false;
    }
  } while (!ctx.in_flight.compare_exchange_weak(n, n + 1));
  job->submitted_ns = SteadyNs();
  Result<int64_t> id = ctx.scheduler->Submit(MakeRequest(job, std::move(prompt), max_tokens));
  if (!id.ok()) {
    ctx.in_flight.fetch_sub(1);
    if (id.status().code() == Code::kIo) {
      ctx.rejected.fetch_add(1);
      *error = ServerError(429, "the server is busy: " + id.status().message() +
                                    "; retry later", "queue_full");
      error->type = "rate_limit_error";
    } else if (id.status().code() == Code::kInvalid) {
      *error = BadRequest(id.status().message());
    } else {
      *error = ServerError(500, id.status().ToString(), "engine_error");
    }
    return false;
  }
  job->id = *id;
  job->meta.id = IdPrefix(job->request.endpoint) + std::to_string(*id);
  ctx.open_requests.fetch_add(1);
  return true;
}

void AnswerWhole(const std::shared_ptr<Job>& job, const httplib::Request& req,
                 httplib::Response& res) {
  ServerContext& ctx = job->ctx;
  const ClientSocket client =
      ClientSocket::Find(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
  bool done = false;
  RequestResult r;
  {
    std::unique_lock<std::mutex> lock(job->mu);
    while (!job->done && !ctx.StoppedFor(kStopGraceSeconds)) {
      job->cv.wait_for(lock, milliseconds(200));
      if (!job->done && !job->gone.load() && client.Closed()) {
        job->gone.store(true);
        ctx.scheduler->Cancel(job->id);
      }
    }
    done = job->done;
    if (done) r = job->result;
  }
  if (!done || OpenAiFinishReason(r.reason) == nullptr) {
    SetError(res, NotCompleted(ctx, r, done));
  } else {
    res.status = 200;
    res.set_content(CompletionBody(job->meta, job->text.content(), job->text.reasoning(),
                                   OutcomeOf(r, job->text), job->text.tool_calls()),
                    "application/json");
  }
  ctx.open_requests.fetch_sub(1);
}

namespace {

// The body of a streamed response: runs on its HTTP worker until the request ends or the
// client leaves (a failed write cancels the request, so its slot frees at the next pass).
bool StreamLoop(const std::shared_ptr<Job>& job, httplib::DataSink& sink) {
  ServerContext& ctx = job->ctx;
  auto write = [&](const std::string& s) {
    if (sink.write(s.data(), s.size())) return true;
    job->gone.store(true);
    ctx.scheduler->Cancel(job->id);
    return false;
  };
  const bool chat = job->request.endpoint == Endpoint::kChat;
  if (chat && !write(DeltaChunk(job->meta, TextDelta{}, /*role=*/true))) return false;
  auto last_write = std::chrono::steady_clock::now();
  while (true) {
    TextDelta d;
    int64_t ticks = 0;
    bool done = false;
    RequestResult r;
    {
      std::unique_lock<std::mutex> lock(job->mu);
      job->cv.wait_for(lock, kKeepAliveEvery, [&] {
        return !job->pending.empty() || job->prefill_ticks > 0 || job->done;
      });
      d = std::move(job->pending);
      job->pending = TextDelta{};
      ticks = std::exchange(job->prefill_ticks, 0);
      done = job->done;
      if (done) r = job->result;
    }
    const auto now = std::chrono::steady_clock::now();
    if (!d.empty()) {
      if (!write(DeltaChunk(job->meta, d, false))) return false;
      last_write = now;
    }
    if (done) {
      const bool ok = OpenAiFinishReason(r.reason) != nullptr;
      const std::string tail = ok ? FinalChunks(job->meta, OutcomeOf(r, job->text),
                                                job->request.include_usage)
                                  : ErrorChunk(NotCompleted(ctx, r, true));
      if (!write(tail)) return false;
      sink.done();
      return true;
    }
    if (ctx.StoppedFor(kStopGraceSeconds)) {
      (void)write(ErrorChunk(NotCompleted(ctx, r, false)));
      sink.done();
      return true;
    }
    if (d.empty() && (ticks > 0 || now - last_write >= kKeepAliveEvery)) {
      if (!write(kKeepAlive)) return false;
      last_write = now;
    }
  }
}

}  // namespace

void AnswerStream(const std::shared_ptr<Job>& job, httplib::Response& res) {
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  auto released = std::make_shared<std::atomic<bool>>(false);
  res.set_chunked_content_provider(
      "text/event-stream",
      [job](size_t, httplib::DataSink& sink) { return StreamLoop(job, sink); },
      // Always called once the response is gone (a Response copy may call it again: once only).
      // A stream that never started or broke off cancels its request.
      [job, released](bool) {
        if (released->exchange(true)) return;
        bool done = false;
        {
          std::lock_guard<std::mutex> lock(job->mu);
          done = job->done;
        }
        if (!done) {
          job->gone.store(true);
          job->ctx.scheduler->Cancel(job->id);
        }
        job->ctx.open_requests.fetch_sub(1);
      });
}

}  // namespace k3::run
