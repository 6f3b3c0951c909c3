// Failure handling under injected faults: short reads, EIO, ENOSPC, truncation, failed rename.
#include "tests/support/fault_env.h"

#include <gtest/gtest.h>

#include <string>

#include "common/hash.h"
#include "tests/support/temp_dir.h"

namespace k3 {
namespace {

using test::FaultEnv;
using test::FaultRule;
using test::TempDir;

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 37 + 11) & 0xFF);
  return s;
}

// Counts PRead calls so a test can prove the short-read rule was actually exercised.
class CountingFile : public File {
 public:
  explicit CountingFile(std::unique_ptr<File> base) : base_(std::move(base)) { path_ = base_->path(); }
  Status PRead(uint64_t o, size_t n, void* d, size_t* g) override {
    ++calls;
    return base_->PRead(o, n, d, g);
  }
  Status PWrite(uint64_t o, const void* s, size_t n, size_t* w) override {
    return base_->PWrite(o, s, n, w);
  }
  Result<uint64_t> Size() override { return base_->Size(); }
  Status Truncate(uint64_t s) override { return base_->Truncate(s); }
  Status Sync() override { return base_->Sync(); }
  int calls = 0;

 private:
  std::unique_ptr<File> base_;
};

TEST(FaultEnv, ReadExactLoopsOverShortReads) {
  TempDir dir;
  const std::string data = Pattern(1000);
  const std::string path = dir.WriteFile("f", data);
  FaultEnv env;
  env.SetRule(path, FaultRule::ShortReads(7));
  auto f = env.Open(path, OpenMode::kRead);
  ASSERT_TRUE(f.ok());
  CountingFile counting(std::move(*f));
  std::string got(990, '\0');
  ASSERT_TRUE(counting.ReadExact(5, got.size(), got.data()).ok());
  EXPECT_EQ(got, data.substr(5, 990));
  EXPECT_EQ(counting.calls, (990 + 6) / 7);
}

TEST(FaultEnv, ReadFileToStringSurvivesOneByteReads) {
  TempDir dir;
  const std::string data = Pattern(300);
  const std::string path = dir.WriteFile("f", data);
  FaultEnv env;
  env.SetRule(path, FaultRule::ShortReads(1));
  auto got = ReadFileToString(&env, path);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, data);
}

TEST(FaultEnv, TruncatedFileIsPrematureEofNamingPathAndOffset) {
  TempDir dir;
  const std::string path = dir.WriteFile("shard.safetensors", Pattern(1000));
  FaultEnv env;
  env.SetRule(path, FaultRule::Truncated(600));
  EXPECT_EQ(*env.FileSize(path), 600u);
  auto f = env.Open(path, OpenMode::kRead);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*(*f)->Size(), 600u);
  std::string buf(500, '\0');
  Status s = (*f)->ReadExact(400, 500, buf.data());
  EXPECT_EQ(s.code(), Code::kIo);
  EXPECT_NE(s.message().find(path + ": premature end of file at byte offset 600"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("wanted 500 bytes from offset 400, 300 missing"), std::string::npos)
      << s.message();
}

TEST(FaultEnv, EioAtOffsetNamesPathAndOffset) {
  TempDir dir;
  const std::string path = dir.WriteFile("f", Pattern(10000));
  FaultEnv env;
  env.SetRule(path, FaultRule::EioAt(8192));
  auto f = env.Open(path, OpenMode::kRead);
  ASSERT_TRUE(f.ok());
  std::string buf(4096, '\0');
  EXPECT_TRUE((*f)->ReadExact(0, 4096, buf.data()).ok()) << "bytes before the fault read fine";
  Status s = (*f)->ReadExact(6000, 4000, buf.data());
  EXPECT_EQ(s.code(), Code::kIo);
  EXPECT_EQ(s.message(), path + ": read at byte offset 8192 failed: Input/output error");
}

