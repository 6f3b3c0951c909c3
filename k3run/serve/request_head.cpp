#include "k3run/serve/request_head.h"

#include <algorithm>

namespace k3::run {
namespace {

bool EqualsNoCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; };
           return lower(x) == lower(y);
         });
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool IsTokenChar(char c) {  // RFC 9110 tchar
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

RequestHead Refuse(RequestHead h, int status, std::string reason) {
  h.state = RequestHead::State::kRefused;
  h.status = status;
  h.reason = std::move(reason);
  return h;
}

// METHOD SP TARGET SP HTTP/1.x
bool ParseRequestLine(std::string_view line, RequestHead* h) {
  const size_t a = line.find(' ');
  if (a == std::string_view::npos || a == 0) return false;
  const size_t b = line.find(' ', a + 1);
  if (b == std::string_view::npos || b == a + 1) return false;
  const std::string_view method = line.substr(0, a), target = line.substr(a + 1, b - a - 1);
  const std::string_view version = line.substr(b + 1);
  if (!std::all_of(method.begin(), method.end(), IsTokenChar)) return false;
  if (std::any_of(target.begin(), target.end(),
                  [](char c) { return static_cast<unsigned char>(c) <= ' ' || c == 0x7f; })) {
    return false;
  }
  if (version != "HTTP/1.1" && version != "HTTP/1.0") return false;
  h->method = std::string(method);
  h->target = std::string(target);
  return true;
}

}  // namespace

RequestHead ScanRequestHead(std::string_view bytes, size_t max_head_bytes, uint64_t max_body_bytes) {
  RequestHead h;
  while (h.skipped + 2 <= bytes.size() && bytes.substr(h.skipped, 2) == "\r\n") h.skipped += 2;
  const size_t end = bytes.find("\r\n\r\n", h.skipped);
  if (end == std::string_view::npos) {
    if (bytes.size() > max_head_bytes) {
      return Refuse(h, 431, "the request head is longer than " + std::to_string(max_head_bytes) +
                                " bytes");
    }
    // A bare LF blank line would never complete the head: say so now rather than at the
    // deadline.
    if (bytes.find("\n\n", h.skipped) != std::string_view::npos ||
        bytes.find("\n\r\n", h.skipped) != std::string_view::npos) {
      return Refuse(h, 400, "request lines must end with CRLF");
    }
    return h;
  }
  h.head_bytes = end + 4;
  if (h.head_bytes > max_head_bytes) {
    return Refuse(h, 431, "the request head is longer than " + std::to_string(max_head_bytes) +
                              " bytes");
  }
  size_t pos = h.skipped;
  bool first = true, have_length = false;
  while (pos < end + 2) {
    const size_t eol = bytes.find("\r\n", pos);
    const std::string_view line = bytes.substr(pos, eol - pos);
    if (line.find('\n') != std::string_view::npos || line.find('\r') != std::string_view::npos) {
      return Refuse(h, 400, "request lines must end with CRLF");
    }
    if (first) {
      if (!ParseRequestLine(line, &h)) {
        return Refuse(h, 400, "the request line is not 'METHOD TARGET HTTP/1.1'");
      }
      first = false;
    } else {
      const size_t colon = line.find(':');
      if (colon == std::string_view::npos || colon == 0 || line[0] == ' ' || line[0] == '\t') {
        return Refuse(h, 400, "a header line is not 'Name: value'");
      }
      const std::string_view name = line.substr(0, colon), value = Trim(line.substr(colon + 1));
      if (!std::all_of(name.begin(), name.end(), IsTokenChar)) {
        return Refuse(h, 400, "a header name has a character a name may not have");
      }
      if (EqualsNoCase(name, "Content-Length")) {
        if (value.empty() || value.size() > 18 ||
            !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
          return Refuse(h, 400, "Content-Length is not a number of bytes");
        }
        const uint64_t n = std::stoull(std::string(value));
        if (have_length && n != h.content_length) {
          return Refuse(h, 400, "Content-Length is given twice with different values");
        }
        have_length = true;
        h.content_length = n;
      } else if (EqualsNoCase(name, "Transfer-Encoding")) {
        return Refuse(h, 411, "chunked request bodies are not read: send Content-Length");
      } else if (EqualsNoCase(name, "Expect") && EqualsNoCase(value, "100-continue")) {
        h.expect_begin = pos;
        h.expect_end = eol + 2;
      }
    }
    pos = eol + 2;
  }
  if (h.content_length > max_body_bytes) {
    return Refuse(h, 413, "the request body is larger than the server reads (" +
                              std::to_string(max_body_bytes) + " bytes)");
  }
  h.state = RequestHead::State::kComplete;
  return h;
}

}  // namespace k3::run
