// The POSIX Env against the real file system.
#include "common/env.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "common/aligned_buffer.h"
#include "tests/support/fault_env.h"
#include "tests/support/temp_dir.h"

namespace k3 {
namespace {

using test::TempDir;

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + 7) & 0xFF);
  return s;
}

// A writer switches an open file to O_DIRECT for aligned windows and back for the rest; the bytes
// on disk are the same either way. Uses /work when present (tmpfs has no O_DIRECT).
TEST(Env, SetDirectSwitchesAnOpenFileAndKeepsTheBytes) {
  TempDir dir(std::filesystem::exists("/work") ? "/work" : "/tmp");
  Env* env = Env::Default();
  const std::string path = dir.Join("direct.bin");
  auto file = env->Open(path, OpenMode::kCreate);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  if (env->DirectAlignment(path) == 0) GTEST_SKIP() << "this file system has no direct I/O";
  auto buf = AlignedBuffer::AllocateHuge(8192);
  ASSERT_TRUE(buf.ok());
  EXPECT_EQ(buf->size(), size_t{2} << 20);  // rounded up to one huge page
  for (size_t i = 0; i < 8192; ++i) buf->data()[i] = static_cast<uint8_t>(i * 7);
  ASSERT_TRUE((*file)->SetDirect(true).ok());
  EXPECT_TRUE((*file)->direct());
  ASSERT_TRUE((*file)->WriteExact(0, buf->data(), 8192).ok());
  ASSERT_TRUE((*file)->SetDirect(false).ok());
  EXPECT_FALSE((*file)->direct());
  ASSERT_TRUE((*file)->WriteExact(8192, "tail", 4).ok());  // unaligned: buffered
  ASSERT_TRUE((*file)->Sync().ok());
  auto back = ReadFileToString(env, path);
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->size(), 8196u);
  EXPECT_EQ(0, std::memcmp(back->data(), buf->data(), 8192));
  EXPECT_EQ(back->substr(8192), "tail");
}

TEST(Env, SetDirectIsRefusedByFilesWithoutADescriptor) {
  TempDir dir;
  test::FaultEnv env;
  env.SetRule(dir.path(), test::FaultRule::ShortReads(1));
  auto file = env.Open(dir.Join("f.bin"), OpenMode::kCreate);
  ASSERT_TRUE(file.ok());
  const Status s = (*file)->SetDirect(true);
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE((*file)->direct());
}

TEST(Env, WriteFileAtomicThenReadBack) {
  TempDir dir;
  Env* env = Env::Default();
  const std::string path = dir.Join("data.bin");
  const std::string data = Pattern(100000);
  ASSERT_TRUE(WriteFileAtomic(env, path, data).ok());
  auto got = ReadFileToString(env, path);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, data);
  EXPECT_EQ(dir.List(), std::vector<std::string>{"data.bin"}) << "temporary left behind";
}

TEST(Env, WriteFileAtomicReplacesExistingFile) {
  TempDir dir;
  const std::string path = dir.WriteFile("f", "old contents");
  ASSERT_TRUE(WriteFileAtomic(Env::Default(), path, "new").ok());
  EXPECT_EQ(*ReadFileToString(Env::Default(), path), "new");
}

TEST(Env, OpenMissingFileIsInvalidNoSuchFile) {
  TempDir dir;
  const std::string path = dir.Join("absent.safetensors");
  for (OpenMode mode : {OpenMode::kRead, OpenMode::kReadDirect}) {
    auto f = Env::Default()->Open(path, mode);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), Code::kInvalid);
    EXPECT_EQ(f.status().message(), path + ": no such file");
  }
}

TEST(Env, FileSizeOfMissingFileIsInvalid) {
  TempDir dir;
  auto s = Env::Default()->FileSize(dir.Join("nope"));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kInvalid);
  EXPECT_NE(s.status().message().find("nope: no such file"), std::string::npos);
}

TEST(Env, OpenDirectoryForReadingIsInvalid) {
  TempDir dir;
  for (OpenMode mode : {OpenMode::kRead, OpenMode::kReadDirect}) {
    auto f = Env::Default()->Open(dir.path(), mode);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), Code::kInvalid);
    EXPECT_EQ(f.status().message(), dir.path() + ": is a directory, expected a file");
  }
}

