#include "k3prep/download/http.h"

#include <curl/curl.h>

#include <cctype>
#include <chrono>
#include <mutex>

#include "common/hex.h"
#include "common/printable.h"

namespace k3::download {
namespace {

std::once_flag g_curl_init;

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r' || s[e - 1] == '\n')) {
    --e;
  }
  return s.substr(b, e - b);
}

struct Exchange {
  HttpResponse* resp;
  const BodySink* sink;
  uint64_t max_body;
  bool overflow = false;
  // Our own stall window (see OnProgress).
  long stall_bytes_per_s = 0;
  long stall_seconds = 0;
  std::chrono::steady_clock::time_point window_start = std::chrono::steady_clock::now();
  curl_off_t window_bytes = 0;
  bool stalled = false;
};

// Stall rule: fewer than stall_bytes_per_s × stall_seconds body bytes within a window of
// stall_seconds. libcurl's own LOW_SPEED check (also set) averages the rate over ~5 s of
// history, so a burst followed by silence is noticed late; this window is exact to the ~1 s
// granularity of the progress callback.
int OnProgress(void* user, curl_off_t, curl_off_t dlnow, curl_off_t, curl_off_t) {
  auto* ex = static_cast<Exchange*>(user);
  if (ex->stall_seconds <= 0) return 0;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - ex->window_start).count();
  if (elapsed < static_cast<double>(ex->stall_seconds)) return 0;
  const double need = static_cast<double>(ex->stall_bytes_per_s) * elapsed;
  if (static_cast<double>(dlnow - ex->window_bytes) < need) {
    ex->stalled = true;
    return 1;  // abort: CURLE_ABORTED_BY_CALLBACK, reported as a stall
  }
  ex->window_start = now;
  ex->window_bytes = dlnow;
  return 0;
}

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* ex = static_cast<Exchange*>(user);
  const std::string line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) {
    // A new response (e.g. after "100 Continue"): only the last one's headers count.
    ex->resp->headers.clear();
    const size_t sp = line.find(' ');
    if (sp != std::string::npos) ex->resp->status = std::strtol(line.c_str() + sp + 1, nullptr, 10);
    return size * n;
  }
  const size_t colon = line.find(':');
  if (colon != std::string::npos) {
    ex->resp->headers[Lower(Trim(line.substr(0, colon)))] = Trim(line.substr(colon + 1));
  }
  return size * n;
}

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  auto* ex = static_cast<Exchange*>(user);
  const size_t bytes = size * n;
  if (ex->sink != nullptr && *ex->sink) {
    if (!(*ex->sink)(*ex->resp, data, bytes)) return 0;
  } else {
    if (ex->resp->body.size() + bytes > ex->max_body) {
      ex->overflow = true;
      return 0;
    }
    ex->resp->body.append(data, bytes);
  }
  ex->resp->body_bytes += bytes;
  return bytes;
}

}  // namespace

std::string HttpResponse::Header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? std::string() : it->second;
}

bool HttpResponse::StalledOrTimedOut() const { return curl_code == CURLE_OPERATION_TIMEDOUT; }

