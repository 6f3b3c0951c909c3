// k3prep download against a hostile or broken Hub (tests/hubsim/hubsim.py's hostile modes):
// redirects to other schemes, a listing that pages in a loop, file names that are reserved,
// carry control characters or claim 2^64-1 bytes, and an HF_ENDPOINT holding credentials.
// Each test checks the exit category, that the message names the file and the rule, and that
// nothing was written or fetched that should not have been.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "k3prep/download/http.h"
#include "k3prep/download/hub.h"
#include "tests/k3prep/download_test_util.h"

namespace k3 {
namespace {

using test::FaultRun;
using test::kShard1;

// A TCP listener on 127.0.0.1 that is never accepted from: a redirect that made k3prep connect
// to it leaves a connection in its backlog (the kernel completes the handshake without accept).
class Listener {
 public:
  Listener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(fd_, 8) != 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ADD_FAILURE() << "cannot listen on 127.0.0.1";
      return;
    }
    port_ = ntohs(a.sin_port);
  }
  ~Listener() {
    if (fd_ >= 0) ::close(fd_);
  }
  int port() const { return port_; }
  // True when a connection is waiting to be accepted.
  bool Connected() const {
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  }

 private:
  int fd_ = -1;
  int port_ = 0;
};

std::string RedirectFault(const std::string& location) {
  return R"([{"mode":"redirect","path":")" + std::string(kShard1) + R"(","times":-1,"location":")" +
         location + R"("}])";
}

// The resolve answer points the shard elsewhere; the file fails with exit 2 naming the scheme,
// nothing of it is written, and the other files still arrive.
void ExpectRedirectRefused(const FaultRun& run, const std::string& scheme) {
  EXPECT_EQ(run.status.code(), Code::kInvalid) << run.status.ToString();
  const std::string err = run.Outcome(kShard1).error;
  EXPECT_NE(err.find(kShard1), std::string::npos) << err;
  EXPECT_NE(err.find("(scheme " + scheme + ")"), std::string::npos) << err;
  EXPECT_NE(err.find("k3prep follows only http and https"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(run.dest() + "/" + kShard1));
  EXPECT_FALSE(std::filesystem::exists(run.dest() + "/.k3-partial/" + kShard1 + ".part") &&
               std::filesystem::file_size(run.dest() + "/.k3-partial/" + kShard1 + ".part") > 0);
  test::ExpectDownloaded(run.dest(), run.src, {"config.json", test::kShard2});
}

TEST(DownloadHostile, RedirectToFileSchemeRefused) {
  FaultRun run(RedirectFault("file:///etc/passwd"));
  ExpectRedirectRefused(run, "file");
}

TEST(DownloadHostile, RedirectToGopherNeverConnects) {
  Listener l;
  FaultRun run(RedirectFault("gopher://127.0.0.1:" + std::to_string(l.port()) + "/_STATS"));
  ExpectRedirectRefused(run, "gopher");
  EXPECT_FALSE(l.Connected()) << "k3prep connected to the gopher:// target";
}

TEST(DownloadHostile, RedirectToFtpNeverConnects) {
  Listener l;
  FaultRun run(RedirectFault("ftp://127.0.0.1:" + std::to_string(l.port()) + "/x"));
  ExpectRedirectRefused(run, "ftp");
  EXPECT_FALSE(l.Connected()) << "k3prep connected to the ftp:// target";
}

TEST(DownloadHostile, HttpClientRefusesNonHttpUrls) {
  // The libcurl-level guard (CURLOPT_PROTOCOLS_STR), below the engine's own check.
  test::TempDir tmp;
  const std::string file = tmp.WriteFile("secret", "local bytes\n");
  download::HttpClient http;
  download::HttpRequest req;
  req.url = "file://" + file;
  Result<download::HttpResponse> r = http.Perform(req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NE(r->curl_code, 0);
  EXPECT_EQ(r->body, "");
}

TEST(DownloadHostile, TreeLinkLoopingToItselfFailsAtOnce) {
  // The loop runs for 50 listing requests, then the paging ends: followed blindly, the run
  // would succeed after 50 pages.
  FaultRun run(R"([{"mode":"link_loop","times":50}])");
  EXPECT_EQ(run.status.code(), Code::kInvalid) << run.status.ToString();
  EXPECT_NE(run.status.message().find("tree listing page 1 ("), std::string::npos)
      << run.status.message();
  EXPECT_NE(run.status.message().find("which was already fetched"), std::string::npos)
      << run.status.message();
  EXPECT_TRUE(run.sim->CdnRequests().empty());
}

std::string ExtraEntry(const std::string& path_json, const std::string& size) {
  return R"([{"mode":"extra_entry","entry":{"type":"file","oid":")" + std::string(40, '1') +
         R"(","size":)" + size + R"(,"path":)" + path_json + "}}]";
}

