// The streaming writer: byte layout (checked against hand-computed offsets and the raw file),
// round trip through ReadHeader, and every failure path ending with neither a final file nor a
// temporary left behind.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "tests/support/fault_env.h"
#include "tests/support/temp_dir.h"

namespace k3::st {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

uint64_t LengthPrefixOf(const std::string& file) {
  uint64_t n = 0;
  for (size_t i = 8; i-- > 0;) n = (n << 8) | static_cast<unsigned char>(file[i]);
  return n;
}

std::string Pattern(size_t n, unsigned seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 31 + seed) & 0xFF);
  return s;
}

class SafetensorsWriterTest : public ::testing::Test {
 protected:
  test::TempDir dir_;
  const std::string path_ = dir_.Join("out.safetensors");
};

TEST_F(SafetensorsWriterTest, RoundTripThroughReader) {
  Writer w(Env::Default(), path_);
  w.SetMetadata({{"format", "pt"}, {"producer", "k3 test"}});
  w.Add("z.first", DType::kF32, {2, 3});   // 24 bytes at [0, 24)
  w.Add("a.second", DType::kBF16, {5});    // 10 bytes at [24, 34)
  w.Add("m.third", DType::kU8, {3});       // 3 bytes at [34, 37)
  w.Add("scalar", DType::kI64, {});        // 8 bytes at [37, 45)
  ASSERT_TRUE(w.Begin().ok());
  const std::string data = Pattern(45, 7);
  ASSERT_TRUE(w.Append(data.data(), 1).ok());
  ASSERT_TRUE(w.Append(data.data() + 1, 7).ok());
  ASSERT_TRUE(w.Append(data.data() + 8, 37).ok());
  const Status finished = w.Finish();
  ASSERT_TRUE(finished.ok()) << finished.ToString();

  EXPECT_THAT(dir_.List(), ElementsAre("out.safetensors"));
  const std::string file = ReadAll(path_);
  const uint64_t n = LengthPrefixOf(file);
  EXPECT_EQ(file.size(), 8 + n + 45);
  EXPECT_EQ(file.size(), w.FileSize());
  EXPECT_EQ(file.substr(8 + n), data);

  const Result<Header> h = ReadHeader(Env::Default(), path_);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ(h->tensors.size(), 4u);
  const std::pair<const char*, std::pair<uint64_t, uint64_t>> want[] = {
      {"z.first", {0, 24}}, {"a.second", {24, 34}}, {"m.third", {34, 37}}, {"scalar", {37, 45}}};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(h->tensors[i].name, want[i].first);
    EXPECT_EQ(h->tensors[i].begin, want[i].second.first);
    EXPECT_EQ(h->tensors[i].end, want[i].second.second);
  }
  EXPECT_EQ(h->tensors[0].shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(h->tensors[1].dtype, DType::kBF16);
  EXPECT_TRUE(h->tensors[3].shape.empty());
  EXPECT_EQ(h->metadata.at("producer"), "k3 test");
}

TEST_F(SafetensorsWriterTest, HeaderHasMetadataFirstThenDeclarationOrder) {
  Writer w(Env::Default(), path_);
  w.SetMetadata({{"format", "pt"}});
  w.Add("b", DType::kU8, {1});
  w.Add("a", DType::kU8, {2});
  ASSERT_TRUE(w.Begin().ok());
  ASSERT_TRUE(w.Append("xyz", 3).ok());
  ASSERT_TRUE(w.Finish().ok());
  const std::string file = ReadAll(path_);
  const std::string header = file.substr(8, LengthPrefixOf(file));
  EXPECT_THAT(header,
              StartsWith(R"({"__metadata__":{"format":"pt"},)"
                         R"("b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                         R"("a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})"));
}

TEST_F(SafetensorsWriterTest, DataSectionStartsAtMultipleOf8) {
  for (size_t len = 1; len <= 9; ++len) {
    Writer w(Env::Default(), path_);
    w.Add(std::string(len, 'n'), DType::kU8, {1});
    ASSERT_TRUE(w.Begin().ok());
    ASSERT_TRUE(w.Append("q", 1).ok());
    ASSERT_TRUE(w.Finish().ok());
    const std::string file = ReadAll(path_);
    const uint64_t n = LengthPrefixOf(file);
    EXPECT_EQ((8 + n) % 8, 0u) << "name length " << len;
    EXPECT_EQ(file.back(), 'q');
    EXPECT_TRUE(ReadHeader(Env::Default(), path_).ok()) << "name length " << len;
  }
}

