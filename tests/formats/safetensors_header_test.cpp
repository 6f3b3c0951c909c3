// One test per rule of the safetensors reader (DESIGN.md §4). Each malformed file is built here
// byte by byte, written to a temporary directory and read back through ReadHeader, and the
// message must name the shard, the tensor (when there is one) and the rule.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "formats/safetensors.h"
#include "tests/support/fault_env.h"
#include "tests/support/temp_dir.h"

namespace k3::st {
namespace {

using ::testing::HasSubstr;

constexpr char kShard[] = "model-00003-of-000007.safetensors";

std::string LengthPrefix(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  return out;
}

// 8-byte little-endian length, the header as given, then `data_bytes` data bytes.
std::string MakeFile(const std::string& json, size_t data_bytes) {
  return LengthPrefix(json.size()) + json + std::string(data_bytes, '\x5A');
}

std::string Entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  uint64_t begin, uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
}

class SafetensorsHeaderTest : public ::testing::Test {
 protected:
  Result<Header> ReadBytes(const std::string& bytes) {
    return ReadHeader(Env::Default(), dir_.WriteFile(kShard, bytes));
  }
  Result<Header> Read(const std::string& json, size_t data_bytes) {
    return ReadBytes(MakeFile(json, data_bytes));
  }
  // The read fails as invalid input and the message names the shard and every needle.
  static void ExpectInvalid(const Result<Header>& r, std::initializer_list<std::string> needles) {
    ASSERT_FALSE(r.ok()) << "the malformed file was accepted";
    EXPECT_EQ(r.status().code(), Code::kInvalid) << r.status().ToString();
    EXPECT_THAT(r.status().message(), HasSubstr(kShard));
    for (const std::string& n : needles) EXPECT_THAT(r.status().message(), HasSubstr(n));
  }

  test::TempDir dir_;
};

// ---- valid files ---------------------------------------------------------------------------

TEST_F(SafetensorsHeaderTest, ValidFileParses) {
  const std::string json = "{\"__metadata__\":{\"format\":\"pt\"}," +
                           Entry("a.weight", "F32", "[2,3]", 0, 24) + "," +
                           Entry("b.bias", "BF16", "[5]", 24, 34) + "}";
  const Result<Header> r = Read(json, 34);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->header_len, json.size());
  EXPECT_EQ(r->data_offset, 8 + json.size());
  EXPECT_EQ(r->file_size, 8 + json.size() + 34);
  ASSERT_EQ(r->tensors.size(), 2u);
  EXPECT_EQ(r->tensors[0].name, "a.weight");
  EXPECT_EQ(r->tensors[0].dtype, DType::kF32);
  EXPECT_EQ(r->tensors[0].shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(r->tensors[0].numel(), 6u);
  EXPECT_EQ(r->tensors[1].begin, 24u);
  EXPECT_EQ(r->tensors[1].end, 34u);
  EXPECT_EQ(r->metadata.at("format"), "pt");
}

TEST_F(SafetensorsHeaderTest, TensorsComeBackSortedByBeginOffset) {
  const std::string json = "{" + Entry("late", "U8", "[4]", 4, 8) + "," +
                           Entry("early", "U8", "[4]", 0, 4) + "}";
  const Result<Header> r = Read(json, 8);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors[0].name, "early");
  EXPECT_EQ(r->tensors[1].name, "late");
}

TEST_F(SafetensorsHeaderTest, TrailingSpacePaddingIsAllowed) {
  const Result<Header> r = Read("{" + Entry("t", "I64", "[1]", 0, 8) + "}     ", 8);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors.size(), 1u);
}

TEST_F(SafetensorsHeaderTest, RankZeroAndEmptyTensorsAreAllowed) {
  const std::string json = "{" + Entry("scalar", "F64", "[]", 0, 8) + "," +
                           Entry("empty", "F32", "[0,7]", 8, 8) + "}";
  const Result<Header> r = Read(json, 8);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->tensors[0].shape.empty());
  EXPECT_EQ(r->tensors[1].nbytes(), 0u);
}

TEST_F(SafetensorsHeaderTest, EscapedNamesAreDecoded) {
  const Result<Header> r =
      Read(R"({"a\"b\u00e9":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors[0].name, "a\"b\xC3\xA9");
}

