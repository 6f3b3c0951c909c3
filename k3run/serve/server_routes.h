// The HTTP surface of `k3run --serve` (docs/SERVER.md): /v1/models, /metrics,
// /v1/chat/completions, /v1/completions and, with --web, the chat page (web_page.h) on the
// workers; /health in the front door
// (front_door.h); the bearer key check; OpenAI error bodies for every status cpp-httplib or the
// front door decides itself (404 no route, 408/411/413/431/503 from the front door, 500).
// Thread safety: handlers run on the workers; everything they share is ServerContext.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include <httplib.h>

#include "k3run/serve/server_context.h"

namespace k3::run {

void RegisterRoutes(httplib::Server& svr, ServerContext& ctx);

// GET /health: 200 {"status":"ok"} when ready, else 503 with "loading" or "shutting down".
// Lock-free (one atomic load): the front door's thread calls it.
std::pair<int, std::string> HealthReply(const ServerContext& ctx);
// The OpenAI error body of a status the front door answers (408, 411, 413, 431, 400, 503).
std::string FrontDoorErrorBody(int status, const std::string& message);

// "Bearer KEY" against `key`, in time independent of where they differ.
bool BearerMatches(std::string_view header, std::string_view key);

}  // namespace k3::run