TEST_F(SafetensorsWriterTest, EscapesQuotesBackslashesAndControlBytes) {
  const std::string name = "q\"uote\\back\nline";
  Writer w(Env::Default(), path_);
  w.SetMetadata({{"note", "say \"hi\"\t"}});
  w.Add(name, DType::kU8, {1});
  ASSERT_TRUE(w.Begin().ok());
  ASSERT_TRUE(w.Append("x", 1).ok());
  ASSERT_TRUE(w.Finish().ok());
  const Result<Header> h = ReadHeader(Env::Default(), path_);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->tensors[0].name, name);
  EXPECT_EQ(h->metadata.at("note"), "say \"hi\"\t");
}

// The writer's escaper is the project's one hand-written JSON escaper (the header's bytes are
// hashed by the reference fixtures): these are its exact bytes.
TEST_F(SafetensorsWriterTest, EscaperWritesShortEscapesForQuoteAndBackslashAndUForControls) {
  Writer w(Env::Default(), path_);
  w.SetMetadata({{"note", "say \"hi\"\t\x1f"}});
  w.Add("q\"uote\\back\nline", DType::kU8, {1});
  ASSERT_TRUE(w.Begin().ok());
  ASSERT_TRUE(w.Append("x", 1).ok());
  ASSERT_TRUE(w.Finish().ok());
  const std::string file = ReadAll(path_);
  const std::string header = file.substr(8, LengthPrefixOf(file));
  EXPECT_THAT(header,
              StartsWith(R"({"__metadata__":{"note":"say \"hi\"\u0009\u001f"},)"
                         R"("q\"uote\\back\u000aline":{"dtype":"U8","shape":[1],)"));
}

TEST_F(SafetensorsWriterTest, NoTensorsGivesAValidFile) {
  Writer w(Env::Default(), path_);
  ASSERT_TRUE(w.Begin().ok());
  ASSERT_TRUE(w.Finish().ok());
  EXPECT_EQ(ReadAll(path_), std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
  const Result<Header> h = ReadHeader(Env::Default(), path_);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_TRUE(h->tensors.empty());
}

// ---- declaration and call-order errors --------------------------------------------------------

TEST_F(SafetensorsWriterTest, FinishWithMissingBytesNamesTheTensor) {
  Writer w(Env::Default(), path_);
  w.Add("a", DType::kU8, {4});
  w.Add("b", DType::kU8, {4});
  ASSERT_TRUE(w.Begin().ok());
  ASSERT_TRUE(w.Append("123456", 6).ok());
  const Status s = w.Finish();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kInvalid);
  EXPECT_THAT(s.message(), HasSubstr("out.safetensors"));
  EXPECT_THAT(s.message(), HasSubstr("tensor \"b\""));
  EXPECT_THAT(s.message(), HasSubstr("received 2 of its 4 bytes"));
  EXPECT_THAT(s.message(), HasSubstr("exactly the declared bytes are appended"));
  EXPECT_THAT(dir_.List(), IsEmpty());
}

TEST_F(SafetensorsWriterTest, AppendBeyondDeclaredBytes) {
  Writer w(Env::Default(), path_);
  w.Add("only", DType::kU8, {4});
  ASSERT_TRUE(w.Begin().ok());
  const Status s = w.Append("12345", 5);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tensor \"only\""));
  EXPECT_THAT(s.message(), HasSubstr("goes past the declared 4 data bytes"));
  EXPECT_THAT(dir_.List(), IsEmpty());
}

TEST_F(SafetensorsWriterTest, DuplicateNameFailsAtBegin) {
  Writer w(Env::Default(), path_);
  w.Add("twice", DType::kU8, {1});
  w.Add("twice", DType::kU8, {1});
  const Status s = w.Begin();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tensor \"twice\""));
  EXPECT_THAT(s.message(), HasSubstr("no duplicate tensor names"));
  EXPECT_THAT(dir_.List(), IsEmpty());
}

TEST_F(SafetensorsWriterTest, UnwritableNameFailsAtBegin) {
  for (const std::string& name :
       {std::string(), std::string("bad\xFF"), std::string("__metadata__"),
        std::string(4097, 'n')}) {
    Writer w(Env::Default(), path_);
    w.Add(name, DType::kU8, {1});
    const Status s = w.Begin();
    ASSERT_FALSE(s.ok()) << name.size();
    EXPECT_THAT(s.message(), HasSubstr("non-empty, at most 4096 bytes, UTF-8"));
  }
  EXPECT_THAT(dir_.List(), IsEmpty());
}