TEST_F(SafetensorsHeaderTest, NameOfExactly4KiBIsAllowed) {
  const Result<Header> r = Read("{" + Entry(std::string(4096, 'n'), "U8", "[1]", 0, 1) + "}", 1);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
}

TEST_F(SafetensorsHeaderTest, EveryDtypeIsAccepted) {
  const std::pair<const char*, uint64_t> kTypes[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
      {"F32", 4},  {"F64", 8}, {"I64", 8}, {"U64", 8}};
  std::string json = "{";
  uint64_t at = 0;
  for (const auto& [name, size] : kTypes) {
    if (at > 0) json += ",";
    json += Entry(std::string("t_") + name, name, "[3]", at, at + 3 * size);
    at += 3 * size;
  }
  json += "}";
  const Result<Header> r = Read(json, at);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors.size(), 16u);
}

// ---- the 8-byte length prefix -------------------------------------------------------------

TEST_F(SafetensorsHeaderTest, FileShorterThanLengthPrefix) {
  ExpectInvalid(ReadBytes(std::string("\x02\0\0\0\0", 5)),
                {"8-byte header length", "only 5 bytes"});
}

TEST_F(SafetensorsHeaderTest, HeaderLengthPastEndOfFile) {
  ExpectInvalid(ReadBytes(LengthPrefix(50) + "{}"),
                {"8 + header length <= file size", "file byte offset 0", "50"});
}

TEST_F(SafetensorsHeaderTest, HeaderLengthAboveLimit) {
  ExpectInvalid(ReadBytes(LengthPrefix(100'000'001) + "{}"),
                {"at most 100,000,000 bytes", "100000001"});
}

// ---- header text -------------------------------------------------------------------------

TEST_F(SafetensorsHeaderTest, EmptyHeader) {
  ExpectInvalid(Read("", 0), {"starts with '{'", "empty"});
}

TEST_F(SafetensorsHeaderTest, HeaderNotStartingWithBrace) {
  ExpectInvalid(Read(" {}", 0), {"starts with '{'", "file byte offset 8"});
}

TEST_F(SafetensorsHeaderTest, HeaderNotUtf8) {
  const std::string json = "{\"__metadata__\":{\"k\":\"v\xC0\xAF\"}}";
  ExpectInvalid(Read(json, 0), {"valid UTF-8", "file byte offset " + std::to_string(8 + 23)});
}

TEST_F(SafetensorsHeaderTest, TensorNameNotUtf8) {
  const std::string json = "{" + Entry("bad\xFFname", "U8", "[1]", 0, 1) + "}";
  ExpectInvalid(Read(json, 1), {"valid UTF-8", "\"bad\\xFFname", "file byte offset 13"});
}

TEST_F(SafetensorsHeaderTest, NewlineAfterObject) {
  ExpectInvalid(Read("{" + Entry("t", "U8", "[1]", 0, 1) + "}\n", 1),
                {"only spaces (0x20) may follow", "\\x0A"});
}

TEST_F(SafetensorsHeaderTest, GarbageAfterObject) {
  ExpectInvalid(Read("{" + Entry("t", "U8", "[1]", 0, 1) + "}  {}", 1),
                {"one well-formed JSON object", "file byte offset"});
}

TEST_F(SafetensorsHeaderTest, MalformedJson) {
  ExpectInvalid(Read(R"({"t":{"dtype":"U8",}})", 0),
                {"one well-formed JSON object", "tensor \"t\"", "file byte offset 27"});
}

TEST_F(SafetensorsHeaderTest, DeepNestingIsRejectedNotRecursed) {
  ExpectInvalid(Read("{\"t\":" + std::string(200000, '[') + "}", 0), {"tensor \"t\"", "object"});
}

// ---- names and duplicates ------------------------------------------------------------------

TEST_F(SafetensorsHeaderTest, DuplicateTensorName) {
  const std::string first = Entry("w", "U8", "[1]", 0, 1);
  const std::string json = "{" + first + "," + Entry("w", "U8", "[1]", 1, 2) + "}";
  ExpectInvalid(Read(json, 2), {"tensor \"w\"", "no duplicate keys", "appears twice",
                                "file byte offset " + std::to_string(8 + 1 + first.size() + 1)});
}

TEST_F(SafetensorsHeaderTest, DuplicateKeyInsideTensorEntry) {
  ExpectInvalid(
      Read(R"({"w":{"dtype":"U8","shape":[1],"dtype":"I8","data_offsets":[0,1]}})", 1),
      {"tensor \"w\"", "no duplicate keys", "\"dtype\" twice"});
}

