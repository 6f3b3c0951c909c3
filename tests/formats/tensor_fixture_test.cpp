// Tensor fixture files: one test per reader rule, each with a malformed file, asserting the
// message names the file, the entry and the field; plus the writer's canonical form.
#include "formats/tensor_fixture.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/support/temp_dir.h"

namespace k3::fixture {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kSource[] = "fx.json";
constexpr char kHash[] = "00112233445566778899aabbccddeeff";

// One BF16 entry with two samples; `entry_extra` is spliced into the entry object.
std::string OneEntry(const std::string& entry_fields) {
  return std::string(R"({"format":"k3-tensor-fixture","version":1,"tensors":[{)") + entry_fields +
         "}]}";
}
std::string GoodFields() {
  return std::string(R"("name":"a.weight","dtype":"BF16","shape":[2,3],"xxh3_128":")") + kHash +
         R"(","samples":[{"index":0,"bits":"3f80"},{"index":5,"bits":"c000"}])";
}

Status ParseError(const std::string& text) {
  Result<FixtureFile> r = ParseFixture(text, kSource);
  EXPECT_FALSE(r.ok()) << "accepted: " << text;
  return r.ok() ? Status::Ok() : r.status();
}

TEST(TensorFixtureTest, GoodEntryParses) {
  Result<FixtureFile> r = ParseFixture(OneEntry(GoodFields()), kSource);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->entries.size(), 1u);
  const Entry& e = r->entries[0];
  EXPECT_EQ(e.name, "a.weight");
  EXPECT_EQ(e.dtype, DType::kBF16);
  EXPECT_FALSE(e.mxfp4);
  EXPECT_THAT(e.shape, ElementsAre(2u, 3u));
  EXPECT_EQ(e.xxh3_128.high, 0x0011223344556677u);
  EXPECT_EQ(e.xxh3_128.low, 0x8899aabbccddeeffu);
  ASSERT_EQ(e.samples.size(), 2u);
  EXPECT_EQ(e.samples[1].index, 5u);
  EXPECT_EQ(e.samples[1].bits, 0xc000u);
}

TEST(TensorFixtureTest, MalformedJsonNamesFileAndOffset) {
  Status s = ParseError(R"({"format":"k3-tensor-fixture",)");
  EXPECT_EQ(s.code(), Code::kInvalid);
  EXPECT_THAT(s.message(), HasSubstr(kSource));
  EXPECT_THAT(s.message(), HasSubstr("byte offset"));
}

TEST(TensorFixtureTest, DuplicateKeyRejected) {
  Status s = ParseError(OneEntry(GoodFields() + R"(,"dtype":"F32")"));
  EXPECT_THAT(s.message(), HasSubstr("duplicate key \"dtype\""));
}

TEST(TensorFixtureTest, TopLevelMustBeObject) {
  Status s = ParseError("[]");
  EXPECT_THAT(s.message(), HasSubstr("expected a JSON object"));
}

TEST(TensorFixtureTest, WrongFormatNameRejected) {
  Status s = ParseError(R"({"format":"k3-prepared","version":1,"tensors":[]})");
  EXPECT_THAT(s.message(), HasSubstr("fx.json.format"));
  EXPECT_THAT(s.message(), HasSubstr("not a tensor fixture"));
}

TEST(TensorFixtureTest, UnsupportedVersionRejected) {
  Status s = ParseError(R"({"format":"k3-tensor-fixture","version":2,"tensors":[]})");
  EXPECT_THAT(s.message(), HasSubstr("fx.json.version"));
  EXPECT_THAT(s.message(), HasSubstr("version 2"));
}

TEST(TensorFixtureTest, MissingTopLevelFieldNamed) {
  Status s = ParseError(R"({"format":"k3-tensor-fixture","version":1})");
  EXPECT_THAT(s.message(), HasSubstr("fx.json.tensors: required field is missing"));
}

TEST(TensorFixtureTest, UnknownTopLevelFieldRejected) {
  Status s = ParseError(R"({"format":"k3-tensor-fixture","version":1,"tensors":[],"x":1})");
  EXPECT_THAT(s.message(), HasSubstr("fx.json.x: unknown field"));
}