TEST_F(SafetensorsWriterTest, RankAbove8FailsAtBegin) {
  Writer w(Env::Default(), path_);
  w.Add("deep", DType::kU8, std::vector<uint64_t>(9, 1));
  const Status s = w.Begin();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tensor \"deep\""));
  EXPECT_THAT(s.message(), HasSubstr("rank is at most 8"));
}

TEST_F(SafetensorsWriterTest, CallsOutOfOrderAreErrors) {
  Writer w(Env::Default(), path_);
  EXPECT_FALSE(w.Append("x", 1).ok());
  EXPECT_FALSE(w.Finish().ok());
  ASSERT_TRUE(w.Begin().ok());
  EXPECT_FALSE(w.Begin().ok());
}

// ---- cleanup ---------------------------------------------------------------------------------

TEST_F(SafetensorsWriterTest, DestructorWithoutFinishRemovesTemporary) {
  {
    Writer w(Env::Default(), path_);
    w.Add("t", DType::kU8, {4});
    ASSERT_TRUE(w.Begin().ok());
    ASSERT_TRUE(w.Append("12", 2).ok());
    EXPECT_THAT(dir_.List(), ElementsAre("out.safetensors.k3tmp"));
  }
  EXPECT_THAT(dir_.List(), IsEmpty());
}

TEST_F(SafetensorsWriterTest, AbandonRemovesTemporary) {
  Writer w(Env::Default(), path_);
  w.Add("t", DType::kU8, {1});
  ASSERT_TRUE(w.Begin().ok());
  w.Abandon();
  EXPECT_THAT(dir_.List(), IsEmpty());
  EXPECT_FALSE(w.Finish().ok());
}

// ---- injected I/O faults --------------------------------------------------------------------

TEST_F(SafetensorsWriterTest, EnospcLeavesNoFinalFileAndNoTemporary) {
  test::FaultEnv env;
  test::FaultRule rule;
  rule.enospc_after_bytes = 100;
  env.SetRule(path_, rule);
  Writer w(&env, path_);
  w.Add("t", DType::kU8, {1000});
  ASSERT_TRUE(w.Begin().ok());
  const std::string data = Pattern(1000, 3);
  // The writer buffers, so the failure may surface in Append or in Finish.
  Status s = w.Append(data.data(), data.size());
  if (s.ok()) s = w.Finish();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kIo);
  EXPECT_THAT(s.message(), HasSubstr("No space left"));
  EXPECT_THAT(dir_.List(), IsEmpty());
}

TEST_F(SafetensorsWriterTest, EnospcDuringAppendNamesTheTensor) {
  test::FaultEnv env;
  test::FaultRule rule;
  rule.enospc_after_bytes = 1 << 20;
  env.SetRule(path_, rule);
  Writer w(&env, path_);
  w.Add("small", DType::kU8, {16});
  w.Add("big", DType::kU8, {9 << 20});  // larger than the writer's buffer: flushes in Append
  ASSERT_TRUE(w.Begin().ok());
  ASSERT_TRUE(w.Append(Pattern(16, 1).data(), 16).ok());
  const std::string big = Pattern(9 << 20, 2);
  const Status s = w.Append(big.data(), big.size());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kIo);
  EXPECT_THAT(s.message(), HasSubstr("writing tensor \"big\""));
  EXPECT_THAT(dir_.List(), IsEmpty());
}

TEST_F(SafetensorsWriterTest, RenameFailureLeavesNoFinalFile) {
  test::FaultEnv env;
  test::FaultRule rule;
  rule.fail_rename = true;
  env.SetRule(path_, rule);
  Writer w(&env, path_);
  w.Add("t", DType::kU8, {2});
  ASSERT_TRUE(w.Begin().ok());
  ASSERT_TRUE(w.Append("ab", 2).ok());
  const Status s = w.Finish();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kIo);
  EXPECT_THAT(dir_.List(), IsEmpty());
}

TEST_F(SafetensorsWriterTest, SyncFailureLeavesNoFinalFile) {
  test::FaultEnv env;
  test::FaultRule rule;
  rule.fail_sync = true;
  env.SetRule(path_, rule);
  Writer w(&env, path_);
  w.Add("t", DType::kU8, {2});
  ASSERT_TRUE(w.Begin().ok());
  ASSERT_TRUE(w.Append("ab", 2).ok());
  const Status s = w.Finish();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kIo);
  EXPECT_THAT(dir_.List(), IsEmpty());
}

}  // namespace
}  // namespace k3::st
