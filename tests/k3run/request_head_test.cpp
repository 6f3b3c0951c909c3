// The front door's request framing (k3run/serve/request_head.h): every rule it lists, with a
// request that breaks it.
#include "k3run/serve/request_head.h"

#include <string>

#include <gtest/gtest.h>

namespace k3::run {
namespace {

constexpr size_t kHead = 1024;
constexpr uint64_t kBody = 100;

RequestHead Scan(const std::string& s) { return ScanRequestHead(s, kHead, kBody); }

void ExpectRefused(const std::string& s, int status, const std::string& words) {
  const RequestHead h = Scan(s);
  ASSERT_EQ(h.state, RequestHead::State::kRefused) << s;
  EXPECT_EQ(h.status, status) << s;
  EXPECT_NE(h.reason.find(words), std::string::npos) << h.reason;
}

TEST(RequestHead, CompleteHeadWithBodyLength) {
  const std::string head = "POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\ncontent-length:  12 \r\n\r\n";
  const RequestHead h = Scan(head + "{\"prompt\":1}");
  ASSERT_EQ(h.state, RequestHead::State::kComplete);
  EXPECT_EQ(h.head_bytes, head.size());
  EXPECT_EQ(h.content_length, 12u);
  EXPECT_EQ(h.method, "POST");
  EXPECT_EQ(h.target, "/v1/completions?x=1");
  EXPECT_EQ(h.expect_end, 0u);
}

TEST(RequestHead, EveryPrefixOfAGoodHeadIsIncomplete) {
  const std::string head = "GET /health HTTP/1.0\r\nHost: a\r\nAccept: */*\r\n\r\n";
  for (size_t n = 0; n < head.size(); ++n) {
    EXPECT_EQ(Scan(head.substr(0, n)).state, RequestHead::State::kIncomplete) << n;
  }
  EXPECT_EQ(Scan(head).state, RequestHead::State::kComplete);
  EXPECT_EQ(Scan(head).content_length, 0u);
}

TEST(RequestHead, EmptyLinesBeforeTheRequestLineAreSkipped) {
  const RequestHead h = Scan("\r\n\r\nGET / HTTP/1.1\r\n\r\n");
  ASSERT_EQ(h.state, RequestHead::State::kComplete);
  EXPECT_EQ(h.skipped, 4u);
  EXPECT_EQ(h.head_bytes, 4u + 18u);
  EXPECT_EQ(h.target, "/");
}

TEST(RequestHead, ExpectContinueLineIsLocated) {
  const std::string s = "POST / HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 3\r\n\r\n";
  const RequestHead h = Scan(s);
  ASSERT_EQ(h.state, RequestHead::State::kComplete);
  EXPECT_EQ(s.substr(h.expect_begin, h.expect_end - h.expect_begin), "Expect: 100-Continue\r\n");
}

TEST(RequestHead, HeadOverTheLimitIs431) {
  ExpectRefused("GET / HTTP/1.1\r\nX: " + std::string(kHead, 'a'), 431, "longer than 1024");
  ExpectRefused("GET / HTTP/1.1\r\nX: " + std::string(kHead, 'a') + "\r\n\r\n", 431, "longer");
  EXPECT_EQ(Scan("GET / HTTP/1.1\r\nX: " + std::string(kHead - 24, 'a')).state,
            RequestHead::State::kIncomplete);
}

TEST(RequestHead, BadRequestLinesAre400) {
  for (const char* line : {"GET /\r\n\r\n", "GET  / HTTP/1.1\r\n\r\n", "GET / HTTP/2\r\n\r\n",
                           "G(T / HTTP/1.1\r\n\r\n", "GET /a\x01 HTTP/1.1\r\n\r\n",
                           " GET / HTTP/1.1\r\n\r\n", "GET / HTTP/1.1 \r\n\r\n"}) {
    ExpectRefused(line, 400, "request line");
  }
}

TEST(RequestHead, BadHeaderLinesAre400) {
  ExpectRefused("GET / HTTP/1.1\r\nNoColon\r\n\r\n", 400, "Name: value");
  ExpectRefused("GET / HTTP/1.1\r\n: empty name\r\n\r\n", 400, "Name: value");
  ExpectRefused("GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", 400, "Name: value");
  ExpectRefused("GET / HTTP/1.1\r\nBad Name: b\r\n\r\n", 400, "header name");
  ExpectRefused("GET / HTTP/1.1\r\nA: b\nC: d\r\n\r\n", 400, "CRLF");
  ExpectRefused("GET / HTTP/1.1\nHost: a\n\n", 400, "CRLF");  // bare LF, refused before a deadline
}

TEST(RequestHead, ContentLengthRules) {
  ExpectRefused("POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n", 400, "Content-Length");
  ExpectRefused("POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, "Content-Length");
  ExpectRefused("POST / HTTP/1.1\r\nContent-Length:\r\n\r\n", 400, "Content-Length");
  ExpectRefused("POST / HTTP/1.1\r\nContent-Length: 1234567890123456789\r\n\r\n", 400,
                "Content-Length");
  ExpectRefused("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 400, "twice");
  EXPECT_EQ(Scan("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n").content_length,
            5u);
  ExpectRefused("POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n", 413, "larger than the server");
  EXPECT_EQ(Scan("POST / HTTP/1.1\r\nContent-Length: 100\r\n\r\n").state,
            RequestHead::State::kComplete);
}

TEST(RequestHead, ChunkedBodiesAre411) {
  ExpectRefused("POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n", 411,
                "send Content-Length");
}

}  // namespace
}  // namespace k3::run