TEST(FaultEnv, HashingAFileWithEioFails) {
  TempDir dir;
  const std::string path = dir.WriteFile("f", Pattern(5000));
  FaultEnv env;
  env.SetRule(path, FaultRule::EioAt(4999));
  auto h = Xxh3_128File(&env, path);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("offset 4999"), std::string::npos);
}

TEST(FaultEnv, WriteFileAtomicOnEnospcLeavesNoFinalAndNoTemp) {
  TempDir dir;
  const std::string path = dir.Join("k3.json");
  FaultEnv env;
  env.SetRule(path, FaultRule::EnospcAfter(1000));
  Status s = WriteFileAtomic(&env, path, Pattern(5000));
  EXPECT_EQ(s.code(), Code::kIo);
  EXPECT_NE(s.message().find(TempPathFor(path)), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("No space left on device"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("at byte offset 1000"), std::string::npos) << s.message();
  EXPECT_EQ(env.BytesWritten(path), 1000u);
  EXPECT_TRUE(dir.List().empty()) << "left: " << (dir.List().empty() ? "" : dir.List()[0]);
}

TEST(FaultEnv, WriteFileAtomicOnEnospcKeepsThePreviousVersion) {
  TempDir dir;
  const std::string path = dir.WriteFile("k3.json", "previous");
  FaultEnv env;
  env.SetRule(path, FaultRule::EnospcAfter(3));
  EXPECT_FALSE(WriteFileAtomic(&env, path, "replacement").ok());
  EXPECT_EQ(*ReadFileToString(Env::Default(), path), "previous");
  EXPECT_EQ(dir.List(), std::vector<std::string>{"k3.json"});
}

TEST(FaultEnv, WriteFileAtomicWhenRenameFailsLeavesNoFinalAndNoTemp) {
  TempDir dir;
  const std::string path = dir.Join("k3.sum");
  FaultEnv env;
  env.SetRule(path, FaultRule::RenameFails());
  Status s = WriteFileAtomic(&env, path, "xxh3-128 0 k3.json\n");
  EXPECT_EQ(s.code(), Code::kIo);
  EXPECT_NE(s.message().find("rename to " + path), std::string::npos) << s.message();
  EXPECT_TRUE(dir.List().empty());
}

TEST(FaultEnv, WriteFileAtomicWhenSyncFailsLeavesNoFinalAndNoTemp) {
  TempDir dir;
  const std::string path = dir.Join("out");
  FaultEnv env;
  env.SetRule(path, FaultRule::SyncFails());
  Status s = WriteFileAtomic(&env, path, "data");
  EXPECT_NE(s.message().find("fsync"), std::string::npos) << s.message();
  EXPECT_TRUE(dir.List().empty());
}

TEST(FaultEnv, FreeSpaceCanBeFaked) {
  TempDir dir;
  FaultEnv env;
  env.SetFreeSpace(12345);
  EXPECT_EQ(*env.FreeSpace(dir.path()), 12345u);
  env.SetFreeSpace(std::nullopt);
  EXPECT_NE(*env.FreeSpace(dir.path()), 12345u);
}

TEST(FaultEnv, DirectoryRuleCoversFilesBelowAndLongestKeyWins) {
  TempDir dir;
  const std::string a = dir.WriteFile("a", Pattern(100));
  const std::string b = dir.WriteFile("b", Pattern(100));
  FaultEnv env;
  env.SetRule(dir.path(), FaultRule::Truncated(10));
  env.SetRule(b, FaultRule::Truncated(50));
  EXPECT_EQ(*env.FileSize(a), 10u);
  EXPECT_EQ(*env.FileSize(b), 50u);
}

TEST(FaultEnv, FilesHaveNoDescriptor) {
  TempDir dir;
  const std::string path = dir.WriteFile("f", "x");
  FaultEnv env;
  auto f = env.Open(path, OpenMode::kRead);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->fd(), -1) << "batch readers must take the File::PRead path";
}

}  // namespace
}  // namespace k3