HttpClient::HttpClient() {
  std::call_once(g_curl_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  easy_ = curl_easy_init();
}

HttpClient::~HttpClient() {
  if (easy_ != nullptr) curl_easy_cleanup(static_cast<CURL*>(easy_));
}

Result<HttpResponse> HttpClient::Perform(const HttpRequest& req, const BodySink& sink) {
  CURL* c = static_cast<CURL*>(easy_);
  if (c == nullptr) return Status::Io("could not initialise libcurl (curl_easy_init failed)");
  curl_easy_reset(c);
  HttpResponse resp;
  Exchange ex{&resp, &sink, req.max_body_bytes};
  curl_slist* headers = nullptr;
  // identity: sizes and Content-Range must be those of the real bytes (ECOSYSTEM-NOTES §1.1).
  headers = curl_slist_append(headers, "Accept-Encoding: identity");
  headers = curl_slist_append(headers, "User-Agent: k3prep/0.1");
  std::string auth;
  if (!req.bearer_token.empty()) {
    auth = "Authorization: Bearer " + req.bearer_token;
    headers = curl_slist_append(headers, auth.c_str());
  }
  std::string range;
  if (req.range_from.has_value()) range = std::to_string(*req.range_from) + "-";
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(c, CURLOPT_URL, req.url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  // Only http(s), whatever URL the Hub hands out: file:// would read local files and
  // gopher:// or dict:// can send arbitrary bytes to any port (CURLE_UNSUPPORTED_PROTOCOL).
  // REDIR_PROTOCOLS too, should redirects ever be followed by libcurl itself.
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_UNRESTRICTED_AUTH, 0L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &ex);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &ex);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, req.connect_timeout_s);
  // No CURLOPT_TIMEOUT: a 17 GB body may legitimately take hours; stalls are caught below.
  if (req.low_speed_bytes_per_s > 0 && req.low_speed_seconds > 0) {
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, req.low_speed_bytes_per_s);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, req.low_speed_seconds);
    ex.stall_bytes_per_s = req.low_speed_bytes_per_s;
    ex.stall_seconds = req.low_speed_seconds;
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, OnProgress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, &ex);
  }
  if (req.receive_buffer_bytes > 0) {
    curl_easy_setopt(c, CURLOPT_BUFFERSIZE, req.receive_buffer_bytes);
  }
  if (req.method == "HEAD") curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  // CURLOPT_RANGE, not RESUME_FROM: the sink checks the status and Content-Range itself, so a
  // server that ignores the range cannot make libcurl append a whole body to a prefix.
  if (!range.empty()) curl_easy_setopt(c, CURLOPT_RANGE, range.c_str());
  const CURLcode rc = curl_easy_perform(c);
  curl_slist_free_all(headers);
  resp.curl_code = static_cast<int>(rc);
  if (ex.stalled) {
    resp.curl_code = static_cast<int>(CURLE_OPERATION_TIMEDOUT);
    resp.curl_error = "stalled: fewer than " + std::to_string(req.low_speed_bytes_per_s) +
                      " bytes/s for " + std::to_string(req.low_speed_seconds) + " s";
  } else if (rc != CURLE_OK) {
    // Printable: libcurl's text can quote what the server sent.
    resp.curl_error = Printable(errbuf[0] != 0 ? std::string(errbuf) : curl_easy_strerror(rc));
    if (ex.overflow) resp.curl_error = "response body larger than " +
                                       std::to_string(req.max_body_bytes) + " bytes";
  }
  // A response that arrived but was cut short still carries its status; a failed connect has 0.
  return resp;
}

std::string Origin(const std::string& url) {
  CURLU* u = curl_url();
  std::string out;
  if (curl_url_set(u, CURLUPART_URL, url.c_str(), 0) == CURLUE_OK) {
    char* scheme = nullptr;
    char* host = nullptr;
    char* port = nullptr;
    if (curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK) {
      out = Lower(scheme) + "://" + Lower(host) + ":" + port;
    }
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
  }
  curl_url_cleanup(u);
  return out;
}

bool SameOrigin(const std::string& a, const std::string& b) {
  const std::string oa = Origin(a);
  return !oa.empty() && oa == Origin(b);
}

std::string ResolveLocation(const std::string& base, const std::string& location) {
  CURLU* u = curl_url();
  std::string out;
  // NON_SUPPORT_SCHEME: a Location with a scheme libcurl lacks still resolves, so that
  // CheckFollowTarget can name it instead of an unhelpful "unusable redirect".
  if (curl_url_set(u, CURLUPART_URL, base.c_str(), 0) == CURLUE_OK &&
      curl_url_set(u, CURLUPART_URL, location.c_str(), CURLU_NON_SUPPORT_SCHEME) == CURLUE_OK) {
    char* full = nullptr;
    if (curl_url_get(u, CURLUPART_URL, &full, 0) == CURLUE_OK) out = full;
    curl_free(full);
  }
  curl_url_cleanup(u);
  return out;
}