TEST(TensorFixtureTest, EveryMissingEntryFieldNamed) {
  const std::string h = std::string(R"("xxh3_128":")") + kHash + "\"";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"name", R"("dtype":"U8","shape":[1],)" + h + R"(,"samples":[])"},
      {"dtype", R"("name":"t","shape":[1],)" + h + R"(,"samples":[])"},
      {"shape", R"("name":"t","dtype":"U8",)" + h + R"(,"samples":[])"},
      {"xxh3_128", R"("name":"t","dtype":"U8","shape":[1],"samples":[])"},
      {"samples", R"("name":"t","dtype":"U8","shape":[1],)" + h},
  };
  for (const auto& [field, fields] : cases) {
    SCOPED_TRACE(field);
    Status s = ParseError(OneEntry(fields));
    EXPECT_THAT(s.message(), HasSubstr("tensors[0]"));
    EXPECT_THAT(s.message(), HasSubstr("." + field + ": required field is missing"));
  }
}

TEST(TensorFixtureTest, UnknownEntryFieldRejected) {
  Status s = ParseError(OneEntry(GoodFields() + R"(,"comment":"x")"));
  EXPECT_THAT(s.message(), HasSubstr("tensors[0] \"a.weight\".comment: unknown field"));
}

TEST(TensorFixtureTest, EmptyNameRejected) {
  std::string f = GoodFields();
  f.replace(f.find("a.weight"), 8, "");
  EXPECT_THAT(ParseError(OneEntry(f)).message(), HasSubstr("empty tensor name"));
}

TEST(TensorFixtureTest, UnknownDTypeNamed) {
  std::string f = GoodFields();
  f.replace(f.find("BF16"), 4, "BF17");
  Status s = ParseError(OneEntry(f));
  EXPECT_THAT(s.message(), HasSubstr("\"a.weight\".dtype"));
  EXPECT_THAT(s.message(), HasSubstr("unknown dtype \"BF17\""));
}

TEST(TensorFixtureTest, ShapeMustBeUnsignedIntegers) {
  std::string f = GoodFields();
  f.replace(f.find("[2,3]"), 5, "[2,-3]");
  Status s = ParseError(OneEntry(f));
  EXPECT_THAT(s.message(), HasSubstr("\"a.weight\".shape[1]: expected an unsigned integer"));
}

TEST(TensorFixtureTest, ShapeElementCountOverflowRejected) {
  std::string f = GoodFields();
  f.replace(f.find("[2,3]"), 5, "[4294967296,4294967296]");
  EXPECT_THAT(ParseError(OneEntry(f)).message(), HasSubstr("shape: element count overflows"));
}

TEST(TensorFixtureTest, Mxfp4ShapeMustBeMatrixOfGroups) {
  const std::string f = std::string(R"("name":"e.w1","dtype":"MXFP4","shape":[4,48],)") +
                        R"("xxh3_128":")" + kHash + R"(","samples":[])";
  Status s = ParseError(OneEntry(f));
  EXPECT_THAT(s.message(), HasSubstr("\"e.w1\".shape"));
  EXPECT_THAT(s.message(), HasSubstr("multiple of 32"));
}

TEST(TensorFixtureTest, BadHashHexRejected) {
  for (const std::string bad : {"00112233445566778899AABBCCDDEEFF", "0011", "zz112233445566778899aabbccddeeff"}) {
    SCOPED_TRACE(bad);
    std::string f = GoodFields();
    f.replace(f.find(kHash), 32, bad);
    Status s = ParseError(OneEntry(f));
    EXPECT_THAT(s.message(), HasSubstr("\"a.weight\".xxh3_128"));
    EXPECT_THAT(s.message(), HasSubstr("32 lowercase hex digits"));
  }
}

TEST(TensorFixtureTest, SampleIndexOutsideTensorRejected) {
  std::string f = GoodFields();
  f.replace(f.find("\"index\":5"), 9, "\"index\":6");
  Status s = ParseError(OneEntry(f));
  EXPECT_THAT(s.message(), HasSubstr("\"a.weight\".samples[1].index"));
  EXPECT_THAT(s.message(), HasSubstr("outside the tensor (6 elements)"));
}

TEST(TensorFixtureTest, SampleIndexListedTwiceRejected) {
  std::string f = GoodFields();
  f.replace(f.find("\"index\":5"), 9, "\"index\":0");
  EXPECT_THAT(ParseError(OneEntry(f)).message(), HasSubstr("sampled twice"));
}