TEST(DownloadHostile, FileOf2To64Minus1BytesRefusedBeforeAnyRequest) {
  FaultRun run(ExtraEntry(R"("huge.safetensors")", "18446744073709551615"));
  EXPECT_EQ(run.status.code(), Code::kInvalid) << run.status.ToString();
  EXPECT_NE(run.status.message().find("(huge.safetensors): \"size\" 18446744073709551615 is "
                                      "more than 2^50 bytes"),
            std::string::npos)
      << run.status.message();
  EXPECT_TRUE(run.sim->CdnRequests().empty());
  EXPECT_FALSE(std::filesystem::exists(run.dest() + "/config.json"));
}

TEST(DownloadHostile, ControlCharacterNamesRefusedAndShownEscaped) {
  for (const std::string name : {R"("evil\u001b]0;pwned\u0007.safetensors")",
                                 R"("two\nlines.safetensors")", R"("del\u007f.safetensors")"}) {
    FaultRun run(ExtraEntry(name, "1"));
    EXPECT_EQ(run.status.code(), Code::kInvalid) << run.status.ToString();
    const std::string& msg = run.status.message();
    EXPECT_NE(msg.find("is not a safe relative path"), std::string::npos) << msg;
    EXPECT_NE(msg.find("control character"), std::string::npos) << msg;
    for (const char c : msg) {
      EXPECT_FALSE(static_cast<unsigned char>(c) < 0x20 || c == 0x7F)
          << "raw control byte " << static_cast<int>(c) << " in: " << msg;
    }
    EXPECT_TRUE(run.sim->CdnRequests().empty());
  }
  FaultRun esc(ExtraEntry(R"("evil\u001b]0;pwned\u0007.safetensors")", "1"));
  EXPECT_NE(esc.status.message().find("'evil\\x1B]0;pwned\\x07.safetensors'"), std::string::npos)
      << esc.status.message();
}

// `name` exists in the repo (a real file hubsim serves) and --include selects it.
FaultRun ReservedRun(const std::string& name, const std::string& glob) {
  return FaultRun(
      "[]", [&](download::DownloadOptions* o) { o->includes = {glob}; },
      [&](FaultRun* r) { test::WriteAll(r->tmp.Join("src/" + name), "{\"hostile\": true}\n"); });
}

TEST(DownloadHostile, IncludedManifestNameIsReserved) {
  FaultRun run = ReservedRun("k3-download.json", "k3-download.json");
  EXPECT_EQ(run.status.code(), Code::kInvalid) << run.status.ToString();
  EXPECT_NE(run.status.message().find("--include 'k3-download.json' selects k3-download.json of "
                                      "org/model, a name reserved by k3prep"),
            std::string::npos)
      << run.status.message();
  EXPECT_FALSE(std::filesystem::exists(run.dest() + "/k3-download.json"));
  EXPECT_TRUE(run.sim->CdnRequests().empty());
}

TEST(DownloadHostile, IncludedPartialDirNamesAreReserved) {
  FaultRun run = ReservedRun(".k3-partial/lock", ".k3-partial/*");
  EXPECT_EQ(run.status.code(), Code::kInvalid) << run.status.ToString();
  EXPECT_NE(run.status.message().find("selects .k3-partial/lock of org/model, a name reserved "
                                      "by k3prep for its own partial files and lock"),
            std::string::npos)
      << run.status.message();
  EXPECT_FALSE(std::filesystem::exists(run.dest() + "/.k3-partial/lock"));
}

