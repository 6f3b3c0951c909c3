// formats/download_manifest: k3-download.json round trip and one test per schema rule.
#include "formats/download_manifest.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/env.h"
#include "tests/support/temp_dir.h"

namespace k3::dl {
namespace {

constexpr char kSource[] = "/dl/k3-download.json";
const std::string kCommit = "0123456789abcdef0123456789abcdef01234567";
const std::string kSha = std::string(64, 'a');

// Written by hand: the schema of DESIGN.md §6.
constexpr char kGood[] = R"({
  "format": "k3-download", "version": 1, "repo": "moonshotai/Kimi-K3",
  "commit": "0123456789abcdef0123456789abcdef01234567", "endpoint": "https://huggingface.co",
  "files": [
    {"path": "config.json", "size": 4523,
     "sha256": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
     "verified_at": "2025-11-29T08:55:01Z"},
    {"path": "sub/model-00001-of-000096.safetensors", "size": 17179869184,
     "sha256": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
     "verified_at": "2024-02-29T23:59:60.123Z"}
  ]
})";

// kGood with one edit applied to the parsed document.
std::string Edited(const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(kGood);
  edit(j);
  return j.dump();
}

void ExpectInvalid(const std::string& text, std::initializer_list<std::string> parts) {
  Result<DownloadManifest> r = ParseDownloadManifest(text, kSource);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalid);
  for (const std::string& p : parts) {
    EXPECT_NE(r.status().message().find(p), std::string::npos)
        << "missing \"" << p << "\" in: " << r.status().message();
  }
}

TEST(DownloadManifest, ParsesTheDocumentedSchema) {
  Result<DownloadManifest> m = ParseDownloadManifest(kGood, kSource);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->repo, "moonshotai/Kimi-K3");
  EXPECT_EQ(m->commit, kCommit);
  EXPECT_EQ(m->endpoint, "https://huggingface.co");
  ASSERT_EQ(m->files.size(), 2u);
  EXPECT_EQ(m->files[1].size, 17179869184u);
  ASSERT_NE(m->Find("config.json"), nullptr);
  EXPECT_EQ(m->Find("config.json")->verified_at, "2025-11-29T08:55:01Z");
  EXPECT_EQ(m->Find("nope.json"), nullptr);
}

TEST(DownloadManifest, RoundTripThroughAFile) {
  test::TempDir dir;
  DownloadManifest m;
  m.repo = "org/model";
  m.commit = kCommit;
  m.endpoint = "http://127.0.0.1:8080";
  m.files.push_back(DownloadFile{"a.safetensors", 10, kSha, "2025-01-02T03:04:05Z"});
  m.files.push_back(DownloadFile{"b.json", 0, std::string(64, '0'), "2025-01-02T03:04:06Z"});
  const std::string path = dir.Join("k3-download.json");
  ASSERT_TRUE(WriteDownloadManifest(Env::Default(), path, m).ok());
  Result<DownloadManifest> back = LoadDownloadManifest(Env::Default(), path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->repo, m.repo);
  EXPECT_EQ(back->commit, m.commit);
  EXPECT_EQ(back->endpoint, m.endpoint);
  ASSERT_EQ(back->files.size(), 2u);
  EXPECT_EQ(back->files[0].path, "a.safetensors");
  EXPECT_EQ(back->files[1].sha256, std::string(64, '0'));
  EXPECT_EQ(back->files[1].verified_at, "2025-01-02T03:04:06Z");
  EXPECT_EQ(dir.List(), std::vector<std::string>{"k3-download.json"});  // no temporary left
}

TEST(DownloadManifest, WriterRefusesAnInvalidManifest) {
  DownloadManifest m;
  m.repo = "org/model";
  m.commit = "main";
  m.endpoint = "https://huggingface.co";
  test::TempDir dir;
  Status s = WriteDownloadManifest(Env::Default(), dir.Join("k3-download.json"), m);
  EXPECT_EQ(s.code(), Code::kInvalid);
  EXPECT_TRUE(dir.List().empty());
}

TEST(DownloadManifest, BadCommitHex) {
  ExpectInvalid(Edited([](auto& j) { j["commit"] = "main"; }), {kSource, "commit", "40 lowercase hex"});
  ExpectInvalid(Edited([](auto& j) { j["commit"] = "0123456789ABCDEF0123456789abcdef01234567"; }),
                {"commit"});
  ExpectInvalid(Edited([](auto& j) { j["commit"] = kCommit.substr(1); }), {"commit"});
}

