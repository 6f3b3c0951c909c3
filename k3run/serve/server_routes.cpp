#include "k3run/serve/server_routes.h"

#include <memory>

#include "k3run/serve/openai_request.h"
#include "k3run/serve/openai_response.h"
#include "k3run/serve/server_images.h"
#include "k3run/serve/server_job.h"
#include "k3run/serve/structured_output.h"
#include "k3run/serve/web_page.h"

namespace k3::run {
namespace {

void Reply(httplib::Response& res, const ApiError& e) {
  res.status = e.http;
  res.set_content(ErrorBody(e), "application/json");
}

ApiError Error(int http, std::string message, std::string type, std::string code) {
  ApiError e = BadRequest(std::move(message), "", std::move(code));
  e.http = http;
  e.type = std::move(type);
  return e;
}

// /v1/* and /metrics need the key when one is set; /health never does (load balancers probe it).
bool NeedsKey(const std::string& path) {
  return path.rfind("/v1/", 0) == 0 || path == "/metrics";
}

void HandleCompletion(ServerContext& ctx, const httplib::Request& req, httplib::Response& res,
                Endpoint endpoint) {
  ApiRequest r;
  ApiError error;
  if (!ParseApiRequest(req.body, endpoint, &r, &error)) return Reply(res, error);
  if (!r.model.empty() && r.model != ctx.model) {
    return Reply(res, Error(404, "the model '" + r.model + "' does not exist; this server serves '" +
                                     ctx.model + "' (GET /v1/models)",
                            "invalid_request_error", "model_not_found"));
  }
  // Images: decoded and priced now (400s before any pass), encoded at admission.
  std::vector<ImageInput> images;
  if (!LoadRequestImages(ctx.vision, &r, &images, &error)) return Reply(res, error);
  r.images.clear();  // the data URLs: decoded
  std::vector<int32_t> prompt;
  int64_t max_tokens = 0;
  if (!BuildPrompt(ctx, r, &prompt, &max_tokens, &error)) return Reply(res, error);
  std::shared_ptr<TokenConstraint> constraint;
  if (!BuildConstraint(ctx, r, &constraint, &error)) return Reply(res, error);
  auto job = std::make_shared<Job>(ctx, r);
  job->constraint = std::move(constraint);
  if (!images.empty()) {
    job->image_stats = std::make_shared<ImageStats>();
    job->encode_media = MediaEncoderFor(
        ctx.vision.encoder, static_cast<int32_t>(ctx.engine->config().media_placeholder_token_id),
        prompt, std::move(images), job->image_stats);
  }
  if (!SubmitJob(job, std::move(prompt), max_tokens, &error)) {
    if (error.http == 429) res.set_header("Retry-After", "1");
    return Reply(res, error);
  }
  if (r.stream) return AnswerStream(job, res);
  AnswerWhole(job, req, res);
}

void Metrics(const ServerContext& ctx, httplib::Response& res) {
  const SchedulerStats s = ctx.ready() || ctx.stopping() ? ctx.scheduler->Stats() : SchedulerStats{};
  std::string text = MetricsText(s, ctx.max_seqs, ctx.max_queue, ctx.rejected.load());
  text += "# HELP k3_ready 1 when the weights are loaded.\n# TYPE k3_ready gauge\nk3_ready " +
          std::string(ctx.ready() ? "1" : "0") + "\n";
  res.set_content(text, "text/plain; version=0.0.4");
}

}  // namespace

std::pair<int, std::string> HealthReply(const ServerContext& ctx) {
  const ServerPhase p = ctx.phase.load(std::memory_order_acquire);
  const char* status = p == ServerPhase::kReady ? "ok"
                       : p == ServerPhase::kLoading ? "loading"
                                                    : "shutting down";
  return {p == ServerPhase::kReady ? 200 : 503, std::string("{\"status\":\"") + status + "\"}"};
}

std::string FrontDoorErrorBody(int status, const std::string& message) {
  const char* code = status == 408   ? "request_timeout"
                     : status == 411 ? "length_required"
                     : status == 413 ? "body_too_large"
                     : status == 431 ? "head_too_large"
                     : status == 503 ? "too_many_connections"
                                     : "bad_request";
  return ErrorBody(Error(status, message, status >= 500 ? "server_error" : "invalid_request_error",
                         code));
}

bool BearerMatches(std::string_view header, std::string_view key) {
  constexpr std::string_view kBearer = "Bearer ";
  if (header.size() != kBearer.size() + key.size() || header.substr(0, kBearer.size()) != kBearer) {
    return false;
  }
  unsigned char diff = 0;
  for (size_t i = 0; i < key.size(); ++i) {
    diff = static_cast<unsigned char>(diff | (header[kBearer.size() + i] ^ key[i]));
  }
  return diff == 0;
}

void RegisterRoutes(httplib::Server& svr, ServerContext& ctx) {
  svr.set_pre_routing_handler([&ctx](const httplib::Request& req, httplib::Response& res) {
    if (ctx.api_key.empty() || !NeedsKey(req.path) ||
        BearerMatches(req.get_header_value("Authorization"), ctx.api_key)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    Reply(res, Error(401, "missing or invalid API key: send 'Authorization: Bearer KEY' (the key "
                          "of --api-key-file)", "invalid_request_error", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // GET /health never reaches a worker: the front door answers it (HealthReply).
  // --web: the chat page at / (no key: it holds no data; it sends the key itself).
  if (ctx.web) RegisterWebPage(svr);
  svr.Get("/v1/models", [&ctx](const httplib::Request&, httplib::Response& res) {
    res.set_content(ModelsBody(ctx.model, ctx.created), "application/json");
  });
  svr.Get("/metrics", [&ctx](const httplib::Request&, httplib::Response& res) { Metrics(ctx, res); });
  svr.Post("/v1/chat/completions", [&ctx](const httplib::Request& req, httplib::Response& res) {
    HandleCompletion(ctx, req, res, Endpoint::kChat);
  });
  svr.Post("/v1/completions", [&ctx](const httplib::Request& req, httplib::Response& res) {
    HandleCompletion(ctx, req, res, Endpoint::kCompletion);
  });
  // Statuses cpp-httplib sets itself come with an empty body: give them an OpenAI error.
  svr.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req,
                                                               httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const std::string what = res.status == 404 ? "no route " + req.method + " " + req.path
                             : res.status == 413
                                 ? "the request body is larger than the server reads (" +
                                       std::to_string(kMaxBodyBytes) + " bytes)"
                                 : "HTTP " + std::to_string(res.status);
    Reply(res, Error(res.status, what, res.status >= 500 ? "server_error" : "invalid_request_error",
                     res.status == 404 ? "not_found" : res.status == 413 ? "body_too_large" : ""));
    return httplib::Server::HandlerResponse::Handled;
  }));
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    Reply(res, Error(500, "internal error", "server_error", "internal_error"));
  });
}

}  // namespace k3::run
