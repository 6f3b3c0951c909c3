// k3prep download against the local Hub simulator: the normal paths (happy path on a synth
// checkpoint, paged tree, --include, skip/adopt, tokens) and SIGKILL-then-resume of the real
// binary. Fault modes live in download_faults_test.cpp.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <iterator>
#include <thread>

#include <gtest/gtest.h>

#include "k3prep/cli.h"
#include "k3prep/download/command.h"
#include "k3prep/download/hub.h"
#include "k3prep/download/part_writer.h"
#include "k3prep/download/retry.h"
#include "k3prep/synth/checkpoint.h"
#include "tests/k3prep/download_test_util.h"
#include "tests/support/fault_env.h"
#include "tests/support/synth_fixture.h"
#include "tests/support/temp_dir.h"

extern char** environ;

namespace k3 {
namespace {

using download::DownloadResult;
using download::FileOutcome;
using test::HubSimConfig;
using test::HubSimProcess;

std::map<std::string, std::string> ReadTree(const std::string& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    out[std::filesystem::relative(e.path(), root).string()] = test::ReadAll(e.path().string());
  }
  return out;
}

std::vector<std::string> Keys(const std::map<std::string, std::string>& m) {
  std::vector<std::string> k;
  for (const auto& [p, d] : m) k.push_back(p);
  return k;
}

TEST(Download, HappyPathSynthTinyByteIdenticalManifestAndNoTokenAtCdn) {
  test::TempDir tmp;
  // The run's shared tiny checkpoint, served read-only.
  const std::string model = test::SynthFixture({"tiny", 0, prepared::ExpertsMode::kCopy}).checkpoint;
  const auto src = ReadTree(model);
  HubSimConfig cfg;
  cfg.root = model;
  cfg.token = test::kTestToken;
  HubSimProcess sim(tmp.Join("sim"), cfg);
  ASSERT_TRUE(sim.started()) << sim.error();

  DownloadResult r;
  Status s = download::RunDownload(Env::Default(), test::TestOptions(sim.endpoint(), tmp.Join("dst")), &r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(r.files.size(), src.size());
  test::ExpectDownloaded(tmp.Join("dst"), src, Keys(src));
  EXPECT_EQ(r.bytes_read_local, 0u) << "hashing must not re-read downloaded bytes";
  EXPECT_FALSE(std::filesystem::exists(tmp.Join("dst/.k3-partial")));
  EXPECT_GE(sim.CdnRequests().size(), 15u);  // 14 shards + tiktoken.model via the CDN
  test::ExpectTokenNeverAtCdn(sim);

  // A second run finds everything recorded and fetches nothing.
  const size_t cdn_before = sim.CdnRequests().size();
  s = download::RunDownload(Env::Default(), test::TestOptions(sim.endpoint(), tmp.Join("dst")), &r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (const FileOutcome& o : r.files) EXPECT_EQ(o.kind, FileOutcome::Kind::kRecorded) << o.path;
  EXPECT_EQ(r.bytes_fetched, 0u);
  EXPECT_EQ(sim.CdnRequests().size(), cdn_before);
}

TEST(Download, PagedTreeListingAndIncludeGlob) {
  test::TempDir tmp;
  auto src = test::MakeSmallRepo(tmp.Join("src"));
  src["extra/notes.txt"] = "nested file, only with --include\n";
  test::WriteAll(tmp.Join("src/extra/notes.txt"), src["extra/notes.txt"]);
  HubSimConfig cfg;
  cfg.root = tmp.Join("src");
  cfg.page_size = 2;  // 6 entries (5 files + 1 directory) → 3 pages
  HubSimProcess sim(tmp.Join("sim"), cfg);
  ASSERT_TRUE(sim.started()) << sim.error();
  auto o = test::TestOptions(sim.endpoint(), tmp.Join("dst"));
  o.includes = {"extra/*"};
  DownloadResult r;
  Status s = download::RunDownload(Env::Default(), o, &r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  test::ExpectDownloaded(tmp.Join("dst"), src,
                         {"config.json", "extra/notes.txt", "model-00001-of-000002.safetensors",
                          "model-00002-of-000002.safetensors"});
  EXPECT_FALSE(std::filesystem::exists(tmp.Join("dst/README.md")));
}

TEST(Download, IncludeMatchingNothingIsUsageError) {
  test::TempDir tmp;
  test::MakeSmallRepo(tmp.Join("src"));
  HubSimConfig cfg;
  cfg.root = tmp.Join("src");
  HubSimProcess sim(tmp.Join("sim"), cfg);
  ASSERT_TRUE(sim.started()) << sim.error();
  auto o = test::TestOptions(sim.endpoint(), tmp.Join("dst"));
  o.includes = {"*.gguf"};
  Status s = download::RunDownload(Env::Default(), o, nullptr);
  EXPECT_EQ(s.code(), Code::kInvalid);
  EXPECT_NE(s.message().find("--include '*.gguf' matches no file"), std::string::npos)
      << s.message();
}

TEST(Download, MissingTokenGivesAccessError) {
  test::TempDir tmp;
  test::MakeSmallRepo(tmp.Join("src"));
  HubSimConfig cfg;
  cfg.root = tmp.Join("src");
  cfg.token = test::kTestToken;
  HubSimProcess sim(tmp.Join("sim"), cfg);
  ASSERT_TRUE(sim.started()) << sim.error();
  auto o = test::TestOptions(sim.endpoint(), tmp.Join("dst"));
  o.token = "";
  Status s = download::RunDownload(Env::Default(), o, nullptr);
  EXPECT_EQ(s.code(), Code::kInvalid);
  EXPECT_NE(s.message().find("token missing or without access to org/model"), std::string::npos)
      << s.message();
  o.token = "hf_wrong";
  s = download::RunDownload(Env::Default(), o, nullptr);
  EXPECT_NE(s.message().find("token missing or without access to org/model"), std::string::npos);
  EXPECT_EQ(s.message().find("hf_wrong"), std::string::npos) << "token leaked into the message";
}

TEST(Download, PresentUnrecordedFileIsHashedAndAdoptedWrongOneReplaced) {
  test::TempDir tmp;
  auto src = test::MakeSmallRepo(tmp.Join("src"));
  HubSimConfig cfg;
  cfg.root = tmp.Join("src");
  HubSimProcess sim(tmp.Join("sim"), cfg);
  ASSERT_TRUE(sim.started()) << sim.error();
  const std::string good = "model-00001-of-000002.safetensors";
  const std::string bad = "model-00002-of-000002.safetensors";
  test::WriteAll(tmp.Join("dst/" + good), src[good]);
  test::WriteAll(tmp.Join("dst/" + bad), std::string(src[bad].size(), 'x'));
  DownloadResult r;
  Status s = download::RunDownload(Env::Default(), test::TestOptions(sim.endpoint(), tmp.Join("dst")), &r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  test::ExpectDownloaded(tmp.Join("dst"), src, {"config.json", good, bad});
  const std::string good_sha = Sha256Hex(src[good].data(), src[good].size());
  EXPECT_TRUE(test::CdnRanges(sim, good_sha).empty()) << "adopted file was downloaded again";
  EXPECT_EQ(test::ReadAll(tmp.Join("dst/.k3-partial/" + bad + ".replaced")),
            std::string(src[bad].size(), 'x'));
}

TEST(Download, SecondWriterOnSameDirRefused) {
  test::TempDir tmp;
  test::MakeSmallRepo(tmp.Join("src"));
  HubSimConfig cfg;
  cfg.root = tmp.Join("src");
  HubSimProcess sim(tmp.Join("sim"), cfg);
  ASSERT_TRUE(sim.started()) << sim.error();
  std::filesystem::create_directories(tmp.Join("dst/.k3-partial"));
  const int fd = ::open(tmp.Join("dst/.k3-partial/lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);  // "another downloader"
  Status s = download::RunDownload(Env::Default(), test::TestOptions(sim.endpoint(), tmp.Join("dst")), nullptr);
  ::close(fd);
  EXPECT_EQ(s.code(), Code::kInvalid);
  EXPECT_NE(s.message().find("another k3prep download is writing"), std::string::npos)
      << s.message();
  EXPECT_FALSE(std::filesystem::exists(tmp.Join("dst/config.json")));
}

TEST(Download, UnsafeRepoIdRejected) {
  test::TempDir tmp;
  auto o = test::TestOptions("http://127.0.0.1:9", tmp.Join("dst"));
  o.repo = "../etc";
  Status s = download::RunDownload(Env::Default(), o, nullptr);
  EXPECT_EQ(s.code(), Code::kInvalid);
  EXPECT_NE(s.message().find("REPO '../etc'"), std::string::npos) << s.message();
}

int RunCliArgs(std::vector<std::string> args) {
  args.insert(args.begin(), "k3prep");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return prep::Main(static_cast<int>(argv.size()), argv.data());
}

TEST(DownloadCli, MissingDestIsUsageExit2) {
  EXPECT_EQ(RunCliArgs({"download", "org/model"}), 2);
}

TEST(DownloadCli, MultipleConnectionsPerFileNotImplementedExit2) {
  EXPECT_EQ(RunCliArgs({"download", "org/model", "--dest", "/tmp/x", "--connections-per-file",
                        "4"}),
            2);
}

TEST(DownloadCli, TokenFileWithTwoLinesRefusedWithoutEchoingIt) {
  test::TempDir tmp;
  const std::string f = tmp.WriteFile("token", "hf_first_line\nhf_second_line\n");
  std::string source;
  Result<std::string> t = prep::LoadHubToken(Env::Default(), f, &source);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), Code::kInvalid);
  EXPECT_NE(t.status().message().find("control character"), std::string::npos);
  EXPECT_EQ(t.status().message().find("hf_first_line"), std::string::npos);
  const std::string ok = tmp.WriteFile("token2", "  hf_abc  \n");
  Result<std::string> t2 = prep::LoadHubToken(Env::Default(), ok, &source);
  ASSERT_TRUE(t2.ok());
  EXPECT_EQ(*t2, "hf_abc");
}

TEST(DownloadHub, SafeRelativePathRule) {
  EXPECT_TRUE(download::IsSafeRelativePath("a/b.safetensors"));
  EXPECT_FALSE(download::IsSafeRelativePath("/etc/passwd"));
  EXPECT_FALSE(download::IsSafeRelativePath("a/../../b"));
  EXPECT_FALSE(download::IsSafeRelativePath("a//b"));
  EXPECT_FALSE(download::IsSafeRelativePath("./a"));
  EXPECT_FALSE(download::IsSafeRelativePath(""));
  EXPECT_FALSE(download::IsSafeRelativePath("a\\b"));
}

TEST(DownloadRetry, RetryAfterAndRateLimitHeaders) {
  download::HttpResponse r;
  r.headers["retry-after"] = "7";
  ASSERT_TRUE(download::ServerWaitSeconds(r).has_value());
  EXPECT_DOUBLE_EQ(*download::ServerWaitSeconds(r), 7.0);
  download::HttpResponse q;
  q.headers["ratelimit"] = "\"resolvers\";r=0;t=42";
  EXPECT_DOUBLE_EQ(*download::ServerWaitSeconds(q), 43.0);
  q.headers["ratelimit"] = "\"resolvers\";r=5;t=42";
  EXPECT_FALSE(download::ServerWaitSeconds(q).has_value());
}

TEST(DownloadRetry, BackoffDoublesWithJitterCappedAt8s) {
  download::RetryPolicy p;  // 1000 ms base, 8000 ms cap
  std::mt19937_64 rng(1);
  for (int i = 0; i < 50; ++i) {
    const double first = download::BackoffSeconds(p, 1, rng);
    EXPECT_GE(first, 0.5);
    EXPECT_LE(first, 1.0);
    const double third = download::BackoffSeconds(p, 3, rng);
    EXPECT_GE(third, 2.0);
    EXPECT_LE(third, 4.0);
    const double late = download::BackoffSeconds(p, 30, rng);
    EXPECT_GE(late, 4.0);
    EXPECT_LE(late, 8.0);
  }
}

// Runs `k3prep download` as a child; stdout+stderr go to `log`.
pid_t SpawnK3prep(const std::vector<std::string>& args, const std::vector<std::string>& env,
                  const std::string& log) {
  std::vector<std::string> all = {std::string(K3_BINARY_DIR) + "/k3prep/k3prep"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> envs = env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    if (kv.rfind("HF_", 0) != 0) envs.push_back(kv);
  }
  std::vector<char*> envp;
  for (std::string& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data()) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

TEST(Download, SigkillMidTransferThenResumeWithRange) {
  test::TempDir tmp;
  auto src = test::MakeSmallRepo(tmp.Join("src"));
  const std::string shard = "model-00001-of-000002.safetensors";
  const std::string dst = tmp.Join("dst");
  const std::string part = dst + "/.k3-partial/" + shard + ".part";
  const std::string token_file = tmp.WriteFile("token", std::string(test::kTestToken) + "\n");
  const std::vector<std::string> args = {"download", "org/model", "--dest", dst, "--jobs", "1",
                                         "--token-file", token_file, "--progress", "plain",
                                         "--backoff-base-ms", "10"};
  {
    HubSimConfig cfg;
    cfg.root = tmp.Join("src");
    cfg.token = test::kTestToken;
    // The CDN trickles the shard (so the .part grows in several flushes) and never sends byte
    // 100000 or later: the file cannot be finished before the kill, however late it lands.
    cfg.faults = R"([{"mode":"trickle","path":"model-00001-of-000002.safetensors","times":-1,
                      "chunk":4096,"interval":0.05,"hold_at":100000}])";
    HubSimProcess sim(tmp.Join("sim1"), cfg);
    ASSERT_TRUE(sim.started()) << sim.error();
    pid_t pid = SpawnK3prep(args, {"HF_ENDPOINT=" + sim.endpoint()}, tmp.Join("run1.log"));
    ASSERT_GT(pid, 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline &&
           !(std::filesystem::exists(part) && std::filesystem::file_size(part) >= 40000)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    ASSERT_TRUE(std::filesystem::exists(part)) << test::ReadAll(tmp.Join("run1.log"));
    test::ExpectFinalFilesCorrectOrAbsent(dst, src);
    EXPECT_FALSE(std::filesystem::exists(dst + "/" + shard)) << "killed mid-file, yet final";
    test::ExpectTokenNeverAtCdn(sim);
  }
  const uint64_t prefix = std::filesystem::file_size(part);
  ASSERT_GE(prefix, 40000u);
  ASSERT_LE(prefix, 100000u);
  HubSimConfig cfg;
  cfg.root = tmp.Join("src");
  cfg.token = test::kTestToken;
  HubSimProcess sim(tmp.Join("sim2"), cfg);
  ASSERT_TRUE(sim.started()) << sim.error();
  pid_t pid = SpawnK3prep(args, {"HF_ENDPOINT=" + sim.endpoint()}, tmp.Join("run2.log"));
  ASSERT_GT(pid, 0);
  int status = 0;
  waitpid(pid, &status, 0);
  const std::string log = test::ReadAll(tmp.Join("run2.log"));
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << log;
  test::ExpectDownloaded(dst, src, {"config.json", shard, "model-00002-of-000002.safetensors"});
  const auto ranges = test::CdnRanges(sim, Sha256Hex(src[shard].data(), src[shard].size()));
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0], "bytes=" + std::to_string(prefix) + "-");
  EXPECT_NE(log.find("resumed@" + std::to_string(prefix)), std::string::npos) << log;
  EXPECT_EQ(log.find(test::kTestToken), std::string::npos) << "token printed";
  EXPECT_EQ(test::ReadAll(tmp.Join("run1.log")).find(test::kTestToken), std::string::npos);
  test::ExpectTokenNeverAtCdn(sim);
}

// --- PartWriter: the .part appender (O_DIRECT windows, buffered heads and tails) ---

// Byte equality, reported as sizes and the first differing offset (not megabytes of dump).
void ExpectSameBytes(const std::string& got, const std::string& want) {
  ASSERT_EQ(got.size(), want.size());
  size_t i = 0;
  while (i < got.size() && got[i] == want[i]) ++i;
  EXPECT_EQ(i, got.size()) << "first differing byte offset";
}

// Feeds `data` from byte `from` in libcurl-like pieces (16 KiB, with odd sizes mixed in), with
// an early Flush (end of an exchange) after `flush_at` bytes, then closes.
Status FeedPart(download::PartWriter& w, const std::string& data, size_t from, size_t flush_at) {
  w.Reset(from);
  const size_t pieces[] = {16384, 16384, 1, 16384, 4095, 16384, 7, 16384, 100000};
  size_t i = 0;
  for (size_t off = from; off < data.size(); ++i) {
    const size_t n = std::min(pieces[i % std::size(pieces)], data.size() - off);
    K3_RETURN_IF_ERROR(w.Append(data.data() + off, n));
    off += n;
    if (off - from >= flush_at && off - from - n < flush_at) {
      K3_RETURN_IF_ERROR(w.Flush());
      w.Reset(off);  // the next exchange resumes where this one ended (unaligned)
    }
  }
  return w.Close();
}

TEST(DownloadPartWriter, DirectWindowsAndUnalignedTailsAreByteExact) {
  test::TempDir tmp;
  const std::string path = tmp.Join("x.part");
  const std::string data = test::RandomBytes((2u << 20) + 777777, 41);
  Env* env = Env::Default();
  auto part = env->Open(path, OpenMode::kReadWrite);
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  auto w = download::PartWriter::Open(env, part->get(), path);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  if (!(*w)->direct()) std::cout << "[ NOTE     ] no O_DIRECT on " << tmp.path() << "\n";
  Status s = FeedPart(**w, data, 0, 1234567);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE((*part)->Close().ok());
  ExpectSameBytes(test::ReadAll(path), data);
}

TEST(DownloadPartWriter, ResumeFromUnalignedPrefixIsByteExact) {
  test::TempDir tmp;
  const std::string path = tmp.Join("x.part");
  const std::string data = test::RandomBytes((1u << 20) + 300001, 42);
  const size_t prefix = 5003;  // a .part left by a killed run: not a multiple of 4096
  test::WriteAll(path, data.substr(0, prefix));
  Env* env = Env::Default();
  auto part = env->Open(path, OpenMode::kReadWrite);
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  auto w = download::PartWriter::Open(env, part->get(), path);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  Status s = FeedPart(**w, data, prefix, 1u << 30);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE((*part)->Close().ok());
  ExpectSameBytes(test::ReadAll(path), data);
}

TEST(DownloadPartWriter, WithoutDirectIoEverythingGoesThroughThePart) {
  test::TempDir tmp;
  const std::string path = tmp.Join("x.part");
  const std::string data = test::RandomBytes((1u << 20) + 12345, 43);
  test::FaultEnv env;  // its files refuse SetDirect, like tmpfs or a FUSE mount
  env.SetRule(path, test::FaultRule{});
  auto part = env.Open(path, OpenMode::kReadWrite);
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  auto w = download::PartWriter::Open(&env, part->get(), path);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_FALSE((*w)->direct());
  Status s = FeedPart(**w, data, 0, 70000);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE((*part)->Close().ok());
  ExpectSameBytes(test::ReadAll(path), data);
  EXPECT_EQ(env.BytesWritten(path), data.size()) << "every byte written once, through the part";
}

TEST(DownloadPartWriter, WriteFailureNamesPartAndOffset) {
  test::TempDir tmp;
  const std::string path = tmp.Join("x.part");
  test::FaultEnv env;
  env.SetRule(path, test::FaultRule::EnospcAfter(1u << 20));
  auto part = env.Open(path, OpenMode::kReadWrite);
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  auto w = download::PartWriter::Open(&env, part->get(), path);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const std::string data = test::RandomBytes((2u << 20) + 5, 44);
  Status s = FeedPart(**w, data, 0, 1u << 30);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kIo);
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("offset " + std::to_string(1u << 20)), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("free disk space"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace k3