// A FIFO named like a shard must be refused at open, not block it: a blocking open(2) would
// hang this test (and k3verify/pack) until ctest's timeout.
TEST(Env, FifoIsRefusedInEveryModeWithoutBlocking) {
  TempDir dir;
  const std::string path = dir.Join("model-00001-of-00002.safetensors");
  ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0) << std::strerror(errno);
  for (OpenMode mode :
       {OpenMode::kRead, OpenMode::kReadDirect, OpenMode::kReadWrite, OpenMode::kCreate}) {
    auto f = Env::Default()->Open(path, mode);
    ASSERT_FALSE(f.ok()) << static_cast<int>(mode);
    EXPECT_EQ(f.status().code(), Code::kInvalid);
    EXPECT_EQ(f.status().message(),
              path + ": is a FIFO (named pipe), expected a regular file (or a symlink to one)");
  }
}

TEST(Env, SymlinkToARegularFileOpensAndReadsBlocking) {
  TempDir dir;
  ASSERT_TRUE(WriteFileAtomic(Env::Default(), dir.Join("real"), "abc").ok());
  std::filesystem::create_symlink(dir.Join("real"), dir.Join("link"));
  auto f = Env::Default()->Open(dir.Join("link"), OpenMode::kRead);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  // O_NONBLOCK is an open-time guard only; the descriptor handed out blocks as usual.
  EXPECT_EQ(::fcntl((*f)->fd(), F_GETFL) & O_NONBLOCK, 0);
  char buf[3] = {};
  size_t got = 0;
  ASSERT_TRUE((*f)->PRead(0, 3, buf, &got).ok());
  EXPECT_EQ(std::string(buf, got), "abc");
}

TEST(Env, CharacterDeviceIsRefusedForReadingButTakesOutput) {
  auto in = Env::Default()->Open("/dev/zero", OpenMode::kRead);
  ASSERT_FALSE(in.ok());
  EXPECT_EQ(in.status().message(),
            "/dev/zero: is a character device, expected a regular file (or a symlink to one)");
  EXPECT_TRUE(Env::Default()->Open("/dev/null", OpenMode::kCreate).ok());
}

TEST(Env, CreateInMissingDirectoryNamesThePath) {
  TempDir dir;
  const std::string path = dir.Join("no/such/dir/file");
  auto f = Env::Default()->Open(path, OpenMode::kCreate);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find(path), std::string::npos);
}

TEST(Env, PWriteThenPReadAtOffsets) {
  TempDir dir;
  Env* env = Env::Default();
  const std::string path = dir.Join("rw");
  auto f = env->Open(path, OpenMode::kReadWrite);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->WriteExact(10, "hello", 5).ok());
  ASSERT_TRUE((*f)->WriteExact(0, "0123456789", 10).ok());
  EXPECT_EQ(*(*f)->Size(), 15u);
  char buf[6] = {};
  ASSERT_TRUE((*f)->ReadExact(8, 5, buf).ok());
  EXPECT_EQ(std::string(buf, 5), "89hel");
  ASSERT_TRUE((*f)->Truncate(4).ok());
  EXPECT_EQ(*(*f)->Size(), 4u);
  ASSERT_TRUE((*f)->Sync().ok());
  ASSERT_TRUE((*f)->Close().ok());
  size_t got = 0;
  EXPECT_FALSE((*f)->PRead(0, 1, buf, &got).ok()) << "reads after Close must fail";
}

TEST(Env, ReadExactPastEndNamesPathAndOffset) {
  TempDir dir;
  const std::string path = dir.WriteFile("short", "abcdef");
  auto f = Env::Default()->Open(path, OpenMode::kRead);
  ASSERT_TRUE(f.ok());
  char buf[10];
  Status s = (*f)->ReadExact(2, 10, buf);
  EXPECT_EQ(s.code(), Code::kIo);
  EXPECT_NE(s.message().find(path + ": premature end of file at byte offset 6"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("6 missing"), std::string::npos) << s.message();
}

TEST(Env, ReadFileToStringRefusesFilesOverTheLimit) {
  TempDir dir;
  const std::string path = dir.WriteFile("big", std::string(100, 'x'));
  auto r = ReadFileToString(Env::Default(), path, 99);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalid);
  EXPECT_NE(r.status().message().find(path + ": file is 100 bytes"), std::string::npos);
  EXPECT_NE(r.status().message().find("limit of 99"), std::string::npos);
}

TEST(Env, ListDirIsSortedAndSkipsDots) {
  TempDir dir;
  dir.WriteFile("b.safetensors", "12345");
  dir.WriteFile("a.safetensors", "1");
  dir.WriteFile("sub/x", "");
  auto entries = Env::Default()->ListDir(dir.path());
  ASSERT_TRUE(entries.ok());
  ASSERT_EQ(entries->size(), 3u);
  EXPECT_EQ((*entries)[0].name, "a.safetensors");
  EXPECT_EQ((*entries)[0].size, 1u);
  EXPECT_EQ((*entries)[1].name, "b.safetensors");
  EXPECT_EQ((*entries)[1].size, 5u);
  EXPECT_FALSE((*entries)[1].is_dir);
  EXPECT_EQ((*entries)[2].name, "sub");
  EXPECT_TRUE((*entries)[2].is_dir);
}

