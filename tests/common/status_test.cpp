#include "common/status.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace k3 {
namespace {

TEST(Status, OkIsOkAndExitsZero) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.exit_code(), 0);
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(Status, EachCodeMapsToItsDocumentedExitCode) {
  EXPECT_EQ(Status::Io("x").exit_code(), 1);
  EXPECT_EQ(Status::Invalid("x").exit_code(), 2);
  EXPECT_EQ(Status::Integrity("x").exit_code(), 3);
  EXPECT_EQ(Status::Unreliable("x").exit_code(), 4);
}

TEST(Status, ToStringPrefixesTheCategory) {
  EXPECT_EQ(Status::Io("disk gone").ToString(), "I/O error: disk gone");
  EXPECT_EQ(Status::Invalid("bad flag").ToString(), "invalid input: bad flag");
  EXPECT_EQ(Status::Integrity("hash").ToString(), "integrity failure: hash");
  EXPECT_EQ(Status::Unreliable("run").ToString(), "unreliable output: run");
}

TEST(Status, IoErrnoNamesPathOffsetAndReason) {
  Status s = Status::IoErrno("read", "/d/shard.safetensors", EIO, 4096);
  EXPECT_EQ(s.code(), Code::kIo);
  EXPECT_EQ(s.message(),
            "/d/shard.safetensors: read at byte offset 4096 failed: Input/output error");
}

TEST(Status, IoErrnoWithoutOffsetOmitsIt) {
  Status s = Status::IoErrno("fsync", "/d/f", EIO);
  EXPECT_EQ(s.message(), "/d/f: fsync failed: Input/output error");
}

TEST(Status, EnospcSaysWhatToDo) {
  Status s = Status::IoErrno("write", "/d/f", ENOSPC, 0);
  EXPECT_NE(s.message().find("No space left on device"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("free disk space"), std::string::npos) << s.message();
}

TEST(Status, WithContextPrependsAndKeepsCode) {
  Status s = Status::Integrity("hash mismatch").WithContext("trunk.bin");
  EXPECT_EQ(s.code(), Code::kIntegrity);
  EXPECT_EQ(s.message(), "trunk.bin: hash mismatch");
  EXPECT_TRUE(Status::Ok().WithContext("ignored").ok());
}

Result<int> Half(int x) {
  if (x % 2 != 0) return Status::Invalid("odd: " + std::to_string(x));
  return x / 2;
}

Status Quarter(int x, int* out) {
  K3_ASSIGN_OR_RETURN(int h, Half(x));
  K3_ASSIGN_OR_RETURN(*out, Half(h));
  return Status::Ok();
}

TEST(Status, AssignOrReturnPropagatesTheFirstFailure) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = Quarter(6, &out);
  EXPECT_EQ(s.code(), Code::kInvalid);
  EXPECT_EQ(s.message(), "odd: 3");
}

TEST(Status, ResultBuiltFromOkStatusIsAnInternalError) {
  Result<int> r(Status::Ok());
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("internal"), std::string::npos);
}

}  // namespace
}  // namespace k3