namespace {

// True when `part` of `u` is present (curl_url_get answers CURLUE_NO_* when it is not).
bool HasPart(CURLU* u, CURLUPart part) {
  char* v = nullptr;
  const bool has = curl_url_get(u, part, &v, 0) == CURLUE_OK;
  curl_free(v);
  return has;
}

// `url` parsed, with the user name and password replaced by `user` (nullptr: removed); empty
// if unparsable. `had_userinfo` tells whether there was any.
std::string ReplaceUserinfo(const std::string& url, const char* user, bool* had_userinfo,
                            bool drop_query) {
  CURLU* u = curl_url();
  std::string out;
  if (curl_url_set(u, CURLUPART_URL, url.c_str(), CURLU_NON_SUPPORT_SCHEME) == CURLUE_OK) {
    *had_userinfo = HasPart(u, CURLUPART_USER) || HasPart(u, CURLUPART_PASSWORD);
    if (*had_userinfo) {
      curl_url_set(u, CURLUPART_USER, user, 0);
      curl_url_set(u, CURLUPART_PASSWORD, nullptr, 0);
    }
    if (drop_query) {
      curl_url_set(u, CURLUPART_QUERY, nullptr, 0);
      curl_url_set(u, CURLUPART_FRAGMENT, nullptr, 0);
    }
    char* full = nullptr;
    if (curl_url_get(u, CURLUPART_URL, &full, 0) == CURLUE_OK) out = full;
    curl_free(full);
  }
  curl_url_cleanup(u);
  return out;
}

}  // namespace

std::string RedactUrl(const std::string& url) {
  const size_t q = url.find_first_of("?#");
  const std::string hidden = q == std::string::npos ? "" : "?<redacted>";
  bool had_userinfo = false;
  std::string out = ReplaceUserinfo(url, "***", &had_userinfo, /*drop_query=*/true);
  if (out.empty()) {
    if (url.substr(0, q).find('@') != std::string::npos) {
      return "(an unparsable URL, not shown: it may hold credentials)";
    }
    out = url.substr(0, q);
  }
  return Printable(out + hidden);
}

std::string WithoutUserinfo(const std::string& url) {
  bool had_userinfo = false;
  std::string out = ReplaceUserinfo(url, nullptr, &had_userinfo, /*drop_query=*/false);
  if (!had_userinfo || out.empty()) return url;
  // libcurl writes an empty path as "/"; keep the endpoint's own spelling.
  if (!url.empty() && url.back() != '/' && !out.empty() && out.back() == '/') out.pop_back();
  return out;
}

std::string UrlScheme(const std::string& url) {
  CURLU* u = curl_url();
  std::string out;
  char* scheme = nullptr;
  if (curl_url_set(u, CURLUPART_URL, url.c_str(), CURLU_NON_SUPPORT_SCHEME) == CURLUE_OK &&
      curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK) {
    out = Lower(scheme);
  }
  curl_free(scheme);
  curl_url_cleanup(u);
  return out;
}

Status CheckFollowTarget(const std::string& endpoint, const std::string& target,
                         const std::string& what) {
  const std::string scheme = UrlScheme(target);
  const std::string from = UrlScheme(endpoint);
  if (scheme == "https" || (scheme == "http" && from == "http")) return Status::Ok();
  const std::string shown = scheme.empty() ? "an unparsable URL" : "scheme " + scheme;
  const std::string rule = scheme == "http"
                               ? "the endpoint " + RedactUrl(endpoint) + " is https, and k3prep "
                                 "never follows it down to plain http"
                               : "k3prep follows only http and https";
  return Status::Invalid(what + ": the Hub sent k3prep to " + RedactUrl(target) + " (" + shown +
                         "); " + rule + "; refusing (check HF_ENDPOINT and any proxy; a Hub that "
                         "does this is misconfigured or hostile)");
}

std::string UrlEscape(const std::string& s, bool keep_slash) {
  std::string out;
  for (unsigned char ch : s) {
    if (std::isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~' ||
        (keep_slash && ch == '/')) {
      out += static_cast<char>(ch);
    } else {
      out += '%';
      AppendHexByte(out, ch, HexCase::kUpper);
    }
  }
  return out;
}

}  // namespace k3::download
