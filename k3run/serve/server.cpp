// The server's lifecycle (see server.h): bind, load behind /health, serve, shut down on a signal.
#include "k3run/serve/server.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <ctime>
#include <thread>

#include <httplib.h>

#include "common/log.h"
#include "k3run/serve/front_door.h"
#include "k3run/serve/gated_http.h"
#include "k3run/serve/openai_request.h"
#include "k3run/serve/server_context.h"
#include "k3run/serve/server_routes.h"
#include "k3run/engine/stop_rules.h"

namespace k3::run {
namespace {

// Signals reach the serving thread through a pipe: a handler may only do async-signal-safe
// things, and any thread may take a process-directed signal.
int g_wake_fd = -1;

void OnSignal(int) {
  const int saved = errno;
  if (g_wake_fd >= 0) (void)!::write(g_wake_fd, "s", 1);
  errno = saved;
}

class WakePipe {
 public:
  Status Open() {
    if (::pipe2(fds_, O_CLOEXEC) != 0) return Status::IoErrno("pipe", "signal pipe", errno);
    g_wake_fd = fds_[1];
    struct sigaction sa = {};
    sa.sa_handler = OnSignal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGTERM, &sa, nullptr);
    ::sigaction(SIGINT, &sa, nullptr);
    ::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not a death
    return Status::Ok();
  }
  ~WakePipe() {
    g_wake_fd = -1;
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }
  // From a thread (a failed load): wake the serving thread as a signal would.
  void Poke() { (void)!::write(fds_[1], "f", 1); }
  void Wait() {
    char c = 0;
    while (::read(fds_[0], &c, 1) < 0 && errno == EINTR) {
    }
  }

 private:
  int fds_[2] = {-1, -1};
};

Result<std::string> ReadApiKey(Env* env, const std::string& path) {
  if (path.empty()) return std::string();
  Result<std::string> text = ReadFileToString(env, path, 4096);
  if (!text.ok()) return Status::Invalid("--api-key-file: " + text.status().message());
  std::string key = *text;
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r' || key.back() == ' ')) {
    key.pop_back();
  }
  if (key.empty() || key.find_first_of(" \t\r\n") != std::string::npos) {
    return Status::Invalid("--api-key-file " + path + ": expected one key (no spaces) on one "
                           "line");
  }
  return key;
}

// The engine thread: load the weights (the listener already answers /health 503), then run
// passes until told to stop.
void EngineThread(ServerContext* ctx, const SchedulerOptions& so, std::atomic<bool>* run,
                  Status* load, WakePipe* wake) {
  struct Done {
    ServerContext* ctx;
    ~Done() { ctx->engine_done.store(true); }
  } done{ctx};
  *load = ctx->engine->LoadWeights();
  if (!load->ok()) {
    wake->Poke();
    return;
  }
  ctx->scheduler = std::make_unique<Scheduler>(ctx->engine, so);
  ServerPhase loading = ServerPhase::kLoading;
  if (!ctx->phase.compare_exchange_strong(loading, ServerPhase::kReady)) return;
  LogInfo("ready: serving " + ctx->model);
  while (run->load()) {
    ctx->scheduler->WaitForWork();
    if (!run->load()) break;
    Result<bool> pass = ctx->scheduler->RunPass();
    // A failing pass ended the requests it carried; the server goes on.
    if (!pass.ok()) LogWarn("pass failed: " + pass.status().ToString());
  }
}

void Configure(httplib::Server& svr, const FrontDoorLimits& limits) {
  svr.set_payload_max_length(limits.max_body_bytes);
  // What the Keep-Alive response header tells clients: the front door's wait for a next request.
  svr.set_keep_alive_timeout(static_cast<time_t>(limits.head_seconds));
  svr.set_keep_alive_max_count(1000);
}

// The front door's handlers: /health from the lifecycle state, errors in the OpenAI form, and
// whole requests to the worker pool.
FrontDoor::Handlers DoorHandlers(const ServerContext& ctx, GatedHttpServer* svr,
                                 httplib::ThreadPool* pool) {
  FrontDoor::Handlers h;
  h.health = [&ctx] { return HealthReply(ctx); };
  h.error_body = FrontDoorErrorBody;
  h.dispatch = [svr, pool](FrontDoor* door, std::shared_ptr<GatedConnection> c) {
    pool->enqueue([svr, door, c] {
      if (svr->Serve(c.get(), kWriteSeconds)) {
        door->Resume(c);
      } else {
        door->Close(c);
      }
    });
  };
  return h;
}