TEST_F(SafetensorsHeaderTest, DuplicateMetadataBlock) {
  ExpectInvalid(Read(R"({"__metadata__":{},"__metadata__":{}})", 0),
                {"no duplicate keys", "__metadata__ twice", "file byte offset 27"});
}

TEST_F(SafetensorsHeaderTest, DuplicateMetadataKey) {
  ExpectInvalid(Read(R"({"__metadata__":{"a":"1","a":"2"}})", 0),
                {"no duplicate keys", "\"a\" twice"});
}

TEST_F(SafetensorsHeaderTest, EmptyTensorName) {
  ExpectInvalid(Read("{" + Entry("", "U8", "[1]", 0, 1) + "}", 1),
                {"tensor names are non-empty", "file byte offset 9"});
}

TEST_F(SafetensorsHeaderTest, TensorNameLongerThan4KiB) {
  ExpectInvalid(Read("{" + Entry(std::string(4097, 'n'), "U8", "[1]", 0, 1) + "}", 1),
                {"at most 4096 bytes", "4097 bytes", "nnnnnnnn"});
}

// ---- __metadata__ --------------------------------------------------------------------------

TEST_F(SafetensorsHeaderTest, MetadataValueNotString) {
  ExpectInvalid(Read(R"({"__metadata__":{"step":5}})", 0),
                {"__metadata__ maps strings to strings", "\"step\"", "a number"});
}

TEST_F(SafetensorsHeaderTest, MetadataNotObject) {
  ExpectInvalid(Read(R"({"__metadata__":["a"]})", 0),
                {"__metadata__ maps strings to strings", "an array"});
}

// ---- tensor entry grammar -------------------------------------------------------------------

TEST_F(SafetensorsHeaderTest, TensorEntryNotObject) {
  ExpectInvalid(Read(R"({"w":[0,1]})", 0), {"tensor \"w\"", "is an object", "an array"});
}

TEST_F(SafetensorsHeaderTest, UnknownKeyInTensorEntry) {
  ExpectInvalid(
      Read(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"stride":[1]}})", 1),
      {"tensor \"w\"", "only dtype, shape and data_offsets", "\"stride\""});
}

TEST_F(SafetensorsHeaderTest, MissingDtype) {
  ExpectInvalid(Read(R"({"w":{"shape":[1],"data_offsets":[0,1]}})", 1),
                {"tensor \"w\"", "has dtype, shape and data_offsets", "lacks dtype"});
}

TEST_F(SafetensorsHeaderTest, MissingShape) {
  ExpectInvalid(Read(R"({"w":{"dtype":"U8","data_offsets":[0,1]}})", 1),
                {"tensor \"w\"", "has dtype, shape and data_offsets", "lacks shape"});
}

TEST_F(SafetensorsHeaderTest, MissingDataOffsets) {
  ExpectInvalid(Read(R"({"w":{"dtype":"U8","shape":[1]}})", 0),
                {"tensor \"w\"", "has dtype, shape and data_offsets", "lacks data_offsets"});
}

TEST_F(SafetensorsHeaderTest, UnknownDtype) {
  ExpectInvalid(Read("{" + Entry("w", "F4", "[2]", 0, 1) + "}", 1),
                {"tensor \"w\"", "supported dtypes", "unknown dtype \"F4\"", "F8_E8M0"});
}

TEST_F(SafetensorsHeaderTest, DtypeNotString) {
  ExpectInvalid(Read(R"({"w":{"dtype":1,"shape":[1],"data_offsets":[0,1]}})", 1),
                {"tensor \"w\"", "dtype is a string", "a number"});
}

TEST_F(SafetensorsHeaderTest, ShapeNotArray) {
  ExpectInvalid(Read(R"({"w":{"dtype":"U8","shape":4,"data_offsets":[0,4]}})", 4),
                {"tensor \"w\"", "shape is an array of unsigned 64-bit integers"});
}

TEST_F(SafetensorsHeaderTest, NegativeShapeDimension) {
  ExpectInvalid(Read("{" + Entry("w", "U8", "[2,-1]", 0, 1) + "}", 1),
                {"tensor \"w\"", "unsigned 64-bit integers", "shape[1] is negative"});
}

