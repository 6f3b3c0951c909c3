// When `k3prep download` tries again, and how long it waits first.
//
// Policy (DESIGN.md §6, ECOSYSTEM-NOTES §1.6, §2): exponential backoff from --backoff-base-ms,
// doubling, capped at 8 s, with jitter (each wait is drawn uniformly from [d/2, d], so parallel
// jobs that failed together do not retry together). A server's own request to wait
// (Retry-After seconds, or the IETF RateLimit header's t= when r=0) replaces the backoff. The
// caller counts consecutive attempts without new bytes and gives up after --retry-max of them;
// the count resets whenever bytes arrive, so a long download on a flaky link keeps going as
// long as it makes progress.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <random>

#include "k3prep/download/http.h"

namespace k3::download {

struct RetryPolicy {
  int retry_max = 5;            // consecutive attempts without progress before giving up
  int backoff_base_ms = 1000;   // first wait
  int backoff_cap_ms = 8000;    // longest backoff wait
  // Spends each wait before a retry (seconds; any thread). Null: the calling thread sleeps.
  // Tests record the waits instead, so they check which wait was chosen, not how long a run took.
  std::function<void(double seconds)> wait;
};

// Wait before retry number `retry` (1 = the first retry), jittered.
double BackoffSeconds(const RetryPolicy& policy, int retry, std::mt19937_64& rng);
// The wait a 429/503 asked for: Retry-After in seconds, else RateLimit "...;r=0;t=S". Capped
// at 600 s (a Hub rate-limit window is 300 s). nullopt when the response names none.
std::optional<double> ServerWaitSeconds(const HttpResponse& resp);
// 408, 429, 500, 502, 503, 504: the server may answer differently next time.
bool IsRetryableStatus(long status);
// Connection-level failures worth retrying (refused, reset, cut short, stalled, DNS hiccup).
bool IsRetryableCurl(int curl_code);
// Waits `seconds` before a retry, through policy.wait when set.
void WaitBeforeRetry(const RetryPolicy& policy, double seconds);

}  // namespace k3::download