// Waits until `pred` or `seconds` passed.
template <typename Pred>
bool WaitUntil(Pred pred, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace

Status RunServer(Engine* engine, const ServeOptions& o, const std::string& model,
                 int64_t max_seqs, VisionEncoder* vision, const std::string& no_vision) {
  ServerContext ctx;
  ctx.engine = engine;
  ctx.tokenizer = engine->tokenizer();
  if (ctx.tokenizer != nullptr) {
    Result<ChatTemplate> t = ChatTemplate::Create(ctx.tokenizer, model);
    if (t.ok()) ctx.chat.emplace(std::move(t).value());
    // Chat grammars name every added token, the end tokens included (structured_output.h).
    ctx.grammars = std::make_unique<GrammarLibrary>(MakeGrammarVocabulary(*ctx.tokenizer, {}));
  }
  ctx.model = model;
  ctx.context = engine->memory_plan().positions;
  ctx.max_seqs = max_seqs;
  ctx.max_queue = o.queue;
  ctx.web = o.web;
  ctx.vision.encoder = vision;
  // Without the directory's path: clients need not know where the model lives.
  const size_t why = no_vision.find("no vision: ");
  ctx.vision.no_vision = why == std::string::npos ? "this model has no vision tower"
                                                  : no_vision.substr(why + 11);
  ctx.vision.max_tokens = o.max_image_tokens;
  ctx.vision.limits = ImageLimits(o.max_image_tokens);
  ctx.created = static_cast<int64_t>(std::time(nullptr));
  K3_ASSIGN_OR_RETURN(ctx.api_key, ReadApiKey(Env::Default(), o.api_key_file));

  WakePipe wake;
  K3_RETURN_IF_ERROR(wake.Open());
  int port = 0;
  K3_ASSIGN_OR_RETURN(const int listen_fd, FrontDoor::Listen(o.host, o.port, &port));
  GatedHttpServer svr(listen_fd);
  Configure(svr, o.limits);
  RegisterRoutes(svr, ctx);
  // A streamed response holds its worker until it ends: max_seqs + queue workers, and spares
  // for /v1/models, /metrics and 429s.
  httplib::ThreadPool pool(static_cast<size_t>(ctx.max_seqs + ctx.max_queue + kSpareWorkers));
  Result<std::unique_ptr<FrontDoor>> door =
      FrontDoor::Start(listen_fd, o.limits, DoorHandlers(ctx, &svr, &pool));
  if (!door.ok()) {
    ::close(listen_fd);
    pool.shutdown();
    return door.status();
  }
  WriteStderr("listening on http://" + o.host + ":" + std::to_string(port) + "\n");

  SchedulerOptions so;
  so.max_seqs = max_seqs;
  // The server admits (SubmitJob); the scheduler's bound is a backstop that never binds first.
  so.max_queue = o.queue;
  so.prompt_cache_bytes = static_cast<uint64_t>(o.prompt_cache_gb * 1e9);
  so.spec = o.spec;
  so.spec_fixed = o.spec_fixed;
  std::atomic<bool> run{true};
  Status load;
  std::thread engine_thread(EngineThread, &ctx, so, &run, &load, &wake);

  wake.Wait();
  // Stop admitting: new requests get 503; running ones end (CancelAll) with an error chunk.
  ctx.stop_ns.store(SteadyNs());
  const ServerPhase was = ctx.phase.exchange(ServerPhase::kStopping, std::memory_order_acq_rel);
  if (was == ServerPhase::kReady) {
    LogInfo("shutting down: cancelling " + std::to_string(ctx.open_requests.load()) +
            " request(s)");
    ctx.scheduler->CancelAll();
    // The pass in flight (up to a pass over all the weights) is discarded at its next layer:
    // its requests end with the interruption as their error.
    ctx.engine->Interrupt();
    ctx.scheduler->Wake();
    (void)WaitUntil([&] { return ctx.open_requests.load() == 0; }, 2.5);
  }
  (*door)->Stop();  // no new requests; the workers' connections close as they finish
  svr.EndStreams();
  pool.shutdown();
  run.store(false);
  // The engine thread ends at its next WaitForWork. A weight load cannot be interrupted (nor a
  // layer that waits on a stuck disk), and the process must still exit in time: then it ends
  // without them.
  const bool joined = WaitUntil(
      [&] {
        if (ctx.scheduler && was == ServerPhase::kReady) ctx.scheduler->Wake();
        return ctx.engine_done.load();
      },
      0.5);
  if (!joined) {
    LogWarn(std::string("the engine is still ") +
            (was == ServerPhase::kReady ? "in a pass" : "loading the weights") +
            "; exiting without waiting for it");
    std::_Exit(0);
  }
  engine_thread.join();
  ctx.scheduler.reset();
  return load;
}

}  // namespace k3::run
