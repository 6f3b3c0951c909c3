// The HTTP surface of `k3run --serve` (docs/SERVER.md): /health, /v1/models, /metrics,
// /v1/chat/completions, /v1/completions; the bearer key check; OpenAI error bodies for every
// status cpp-httplib decides itself (404 no route, 413 body too large, 500 exception).
// Thread safety: handlers run on cpp-httplib's workers; everything they share is ServerContext.
#pragma once

#include <string_view>

#include <httplib.h>

#include "k3run/serve/server_context.h"

namespace k3::run {

void RegisterRoutes(httplib::Server& svr, ServerContext& ctx);

// "Bearer KEY" against `key`, in time independent of where they differ.
bool BearerMatches(std::string_view header, std::string_view key);

}  // namespace k3::run