TEST_F(SafetensorsHeaderTest, FractionalShapeDimension) {
  ExpectInvalid(Read("{" + Entry("w", "U8", "[1.5]", 0, 1) + "}", 1),
                {"tensor \"w\"", "unsigned 64-bit integers", "shape[0] is 1.5"});
}

TEST_F(SafetensorsHeaderTest, ShapeDimensionAbove2To64) {
  ExpectInvalid(Read("{" + Entry("w", "U8", "[18446744073709551616]", 0, 1) + "}", 1),
                {"tensor \"w\"", "unsigned 64-bit integers", "18446744073709551616"});
}

TEST_F(SafetensorsHeaderTest, RankAbove8) {
  ExpectInvalid(Read("{" + Entry("w", "U8", "[1,1,1,1,1,1,1,1,1]", 0, 1) + "}", 1),
                {"tensor \"w\"", "rank is at most 8"});
}

TEST_F(SafetensorsHeaderTest, NegativeDataOffset) {
  ExpectInvalid(Read(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", 1),
                {"tensor \"w\"", "data_offsets is [begin, end] of unsigned 64-bit integers",
                 "data_offsets[0] is negative"});
}

TEST_F(SafetensorsHeaderTest, FractionalDataOffset) {
  ExpectInvalid(Read(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1e0]}})", 1),
                {"tensor \"w\"", "unsigned 64-bit integers", "data_offsets[1] is 1e0"});
}

TEST_F(SafetensorsHeaderTest, DataOffsetAbove2To64) {
  ExpectInvalid(
      Read(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,99999999999999999999]}})", 1),
      {"tensor \"w\"", "unsigned 64-bit integers", "99999999999999999999"});
}