TEST(Env, ListDirOfMissingDirectoryIsInvalid) {
  TempDir dir;
  auto entries = Env::Default()->ListDir(dir.Join("gone"));
  ASSERT_FALSE(entries.ok());
  EXPECT_EQ(entries.status().code(), Code::kInvalid);
  EXPECT_NE(entries.status().message().find("gone: no such directory"), std::string::npos);
}

TEST(Env, MakeDirsCreatesNestedAndToleratesExisting) {
  TempDir dir;
  Env* env = Env::Default();
  const std::string deep = dir.Join("a/b/c");
  ASSERT_TRUE(env->MakeDirs(deep).ok());
  EXPECT_TRUE(env->IsDirectory(deep));
  EXPECT_TRUE(env->MakeDirs(deep + "/").ok());
}

TEST(Env, MakeDirsThroughAFileIsInvalid) {
  TempDir dir;
  const std::string file = dir.WriteFile("plain", "x");
  Status s = Env::Default()->MakeDirs(file + "/sub");
  EXPECT_EQ(s.code(), Code::kInvalid);
  EXPECT_NE(s.message().find(file), std::string::npos) << s.message();
}

TEST(Env, RenameRemoveExists) {
  TempDir dir;
  Env* env = Env::Default();
  const std::string a = dir.WriteFile("a", "A");
  const std::string b = dir.WriteFile("b", "B");
  ASSERT_TRUE(env->Rename(a, b).ok());
  EXPECT_FALSE(env->Exists(a));
  EXPECT_EQ(*ReadFileToString(env, b), "A");
  ASSERT_TRUE(env->Remove(b).ok());
  EXPECT_FALSE(env->Exists(b));
  EXPECT_EQ(env->Remove(b).code(), Code::kInvalid);
}

TEST(Env, FreeSpaceIsPositive) {
  TempDir dir;
  auto free = Env::Default()->FreeSpace(dir.path());
  ASSERT_TRUE(free.ok());
  EXPECT_GT(*free, 0u);
}

TEST(Env, CanonicalPathResolvesDotDot) {
  TempDir dir;
  Env* env = Env::Default();
  ASSERT_TRUE(env->MakeDirs(dir.Join("x")).ok());
  auto canon = env->CanonicalPath(dir.Join("x/.."));
  ASSERT_TRUE(canon.ok());
  EXPECT_EQ(*canon, std::filesystem::canonical(dir.path()).string());
}

TEST(Env, DirectAlignmentIsZeroOrAPowerOfTwo) {
  TempDir dir;
  const std::string path = dir.WriteFile("f", "x");
  const uint32_t a = Env::Default()->DirectAlignment(path);
  EXPECT_EQ(a & (a - 1), 0u) << a;
  EXPECT_LE(a, 1u << 20);
}

TEST(Env, JoinPathAndTempPath) {
  EXPECT_EQ(JoinPath("d", "f"), "d/f");
  EXPECT_EQ(JoinPath("d/", "f"), "d/f");
  EXPECT_EQ(JoinPath("", "f"), "f");
  EXPECT_EQ(TempPathFor("/x/k3.json"), "/x/k3.json.k3tmp");
}

TEST(Env, BufferedWriterProducesTheSameBytesAsOneWrite) {
  TempDir dir;
  Env* env = Env::Default();
  const std::string path = dir.Join("buffered");
  const std::string big = Pattern(5000);
  {
    auto f = env->Open(path, OpenMode::kCreate);
    ASSERT_TRUE(f.ok());
    BufferedWriter w(f->get(), 0, 64);  // tiny buffer: every path (fill, flush, bypass) runs
    ASSERT_TRUE(w.Append("abc", 3).ok());
    ASSERT_TRUE(w.AppendZeros(100).ok());
    ASSERT_TRUE(w.Append(big.data(), big.size()).ok());
    ASSERT_TRUE(w.Append("z", 1).ok());
    EXPECT_EQ(w.offset(), 3u + 100u + big.size() + 1u);
    ASSERT_TRUE(w.Flush().ok());
  }
  const std::string want = "abc" + std::string(100, '\0') + big + "z";
  EXPECT_EQ(*ReadFileToString(env, path), want);
}

}  // namespace
}  // namespace k3