// "http://127.0.0.1:PORT" → "http://user:s3cret@127.0.0.1:PORT"
std::string WithCredentials(const std::string& endpoint) {
  return "http://user:s3cret@" + endpoint.substr(std::string("http://").size());
}

TEST(DownloadHostile, EndpointCredentialsNeverStoredInManifest) {
  std::string plain;
  FaultRun run("[]", [&](download::DownloadOptions* o) {
    plain = o->endpoint;
    o->endpoint = WithCredentials(o->endpoint);
  });
  run.ExpectAllGood();
  Result<dl::DownloadManifest> m =
      dl::LoadDownloadManifest(Env::Default(), run.dest() + "/k3-download.json");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->endpoint, plain);
  EXPECT_EQ(test::ReadAll(run.dest() + "/k3-download.json").find("s3cret"), std::string::npos);
  for (const nlohmann::json& r : run.sim->CdnRequests()) {
    EXPECT_EQ(r.dump().find("s3cret"), std::string::npos) << r.dump();
  }
}

TEST(DownloadHostile, EndpointCredentialsRedactedInErrors) {
  FaultRun run("[]", [](download::DownloadOptions* o) {
    o->endpoint = WithCredentials(o->endpoint);
    o->token = "";  // hubsim wants the token: 401, whose message names the URL
  });
  EXPECT_EQ(run.status.code(), Code::kInvalid) << run.status.ToString();
  EXPECT_NE(run.status.message().find("token missing"), std::string::npos)
      << run.status.message();
  EXPECT_NE(run.status.message().find("http://***@127.0.0.1:"), std::string::npos)
      << run.status.message();
  EXPECT_EQ(run.status.message().find("s3cret"), std::string::npos) << run.status.message();
}

TEST(DownloadHostile, EndpointCredentialsRedactedWhenEndpointRefused) {
  test::TempDir tmp;
  auto o = test::TestOptions("ftp://user:s3cret@mirror.example/hf", tmp.Join("dst"));
  Status s = download::RunDownload(Env::Default(), o, nullptr);
  EXPECT_EQ(s.code(), Code::kInvalid);
  EXPECT_NE(s.message().find("'ftp://***@mirror.example/hf' (HF_ENDPOINT) is not an http(s) URL"),
            std::string::npos)
      << s.message();
}

TEST(DownloadHub, SafeRelativePathRefusesControlBytes) {
  EXPECT_FALSE(download::IsSafeRelativePath("a\nb.safetensors"));
  EXPECT_FALSE(download::IsSafeRelativePath("\x1B[2J.safetensors"));
  EXPECT_FALSE(download::IsSafeRelativePath("x\x7F"));
  EXPECT_FALSE(download::IsSafeRelativePath(std::string("a\0b", 3)));
  EXPECT_TRUE(download::IsSafeRelativePath("caf\xC3\xA9/model.safetensors"));
}

// --- RedactUrl (an existing function; credentials are new) ---

TEST(DownloadRedact, UserAndPasswordHidden) {
  EXPECT_EQ(download::RedactUrl("https://user:pw@mirror.example/api/x"),
            "https://***@mirror.example/api/x");
  EXPECT_EQ(download::RedactUrl("https://user@mirror.example/"), "https://***@mirror.example/");
  EXPECT_EQ(download::RedactUrl("https://:pw@mirror.example/"), "https://***@mirror.example/");
}

TEST(DownloadRedact, QueryHiddenPathKept) {
  EXPECT_EQ(download::RedactUrl("https://cdn.example/blobs/ab?exp=1&sig=s3cret#f"),
            "https://cdn.example/blobs/ab?<redacted>");
  EXPECT_EQ(download::RedactUrl("https://u:p@cdn.example/b?sig=1"),
            "https://***@cdn.example/b?<redacted>");
  EXPECT_EQ(download::RedactUrl("https://huggingface.co/api/models/org/m"),
            "https://huggingface.co/api/models/org/m");
}

TEST(DownloadRedact, UnparsableUrlWithAtNotShown) {
  const std::string shown = download::RedactUrl("not a url user:s3cret@x");
  EXPECT_EQ(shown.find("s3cret"), std::string::npos) << shown;
  EXPECT_EQ(download::RedactUrl("not a url?q=1"), "not a url?<redacted>");
}

}  // namespace
}  // namespace k3
