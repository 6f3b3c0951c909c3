// k3prep download under each fault mode of the local Hub simulator (tests/hubsim/hubsim.py).
// Every test checks: the exit category, final files byte-identical or absent, the manifest,
// and that the token never reached the CDN.
#include <gtest/gtest.h>

#include <vector>

#include "tests/k3prep/download_test_util.h"

namespace k3 {
namespace {

using test::FaultRun;
using test::kShard1;
using test::kShard2;

TEST(DownloadFaults, DropAfterKBytesResumesWithRange) {
  FaultRun run(R"([{"mode":"drop","path":"model-00001-of-000002.safetensors","bytes":100000}])");
  run.ExpectAllGood();
  const auto ranges = test::CdnRanges(*run.sim, run.Sha(kShard1));
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_EQ(ranges[0], "");
  // What arrived before the drop is kept (buffered bytes reach the .part), so the resume starts
  // at or after byte 100000 minus nothing: exactly 100000 over loopback.
  EXPECT_EQ(ranges[1], "bytes=100000-");
  EXPECT_EQ(run.Outcome(kShard1).retries, 1);
  EXPECT_EQ(run.result.bytes_read_local, 0u) << "in-process resume must not re-read the prefix";
}

TEST(DownloadFaults, Answer200ToRangeTruncatesAndRestarts) {
  FaultRun run(R"([{"mode":"drop","path":"model-00001-of-000002.safetensors","bytes":100000},
                   {"mode":"ignore_range","path":"model-00001-of-000002.safetensors"}])");
  run.ExpectAllGood();
  const auto ranges = test::CdnRanges(*run.sim, run.Sha(kShard1));
  ASSERT_EQ(ranges.size(), 3u);
  EXPECT_EQ(ranges[1], "bytes=100000-");  // answered 200: rejected, .part truncated
  EXPECT_EQ(ranges[2], "");               // and started again from byte 0
  EXPECT_EQ(run.Outcome(kShard1).restarts, 1);
}

TEST(DownloadFaults, Http500IsRetried) {
  FaultRun run(R"([{"mode":"status500","path":"model-00002-of-000002.safetensors","times":2}])");
  run.ExpectAllGood();
  EXPECT_EQ(run.Outcome(kShard2).retries, 2);
}

TEST(DownloadFaults, Http500OnResolveIsRetried) {
  FaultRun run(R"([{"mode":"status500","where":"hub","path":"config.json","times":2}])");
  run.ExpectAllGood();
  EXPECT_EQ(run.Outcome("config.json").retries, 2);
}

TEST(DownloadFaults, Http429HonoursRetryAfter) {
  // Backoff is at most 10 ms in tests, so the one wait of 1 s can only be Retry-After: 1.
  FaultRun run(R"([{"mode":"status429","path":"model-00002-of-000002.safetensors",
                    "retry_after":1}])");
  run.ExpectAllGood();
  EXPECT_EQ(run.Outcome(kShard2).retries, 1);
  EXPECT_EQ(run.Waits(), std::vector<double>{1.0});
}

TEST(DownloadFaults, Http429HonoursRateLimitHeader) {
  // RateLimit: "resolvers";r=0;t=0 → wait t+1 = 1 s (no Retry-After header).
  FaultRun run(R"([{"mode":"ratelimit429","path":"model-00002-of-000002.safetensors",
                    "retry_after":0}])");
  run.ExpectAllGood();
  EXPECT_EQ(run.Outcome(kShard2).retries, 1);
  EXPECT_EQ(run.Waits(), std::vector<double>{1.0});
}

TEST(DownloadFaults, Expired403ReResolvesSignedUrl) {
  FaultRun run(R"([{"mode":"expire403","path":"model-00001-of-000002.safetensors"}])");
  run.ExpectAllGood();
  EXPECT_EQ(test::CdnRanges(*run.sim, run.Sha(kShard1)).size(), 2u);
  EXPECT_EQ(run.Outcome(kShard1).retries, 1);
}

TEST(DownloadFaults, StallLongerThanTimeoutIsDetectedAndRetried) {
  // 1000 B/s for 1 s is the stall rule in tests; the CDN goes silent for 600 s after 50 KB, so
  // the only way that exchange ends within the test is the stall rule. A stall is counted only
  // when the rule ended the exchange (curl's low-speed timeout), not when the server hung up.
  FaultRun run(R"([{"mode":"stall","path":"model-00001-of-000002.safetensors","bytes":50000,
                    "seconds":600}])");
  run.ExpectAllGood();
  EXPECT_EQ(run.Outcome(kShard1).stalls, 1) << "the stall was not detected by the stall rule";
  EXPECT_EQ(run.Outcome(kShard1).retries, 1);
  const auto ranges = test::CdnRanges(*run.sim, run.Sha(kShard1));
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_EQ(ranges[1], "bytes=50000-");
}

TEST(DownloadFaults, SlowTrickleAboveStallThresholdSucceeds) {
  // ~80 KB/s, far above 1000 B/s: slow, not stalled.
  FaultRun run(R"([{"mode":"trickle","path":"model-00002-of-000002.safetensors","chunk":4096,
                    "interval":0.05}])");
  run.ExpectAllGood();
  EXPECT_EQ(run.Outcome(kShard2).stalls, 0);
  EXPECT_EQ(run.Outcome(kShard2).retries, 0);
}

