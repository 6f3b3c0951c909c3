// The pure rules of k3prep download's defences against a hostile Hub, one test per rule:
// which redirect targets are followed (scheme, no https→http downgrade), what the manifest
// stores for an endpoint with credentials, reserved names, and the tree listing page parser.
#include <gtest/gtest.h>

#include "k3prep/download/http.h"
#include "k3prep/download/hub.h"

namespace k3 {
namespace {

using download::CheckFollowTarget;

TEST(DownloadFollow, HttpsTargetsFollowedFromAnyEndpoint) {
  EXPECT_TRUE(CheckFollowTarget("https://huggingface.co", "https://cdn-lfs.hf.co/x?s=1", "f").ok());
  EXPECT_TRUE(CheckFollowTarget("http://127.0.0.1:8080", "https://cdn.example/x", "f").ok());
  EXPECT_TRUE(CheckFollowTarget("https://huggingface.co", "HTTPS://CDN.example/x", "f").ok());
}

TEST(DownloadFollow, HttpTargetOnlyFromHttpEndpoint) {
  EXPECT_TRUE(CheckFollowTarget("http://127.0.0.1:8080", "http://127.0.0.1:9/x", "f").ok());
  Status s = CheckFollowTarget("https://huggingface.co", "http://cdn.example/x?sig=1", "a.bin");
  EXPECT_EQ(s.code(), Code::kInvalid);
  EXPECT_NE(s.message().find("a.bin: the Hub sent k3prep to http://cdn.example/x?<redacted> "
                             "(scheme http)"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("never follows it down to plain http"), std::string::npos)
      << s.message();
}

TEST(DownloadFollow, OtherSchemesRefused) {
  for (const char* target : {"file:///etc/passwd", "gopher://127.0.0.1:70/_x", "ftp://h/x",
                             "dict://127.0.0.1:11211/stats", "ldap://h/", "evil://h/x"}) {
    Status s = CheckFollowTarget("http://127.0.0.1:8080", target, "f.safetensors");
    EXPECT_EQ(s.code(), Code::kInvalid) << target;
    EXPECT_NE(s.message().find("k3prep follows only http and https"), std::string::npos)
        << s.message();
    const std::string scheme = std::string(target).substr(0, std::string(target).find(':'));
    EXPECT_NE(s.message().find("(scheme " + scheme + ")"), std::string::npos) << s.message();
  }
  EXPECT_EQ(CheckFollowTarget("https://h", "", "f").code(), Code::kInvalid);
}

TEST(DownloadFollow, UrlSchemeIsLowerCase) {
  EXPECT_EQ(download::UrlScheme("HTTPS://Host/x"), "https");
  EXPECT_EQ(download::UrlScheme("gopher://h:70/"), "gopher");
  EXPECT_EQ(download::UrlScheme("no scheme"), "");
}

TEST(DownloadEndpoint, ManifestStoresEndpointWithoutUserinfo) {
  EXPECT_EQ(download::WithoutUserinfo("https://u:p@mirror.example:8443/hf"),
            "https://mirror.example:8443/hf");
  EXPECT_EQ(download::WithoutUserinfo("https://u:p@mirror.example"), "https://mirror.example");
  EXPECT_EQ(download::WithoutUserinfo("https://huggingface.co"), "https://huggingface.co");
  EXPECT_EQ(download::WithoutUserinfo("http://127.0.0.1:9"), "http://127.0.0.1:9");
}

TEST(DownloadHub, ReservedNames) {
  EXPECT_TRUE(download::IsReservedName("k3-download.json"));
  EXPECT_TRUE(download::IsReservedName("k3-download.json.k3tmp"));
  EXPECT_TRUE(download::IsReservedName(".k3-partial"));
  EXPECT_TRUE(download::IsReservedName(".k3-partial/lock"));
  EXPECT_TRUE(download::IsReservedName(".k3-partial/model.safetensors.part"));
  EXPECT_FALSE(download::IsReservedName("sub/k3-download.json"));
  EXPECT_FALSE(download::IsReservedName(".k3-partial.safetensors"));
  EXPECT_FALSE(download::IsReservedName("config.json"));
}

TEST(DownloadHub, SelectFilesRefusesReservedNameOnlyWhenSelected) {
  std::vector<download::HubFile> all(2);
  all[0].path = "k3-download.json";
  all[1].path = "model.safetensors";
  Result<std::vector<download::HubFile>> plain = download::SelectFiles(all, {}, "o/m", "c");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();  // listed but not selected: harmless
  EXPECT_EQ(plain->size(), 1u);
  Result<std::vector<download::HubFile>> inc = download::SelectFiles(all, {"*.json"}, "o/m", "c");
  ASSERT_FALSE(inc.ok());
  EXPECT_NE(inc.status().message().find("--include '*.json' selects k3-download.json of o/m, "
                                        "a name reserved by k3prep for its own download manifest"),
            std::string::npos)
      << inc.status().message();
}

TEST(DownloadHub, SelectedSizesWhoseSumWrapsRefused) {
  // Past ParseTreePage's 2^50 bound only by many files; the sum check does not rely on that.
  std::vector<download::HubFile> all(3);
  all[0].path = "a.safetensors";
  all[0].size = uint64_t{1} << 63;
  all[1].path = "b.safetensors";
  all[1].size = (uint64_t{1} << 63) - 1;
  all[2].path = "c.safetensors";
  all[2].size = 1;
  std::vector<download::HubFile> fits(all.begin(), all.begin() + 2);
  EXPECT_TRUE(download::SelectFiles(fits, {}, "o/m", "c").ok());  // 2^64 - 1 still fits
  Result<std::vector<download::HubFile>> r = download::SelectFiles(all, {}, "o/m", "c");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalid);
  EXPECT_NE(r.status().message().find("add up to more than 2^64 bytes (at c.safetensors, 1 "
                                      "bytes)"),
            std::string::npos)
      << r.status().message();
}

// --- ParseTreePage ---

const std::string kOid(40, 'a');

std::string Entry(const std::string& path, const std::string& size) {
  return R"({"type":"file","oid":")" + kOid + R"(","size":)" + size + R"(,"path":")" + path +
         R"("})";
}

