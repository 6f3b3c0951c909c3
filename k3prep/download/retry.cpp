#include "k3prep/download/retry.h"

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

namespace k3::download {

double BackoffSeconds(const RetryPolicy& policy, int retry, std::mt19937_64& rng) {
  double ms = std::max(0, policy.backoff_base_ms);
  for (int i = 1; i < retry && ms < policy.backoff_cap_ms; ++i) ms *= 2;
  ms = std::min(ms, static_cast<double>(policy.backoff_cap_ms));
  std::uniform_real_distribution<double> jitter(0.5, 1.0);
  return ms * jitter(rng) / 1000.0;
}

std::optional<double> ServerWaitSeconds(const HttpResponse& resp) {
  constexpr double kCap = 600.0;
  const std::string ra = resp.Header("retry-after");
  if (!ra.empty() && std::isdigit(static_cast<unsigned char>(ra[0]))) {
    return std::min(kCap, std::strtod(ra.c_str(), nullptr));
  }
  // RateLimit: "resolvers";r=0;t=42  (draft-ietf-httpapi-ratelimit-headers-09, as the Hub sends)
  const std::string rl = resp.Header("ratelimit");
  if (!rl.empty()) {
    const size_t r = rl.find(";r=");
    const size_t t = rl.find(";t=");
    const bool exhausted = r == std::string::npos || std::strtol(rl.c_str() + r + 3, nullptr, 10) == 0;
    if (t != std::string::npos && exhausted) {
      // The Hub's own client sleeps t+1: the window resets at t, and clocks are not exact.
      return std::min(kCap, std::strtod(rl.c_str() + t + 3, nullptr) + 1.0);
    }
  }
  return std::nullopt;
}

bool IsRetryableStatus(long status) {
  return status == 408 || status == 429 || status == 500 || status == 502 || status == 503 ||
         status == 504;
}

bool IsRetryableCurl(int curl_code) {
  switch (static_cast<CURLcode>(curl_code)) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_PARTIAL_FILE:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
      return true;
    default:
      return false;
  }
}

void WaitBeforeRetry(const RetryPolicy& policy, double seconds) {
  if (policy.wait) {
    policy.wait(seconds);
  } else if (seconds > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  }
}

}  // namespace k3::download
