// How much of an HTTP/1.1 request has arrived, for the server's front door (front_door.h): it
// reads every request whole (head and body) before a worker sees it, so this scanner only needs
// the framing: where the head ends, how long the body is, and whether the request is one the
// server can read at all. cpp-httplib parses the request itself once it is whole.
//
// Rules (each refusal has its status and a sentence for the client):
//   - the head ends at the first CRLF CRLF; empty lines before the request line are skipped
//     (RFC 9112 §2.2); bare-LF line ends are not accepted (400 once the head would be complete);
//   - a head longer than max_head_bytes: 431;
//   - the request line is METHOD SP TARGET SP HTTP/1.0|HTTP/1.1: otherwise 400;
//   - Content-Length: digits only, at most 18 of them; repeated, every copy the same: else 400;
//     above max_body_bytes: 413;
//   - Transfer-Encoding (a chunked body): 411, send Content-Length (the front door reads a body
//     whole within its deadline, which needs its length up front);
//   - Expect: 100-continue is noted (the front door answers it and drops the line, so that the
//     client sends its body while no worker waits for it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace k3::run {

struct RequestHead {
  enum class State { kIncomplete, kComplete, kRefused };
  State state = State::kIncomplete;
  size_t skipped = 0;          // empty lines before the request line
  size_t head_bytes = 0;       // from the start of `bytes` through the blank line (kComplete)
  uint64_t content_length = 0;
  std::string method;          // "GET", "POST"...
  std::string target;          // "/health", "/v1/chat/completions?x=1"...
  // The "Expect: 100-continue" line, CRLF included: [expect_begin, expect_end) in `bytes`;
  // expect_end == 0 when there is none.
  size_t expect_begin = 0, expect_end = 0;
  int status = 0;              // kRefused: 400, 411, 413, 431
  std::string reason;          // kRefused: what was wrong, for the client
};

// Scans the bytes received so far of one request. Never reads past `bytes`.
RequestHead ScanRequestHead(std::string_view bytes, size_t max_head_bytes, uint64_t max_body_bytes);

}  // namespace k3::run