TEST_F(SafetensorsHeaderTest, DataOffsetsWithThreeNumbers) {
  ExpectInvalid(Read(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", 1),
                {"tensor \"w\"", "[begin, end]", "more than two"});
}

TEST_F(SafetensorsHeaderTest, DataOffsetsWithOneNumber) {
  ExpectInvalid(Read(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1),
                {"tensor \"w\"", "[begin, end]", "1 number, not two"});
}

// ---- sizes and coverage ----------------------------------------------------------------------

TEST_F(SafetensorsHeaderTest, ElementCountOverflow) {
  ExpectInvalid(Read("{" + Entry("w", "U8", "[4294967296,4294967296]", 0, 0) + "}", 0),
                {"tensor \"w\"", "fits in 64 bits", "overflows"});
}

TEST_F(SafetensorsHeaderTest, ByteSizeOverflowFromDtype) {
  ExpectInvalid(Read("{" + Entry("w", "F64", "[4611686018427387904]", 0, 0) + "}", 0),
                {"tensor \"w\"", "fits in 64 bits"});
}

TEST_F(SafetensorsHeaderTest, ByteSizeDisagreesWithShape) {
  ExpectInvalid(Read("{" + Entry("w", "F32", "[2,2]", 0, 10) + "}", 10),
                {"tensor \"w\"", "end - begin == numel x dtype size", "hold 10 bytes",
                 "needs 16"});
}

TEST_F(SafetensorsHeaderTest, EndBeforeBegin) {
  ExpectInvalid(Read("{" + Entry("w", "U8", "[0]", 5, 4) + "}", 5),
                {"tensor \"w\"", "ends before it begins"});
}

TEST_F(SafetensorsHeaderTest, HoleAtStartOfData) {
  const std::string json = "{" + Entry("w", "U8", "[4]", 4, 8) + "}";
  ExpectInvalid(Read(json, 8), {"tensor \"w\"", "no hole", "[0, 4)",
                                "file byte offset " + std::to_string(8 + json.size())});
}

TEST_F(SafetensorsHeaderTest, HoleBetweenTensors) {
  const std::string json =
      "{" + Entry("a", "U8", "[4]", 0, 4) + "," + Entry("b", "U8", "[4]", 6, 10) + "}";
  ExpectInvalid(Read(json, 10), {"tensor \"b\"", "no hole", "[4, 6)",
                                 "file byte offset " + std::to_string(8 + json.size() + 4)});
}

TEST_F(SafetensorsHeaderTest, OverlappingTensors) {
  const std::string json =
      "{" + Entry("a", "U8", "[4]", 0, 4) + "," + Entry("b", "U8", "[4]", 2, 6) + "}";
  ExpectInvalid(Read(json, 6), {"tensor \"b\"", "without overlap", "inside tensor \"a\""});
}

TEST_F(SafetensorsHeaderTest, DataShorterThanTensors) {
  const std::string json =
      "{" + Entry("a", "U8", "[4]", 0, 4) + "," + Entry("b", "U8", "[4]", 4, 8) + "}";
  ExpectInvalid(Read(json, 6), {"tensor \"b\"", "ends exactly at end of file", "truncated"});
}

TEST_F(SafetensorsHeaderTest, BytesAfterLastTensor) {
  const std::string json = "{" + Entry("a", "U8", "[4]", 0, 4) + "}";
  ExpectInvalid(Read(json, 7), {"tensor \"a\"", "ends exactly at end of file", "3 more bytes",
                                "file byte offset " + std::to_string(8 + json.size() + 4)});
}

TEST_F(SafetensorsHeaderTest, DataWithoutAnyTensor) {
  ExpectInvalid(Read("{}", 1), {"ends exactly at end of file", "1 more byte after"});
}

// ---- reading through the Env ----------------------------------------------------------------

TEST_F(SafetensorsHeaderTest, ShortReadsAreLooped) {
  const std::string path =
      dir_.WriteFile(kShard, MakeFile("{" + Entry("w", "U8", "[3]", 0, 3) + "}", 3));
  test::FaultEnv env;
  test::FaultRule rule;
  rule.max_read_chunk = 3;
  env.SetRule(path, rule);
  const Result<Header> r = ReadHeader(&env, path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors[0].name, "w");
}

TEST_F(SafetensorsHeaderTest, ReadErrorIsAnIoErrorNamingTheFile) {
  const std::string path =
      dir_.WriteFile(kShard, MakeFile("{" + Entry("w", "U8", "[3]", 0, 3) + "}", 3));
  test::FaultEnv env;
  test::FaultRule rule;
  rule.eio_read_offset = 20;
  env.SetRule(path, rule);
  const Result<Header> r = ReadHeader(&env, path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kIo);
  EXPECT_THAT(r.status().message(), HasSubstr(kShard));
}

TEST_F(SafetensorsHeaderTest, TruncatedFileIsInvalid) {
  const std::string path =
      dir_.WriteFile(kShard, MakeFile("{" + Entry("w", "U8", "[3]", 0, 3) + "}", 3));
  test::FaultEnv env;
  test::FaultRule rule;
  rule.truncated_size = 30;
  env.SetRule(path, rule);
  const Result<Header> r = ReadHeader(&env, path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalid);
  EXPECT_THAT(r.status().message(), HasSubstr("8 + header length <= file size"));
}

// ---- helpers ------------------------------------------------------------------------------

TEST(SafetensorsUtf8Test, AcceptsWellFormedSequences) {
  EXPECT_FALSE(FindInvalidUtf8("plain ascii text, long enough for the 8-byte path"));
  EXPECT_FALSE(FindInvalidUtf8("\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF"));
}

TEST(SafetensorsUtf8Test, RejectsMalformedSequences) {
  EXPECT_EQ(FindInvalidUtf8("ab\x80"), 2u);                     // stray continuation
  EXPECT_EQ(FindInvalidUtf8("\xC0\xAF"), 0u);                   // overlong 2-byte
  EXPECT_EQ(FindInvalidUtf8("x\xE0\x80\xAF"), 1u);              // overlong 3-byte
  EXPECT_EQ(FindInvalidUtf8("\xED\xA0\x80"), 0u);               // surrogate U+D800
  EXPECT_EQ(FindInvalidUtf8("\xF4\x90\x80\x80"), 0u);           // above U+10FFFF
  EXPECT_EQ(FindInvalidUtf8("12345678\xE2\x82"), 8u);           // truncated at the end
  EXPECT_EQ(FindInvalidUtf8("\xE2\x28\xA1"), 0u);               // bad continuation
}

TEST(SafetensorsParseFileBytesTest, AgreesWithTheFileReader) {
  const std::string json = "{" + Entry("w", "U8", "[3]", 0, 3) + "}";
  const Result<Header> ok = ParseFileBytes(MakeFile(json, 3), kShard);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->tensors[0].end, 3u);
  const Result<Header> bad = ParseFileBytes(MakeFile(json, 2), kShard);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("ends exactly at end of file"));
}

}  // namespace
}  // namespace k3::st