Result<std::vector<download::HubFile>> Parse(const std::string& body) {
  return download::ParseTreePage(body, 3, "http://hub.example/api/t?cursor=3");
}

TEST(DownloadTreePage, FilesInListingOrderDirectoriesSkipped) {
  const std::string lfs = std::string(64, 'b');
  Result<std::vector<download::HubFile>> r = Parse(
      "[" + Entry("b.json", "5") + R"(,{"type":"directory","oid":")" + kOid +
      R"(","size":0,"path":"d"},{"type":"file","oid":")" + kOid +
      R"(","size":7,"path":"d/a.safetensors","lfs":{"oid":")" + lfs + R"(","size":7}}])");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].path, "b.json");
  EXPECT_EQ((*r)[0].size, 5u);
  EXPECT_FALSE((*r)[0].lfs());
  EXPECT_EQ((*r)[1].path, "d/a.safetensors");
  EXPECT_EQ((*r)[1].sha256, lfs);
}

TEST(DownloadTreePage, SizeAbove2To50Refused) {
  EXPECT_TRUE(Parse("[" + Entry("a", "1125899906842624") + "]").ok());  // 2^50
  Result<std::vector<download::HubFile>> r = Parse("[" + Entry("a", "1125899906842625") + "]");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalid);
  EXPECT_NE(r.status().message().find("tree listing page 3 (http://hub.example/api/t?<redacted>)"
                                      " entry 0 (a): \"size\" 1125899906842625 is more than "
                                      "2^50 bytes"),
            std::string::npos)
      << r.status().message();
}

TEST(DownloadTreePage, ControlCharacterPathRefusedAndEscaped) {
  Result<std::vector<download::HubFile>> r = Parse("[" + Entry("a\\u001b[31mb'c", "1") + "]");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("path 'a\\x1B[31mb\\x27c' is not a safe relative path"),
            std::string::npos)
      << r.status().message();
}

TEST(DownloadTreePage, PathTwiceOnPageRefused) {
  Result<std::vector<download::HubFile>> r = Parse("[" + Entry("a", "1") + "," + Entry("a", "1") +
                                                   "]");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("entry 1: path 'a' listed twice"), std::string::npos)
      << r.status().message();
}

TEST(DownloadTreePage, NotJsonOrNotArrayRefused) {
  EXPECT_NE(Parse("[{").status().message().find("tree listing page 3 (http://hub.example/api/"
                                                 "t?<redacted>) is not valid JSON (2 bytes)"),
            std::string::npos);
  EXPECT_NE(Parse("{}").status().message().find("is not a JSON array"), std::string::npos);
}

}  // namespace
}  // namespace k3