TEST(DownloadManifest, MissingFieldsAreNamed) {
  for (const char* key : {"format", "version", "repo", "commit", "endpoint", "files"}) {
    ExpectInvalid(Edited([&](auto& j) { j.erase(key); }),
                  {kSource, std::string(".") + key, "missing"});
  }
  for (const char* key : {"path", "size", "sha256", "verified_at"}) {
    ExpectInvalid(Edited([&](auto& j) { j["files"][1].erase(key); }),
                  {"files[1]." + std::string(key), "missing"});
  }
}

TEST(DownloadManifest, BadSha256Hex) {
  ExpectInvalid(Edited([](auto& j) { j["files"][0]["sha256"] = std::string(63, 'a'); }),
                {"files[0].sha256", "config.json", "64 lowercase hex"});
  ExpectInvalid(Edited([](auto& j) { j["files"][0]["sha256"] = std::string(64, 'A'); }),
                {"files[0].sha256"});
}

TEST(DownloadManifest, BadRfc3339) {
  for (const char* t : {"2025-11-29 08:55:01Z", "2025-11-29T08:55:01", "2025-11-29T08:55:01+00:00",
                        "2025-02-29T00:00:00Z", "2025-11-31T00:00:00Z", "2025-11-29T24:00:00Z",
                        "2025-11-29T08:60:00Z", "2025-11-29T08:55:01.Z", "2025-13-01T00:00:00Z",
                        "25-11-29T08:55:01Z", ""}) {
    ExpectInvalid(Edited([&](auto& j) { j["files"][0]["verified_at"] = t; }),
                  {"files[0].verified_at", "RFC 3339 UTC"});
  }
}

TEST(DownloadManifest, Rfc3339AcceptsLeapDaysLeapSecondsAndFractions) {
  EXPECT_TRUE(IsRfc3339Utc("2024-02-29T00:00:00Z"));
  EXPECT_TRUE(IsRfc3339Utc("2000-02-29T00:00:00Z"));
  EXPECT_FALSE(IsRfc3339Utc("1900-02-29T00:00:00Z"));
  EXPECT_TRUE(IsRfc3339Utc("2016-12-31T23:59:60Z"));
  EXPECT_TRUE(IsRfc3339Utc("2025-11-29T08:55:01.000001Z"));
  EXPECT_EQ(FormatRfc3339Utc(0), "1970-01-01T00:00:00Z");
  EXPECT_EQ(FormatRfc3339Utc(1709251199), "2024-02-29T23:59:59Z");
}

TEST(DownloadManifest, DuplicatePath) {
  ExpectInvalid(Edited([](auto& j) { j["files"][1]["path"] = "config.json"; }),
                {"files[1].path", "config.json", "listed twice"});
}

TEST(DownloadManifest, UnsafePath) {
  for (const char* p : {"/etc/passwd", "../x", "a/../b", "a//b", "a/", "", "./a", "a\\b"}) {
    ExpectInvalid(Edited([&](auto& j) { j["files"][0]["path"] = p; }), {"files[0].path"});
  }
}

TEST(DownloadManifest, WrongFormatOrVersion) {
  ExpectInvalid(Edited([](auto& j) { j["format"] = "k3-prepared"; }), {".format", "k3-download"});
  ExpectInvalid(Edited([](auto& j) { j["version"] = 2; }), {".version", "2 is not supported"});
}

TEST(DownloadManifest, SizeMustBeAnUnsignedInteger) {
  ExpectInvalid(Edited([](auto& j) { j["files"][0]["size"] = -1; }), {"files[0].size", "unsigned"});
  ExpectInvalid(Edited([](auto& j) { j["files"][0]["size"] = 1.5; }), {"files[0].size"});
  ExpectInvalid(Edited([](auto& j) { j["files"][0]["size"] = "10"; }), {"files[0].size"});
}

TEST(DownloadManifest, UnknownKeyIsRejected) {
  ExpectInvalid(Edited([](auto& j) { j["files"][0]["etag"] = "x"; }),
                {"files[0].etag", "unknown field"});
  ExpectInvalid(Edited([](auto& j) { j["revision"] = "main"; }), {".revision", "unknown field"});
}

TEST(DownloadManifest, DuplicateJsonKeyIsRejected) {
  std::string text = kGood;
  text.replace(text.find("\"repo\""), 6, "\"repo\": \"x\", \"repo\"");
  ExpectInvalid(text, {kSource, "duplicate key \"repo\""});
}

TEST(DownloadManifest, MalformedJsonNamesTheOffset) {
  ExpectInvalid(std::string(kGood).substr(0, 40), {kSource, "malformed JSON at byte offset"});
}

}  // namespace
}  // namespace k3::dl
