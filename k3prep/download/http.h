// One HTTP/1.1 exchange over libcurl's easy interface, for `k3prep download`.
//
// Goals: the download engine sees a status, the response headers it needs and (for small API
// answers) a body; the body of a file transfer goes to a caller-supplied sink instead. Redirects
// are never followed here: the engine decides per hop whether the token may go along.
// Non-goals: retries and backoff (k3prep/download/transfer.cpp), the Hub's URLs
// (k3prep/download/hub.h).
//
// Token safety: the bearer token is only ever placed in a request whose URL has the same origin
// (scheme, host, port) as the endpoint; SameOrigin() is the one check for that. Error messages
// print URLs through RedactUrl(), which drops query strings (signed CDN URLs are credentials
// too) and hides user:password in the URL (HF_ENDPOINT may carry them for a private mirror).
//
// Schemes: libcurl is limited to http and https (CURLOPT_PROTOCOLS_STR), so no URL a hostile Hub
// hands out can make it read a local file or talk gopher/ftp/dict to another service; the
// engine also checks each hop it follows with CheckFollowTarget(), which names the file.
//
// Thread safety: an HttpClient is used by one thread at a time; several clients may run in
// parallel (curl_global_init is done once, thread-safely, by the first client).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "common/status.h"

namespace k3::download {

struct HttpRequest {
  std::string method = "GET";   // GET or HEAD
  std::string url;
  std::string bearer_token;     // empty: no Authorization header
  std::optional<uint64_t> range_from;  // Range: bytes=N-
  long connect_timeout_s = 30;
  long low_speed_bytes_per_s = 0;  // 0: no stall detection
  long low_speed_seconds = 0;
  uint64_t max_body_bytes = 64u << 20;  // for bodies kept in memory
  // libcurl's receive buffer (CURLOPT_BUFFERSIZE); 0 keeps its 16 KiB default. File bodies use
  // a large one, because each buffer-full costs a poll and a recv. The sink is still called
  // with at most 16 KiB at a time (CURL_MAX_WRITE_SIZE).
  long receive_buffer_bytes = 0;
};

struct HttpResponse {
  long status = 0;                            // 0 when no response arrived
  std::map<std::string, std::string> headers;  // lower-case names, last value wins
  std::string body;                           // only when no sink was given
  int curl_code = 0;                          // CURLcode; 0 = transfer completed
  std::string curl_error;                     // human text for curl_code
  uint64_t body_bytes = 0;                    // bytes handed to the sink (or kept)

  std::string Header(const std::string& lower_name) const;
  bool StalledOrTimedOut() const;  // CURLE_OPERATION_TIMEDOUT
};

// Receives body bytes. `resp` already holds the status line and headers. Return false to abort
// the transfer (the exchange then ends with a write error, which the caller expects).
using BodySink = std::function<bool(const HttpResponse& resp, const char* data, size_t n)>;

class HttpClient {
 public:
  HttpClient();
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Performs one exchange. Returns a Status only for local failures (curl could not be set
  // up); network and HTTP failures are reported in the response for the caller to classify.
  Result<HttpResponse> Perform(const HttpRequest& req, const BodySink& sink = nullptr);

 private:
  void* easy_;  // CURL*; kept between exchanges so connections are reused
};

// "scheme://host:port" of an absolute URL (default ports made explicit); empty if unparsable.
std::string Origin(const std::string& url);
bool SameOrigin(const std::string& a, const std::string& b);
// Resolves `location` (absolute or starting with '/') against `base`.
std::string ResolveLocation(const std::string& base, const std::string& location);
// The URL for messages and logs: query string and fragment replaced by "?<redacted>", a user
// name or password by "***" ("https://***@host/"), parsed with libcurl's URL API; then
// Printable() (common/printable.h). An unparsable URL is shown without its query, or not at
// all when it holds an '@' (which may end credentials that cannot be told apart).
std::string RedactUrl(const std::string& url);
// The URL without user name and password, for storing (the download manifest's endpoint);
// unchanged when it has none or cannot be parsed.
std::string WithoutUserinfo(const std::string& url);
// Lower-case scheme of an absolute URL ("https"); empty if unparsable.
std::string UrlScheme(const std::string& url);
// Whether the engine may follow the Hub from `endpoint` to `target` (a resolved redirect
// Location or next-page link): only http and https, and plain http only when the endpoint
// itself is http (an https endpoint is never downgraded to cleartext, where anyone on the path
// could swap the bytes). kInvalid naming `what` (the file or page), the target and the rule.
Status CheckFollowTarget(const std::string& endpoint, const std::string& target,
                         const std::string& what);
// Percent-encodes everything but unreserved characters; keeps '/' when `keep_slash`.
std::string UrlEscape(const std::string& s, bool keep_slash);

}  // namespace k3::download