TEST(DownloadFaults, WrongLinkedSizeIsIntegrityErrorNothingWritten) {
  FaultRun run(R"([{"mode":"wrong_size","path":"model-00001-of-000002.safetensors",
                    "times":-1}])");
  EXPECT_EQ(run.status.code(), Code::kIntegrity) << run.status.ToString();
  EXPECT_EQ(run.status.exit_code(), 3);
  EXPECT_NE(run.Outcome(kShard1).error.find("X-Linked-Size 300001"), std::string::npos)
      << run.Outcome(kShard1).error;
  EXPECT_FALSE(std::filesystem::exists(run.dest() + "/" + kShard1));
  EXPECT_TRUE(test::CdnRanges(*run.sim, run.Sha(kShard1)).empty());
  test::ExpectDownloaded(run.dest(), run.src, {"config.json", kShard2});
  test::ExpectTokenNeverAtCdn(*run.sim);
}

TEST(DownloadFaults, BadSha256KeepsPartBadAndExits3) {
  FaultRun run(R"([{"mode":"corrupt","path":"model-00002-of-000002.safetensors","offset":777,
                    "times":-1}])");
  EXPECT_EQ(run.status.code(), Code::kIntegrity) << run.status.ToString();
  EXPECT_NE(run.status.message().find(".part.bad"), std::string::npos) << run.status.message();
  const std::string err = run.Outcome(kShard2).error;
  EXPECT_NE(err.find(kShard2), std::string::npos) << err;
  EXPECT_NE(err.find(run.Sha(kShard2)), std::string::npos) << "must name the published hash";
  EXPECT_FALSE(std::filesystem::exists(run.dest() + "/" + kShard2));
  const std::string bad = run.dest() + "/.k3-partial/" + kShard2 + ".part.bad";
  ASSERT_TRUE(std::filesystem::exists(bad));
  EXPECT_EQ(std::filesystem::file_size(bad), run.src[kShard2].size());
  test::ExpectDownloaded(run.dest(), run.src, {"config.json", kShard1});
  Result<dl::DownloadManifest> m =
      dl::LoadDownloadManifest(Env::Default(), run.dest() + "/k3-download.json");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->Find(kShard2), nullptr) << "a bad file must not be recorded";
  test::ExpectTokenNeverAtCdn(*run.sim);
}

TEST(DownloadFaults, PersistentFailureGivesUpWithResumeCommandExit1) {
  FaultRun run(R"([{"mode":"status500","path":"model-00001-of-000002.safetensors",
                    "times":-1}])");
  EXPECT_EQ(run.status.code(), Code::kIo) << run.status.ToString();
  EXPECT_NE(run.status.message().find(kShard1), std::string::npos);
  EXPECT_NE(run.status.message().find("to resume, run: k3prep download org/model --dest"),
            std::string::npos)
      << run.status.message();
  EXPECT_NE(run.Outcome(kShard1).error.find("gave up after 4 attempts"), std::string::npos)
      << run.Outcome(kShard1).error;
  EXPECT_EQ(run.status.message().find(test::kTestToken), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(run.dest() + "/" + kShard1));
  test::ExpectDownloaded(run.dest(), run.src, {"config.json", kShard2});
}

TEST(DownloadFaults, RetryBudgetResetsWhenBytesArrive) {
  // Five drops in a row, each after new bytes, with --retry-max 2: still completes, because
  // every attempt made progress.
  FaultRun run(R"([{"mode":"drop","path":"model-00001-of-000002.safetensors","bytes":40000,
                    "times":5}])",
               [](download::DownloadOptions* o) { o->retry_max = 2; });
  run.ExpectAllGood();
  EXPECT_EQ(run.Outcome(kShard1).retries, 5);
  const auto ranges = test::CdnRanges(*run.sim, run.Sha(kShard1));
  ASSERT_EQ(ranges.size(), 6u);
  EXPECT_EQ(ranges[5], "bytes=200000-");
}

TEST(DownloadFaults, UnsafePathInTreeListingRefused) {
  FaultRun run(R"([{"mode":"unsafe_path","where":"hub"}])");
  EXPECT_EQ(run.status.code(), Code::kInvalid) << run.status.ToString();
  EXPECT_NE(run.status.message().find("'../evil.safetensors' is not a safe relative path"),
            std::string::npos)
      << run.status.message();
  EXPECT_FALSE(std::filesystem::exists(run.tmp.Join("evil.safetensors")));
}

TEST(DownloadFaults, ResumeFromExistingPartHashesPrefixOnce) {
  FaultRun run("[]", nullptr, [](FaultRun* r) {
    test::WriteAll(r->dest() + "/.k3-partial/" + kShard1 + ".part", r->src[kShard1].substr(0, 50000));
  });
  run.ExpectAllGood();
  const auto ranges = test::CdnRanges(*run.sim, run.Sha(kShard1));
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0], "bytes=50000-");
  EXPECT_EQ(run.result.bytes_read_local, 50000u) << "the prefix is read exactly once";
  EXPECT_EQ(run.Outcome(kShard1).resumed_from, 50000u);
}

TEST(DownloadFaults, StalePrefixFromCrashIsRedownloadedFromZeroOnce) {
  FaultRun run("[]", nullptr, [](FaultRun* r) {
    test::WriteAll(r->dest() + "/.k3-partial/" + kShard1 + ".part", std::string(50000, '\0'));
  });
  run.ExpectAllGood();
  const auto ranges = test::CdnRanges(*run.sim, run.Sha(kShard1));
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_EQ(ranges[0], "bytes=50000-");
  EXPECT_EQ(ranges[1], "");
  EXPECT_EQ(run.Outcome(kShard1).restarts, 1);
}

}  // namespace
}  // namespace k3