TEST(TensorFixtureTest, SampleBitsOfWrongWidthRejected) {
  std::string f = GoodFields();
  f.replace(f.find("3f80"), 4, "3f800000");  // F32 width on a BF16 tensor
  Status s = ParseError(OneEntry(f));
  EXPECT_THAT(s.message(), HasSubstr("\"a.weight\".samples[0].bits"));
  EXPECT_THAT(s.message(), HasSubstr("exactly 4 lowercase hex digits"));
}

TEST(TensorFixtureTest, SampleBitsNotHexRejected) {
  std::string f = GoodFields();
  f.replace(f.find("c000"), 4, "c0g0");
  EXPECT_THAT(ParseError(OneEntry(f)).message(), HasSubstr("samples[1].bits: \"c0g0\""));
}

TEST(TensorFixtureTest, UnknownSampleFieldRejected) {
  std::string f = GoodFields();
  f.replace(f.find(R"("bits":"c000")"), 13, R"("bits":"c000","value":-2.0)");
  EXPECT_THAT(ParseError(OneEntry(f)).message(), HasSubstr("samples[1].value: unknown field"));
}

TEST(TensorFixtureTest, TooManySamplesRejected) {
  std::string samples;
  for (size_t i = 0; i <= kMaxSamples; ++i) {
    samples += (i ? "," : "") + std::string(R"({"index":)") + std::to_string(i) + R"(,"bits":"00"})";
  }
  const std::string f = std::string(R"("name":"t","dtype":"U8","shape":[2000],"xxh3_128":")") +
                        kHash + R"(","samples":[)" + samples + "]";
  EXPECT_THAT(ParseError(OneEntry(f)).message(), HasSubstr("1025 samples, at most 1024"));
}

TEST(TensorFixtureTest, TensorListedTwiceRejected) {
  const std::string text = std::string(R"({"format":"k3-tensor-fixture","version":1,"tensors":[{)") +
                           GoodFields() + "},{" + GoodFields() + "}]}";
  Status s = ParseError(text);
  EXPECT_THAT(s.message(), HasSubstr("tensors[1]: tensor \"a.weight\" is listed twice"));
}

TEST(TensorFixtureTest, RenderIsCanonicalAndRoundTrips) {
  FixtureFile f;
  Entry b;
  b.name = "b";
  b.dtype = DType::kF32;
  b.shape = {3};
  b.samples = {{2, 0x3f800000}, {0, 0x1}};
  Entry a;
  a.name = "a";
  a.mxfp4 = true;
  a.shape = {1, 32};
  a.samples = {{31, 0xc0c00000}};
  f.entries = {b, a};
  const std::string text = RenderFixture(f);
  // Sorted by name, samples by index, hex at the element width.
  EXPECT_LT(text.find("\"a\""), text.find("\"b\""));
  EXPECT_THAT(text, HasSubstr("\"MXFP4\""));
  EXPECT_THAT(text, HasSubstr("\"c0c00000\""));
  EXPECT_THAT(text, HasSubstr("\"00000001\""));
  EXPECT_LT(text.find("\"00000001\""), text.find("\"3f800000\""));
  Result<FixtureFile> back = ParseFixture(text, kSource);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->entries.size(), 2u);
  EXPECT_EQ(back->entries[0].name, "a");
  EXPECT_TRUE(back->entries[0].mxfp4);
  EXPECT_EQ(back->entries[1].samples[1].bits, 0x3f800000u);
  EXPECT_EQ(RenderFixture(*back), text);
}

TEST(TensorFixtureTest, WriteFixtureLeavesNoTemporary) {
  test::TempDir dir;
  ASSERT_TRUE(WriteFixture(Env::Default(), dir.Join("f.json"), FixtureFile{}).ok());
  EXPECT_THAT(dir.List(), ElementsAre("f.json"));
  Result<FixtureFile> r = LoadFixture(Env::Default(), dir.Join("f.json"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->entries.empty());
}

TEST(TensorFixtureTest, SampleIndicesAreFirstLastAndSpread) {
  EXPECT_TRUE(SampleIndices(0).empty());
  EXPECT_THAT(SampleIndices(1), ElementsAre(0u));
  EXPECT_THAT(SampleIndices(3), ElementsAre(0u, 1u, 2u));
  // floor(99·i/7) for i = 0..7.
  EXPECT_THAT(SampleIndices(100), ElementsAre(0u, 14u, 28u, 42u, 56u, 70u, 84u, 99u));
  // No overflow near 2^64.
  const uint64_t big = UINT64_MAX;
  EXPECT_EQ(SampleIndices(big).back(), big - 1);
}

}  // namespace
}  // namespace k3::fixture
