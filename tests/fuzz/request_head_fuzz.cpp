// Fuzz target for the server front door's request framing (k3run/serve/request_head.h):
// ScanRequestHead must never crash or read past its input; a complete head must lie within
// the input and the head limit, end with a blank line, and carry a body length within the body
// limit; a refusal must carry one of its documented statuses; and the scan must not depend on
// bytes after the head (the body). A violated property aborts, which libFuzzer and the replay
// driver both report as a failure.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "k3run/serve/request_head.h"

namespace {

constexpr size_t kMaxHead = 512;
constexpr uint64_t kMaxBody = 4096;

void Require(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using k3::run::RequestHead;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const RequestHead h = k3::run::ScanRequestHead(in, kMaxHead, kMaxBody);
  switch (h.state) {
    case RequestHead::State::kIncomplete:
      Require(in.size() <= kMaxHead || in.find("\r\n\r\n") != std::string_view::npos);
      break;
    case RequestHead::State::kRefused:
      Require(h.status == 400 || h.status == 411 || h.status == 413 || h.status == 431);
      Require(!h.reason.empty());
      break;
    case RequestHead::State::kComplete: {
      Require(h.head_bytes <= in.size() && h.head_bytes <= kMaxHead);
      Require(h.head_bytes >= h.skipped + 4);
      Require(in.substr(h.head_bytes - 4, 4) == "\r\n\r\n");
      Require(h.content_length <= kMaxBody);
      Require(!h.method.empty() && !h.target.empty());
      Require(h.expect_end == 0 ||
              (h.expect_begin > h.skipped && h.expect_end <= h.head_bytes - 2));
      // The body is not part of the head: scanning the head alone gives the same answer.
      const RequestHead alone = k3::run::ScanRequestHead(in.substr(0, h.head_bytes), kMaxHead,
                                                         kMaxBody);
      Require(alone.state == h.state && alone.head_bytes == h.head_bytes &&
              alone.content_length == h.content_length && alone.method == h.method &&
              alone.target == h.target);
      break;
    }
  }
  return 0;
}
