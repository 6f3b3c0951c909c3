// formats/experts_index: byte layout, round trip, and one test per validation rule.
#include "formats/experts_index.h"

#include <gtest/gtest.h>

#include <cstring>

#include "tests/formats/prepared_fixture.h"

namespace k3::prepared {
namespace {

constexpr char kSource[] = "/p/experts.idx";

// Tiny config: 3 MoE layers x 4 experts, two files, experts 4096-aligned.
prepared::ExpertsIndex TinyIndex() {
  const ModelConfig c = test::TinyConfig();
  prepared::ExpertsIndex idx;
  idx.n_layers = 4;
  idx.first_moe_layer = 1;
  idx.n_experts = 4;
  idx.files = {"experts/layer-001.bin", "/stripe/b/layer-001.bin"};
  for (uint32_t i = 0; i < 12; ++i) {
    idx.records.push_back(prepared::MakeExpertRecord(i % 2, (i / 2) * 4096, prepared::ExpertSubSizes(c),
                                           0x1122334455667788ull + i));
  }
  return idx;
}

prepared::ExpertsIndexCheck TinyCheck(const ModelConfig& c) {
  prepared::ExpertsIndexCheck check;
  check.config = &c;
  check.file_sizes = {6 * 4096, 6 * 4096};
  check.require_aligned = true;
  return check;
}

uint32_t U32At(const std::string& b, size_t at) {
  uint32_t v;
  std::memcpy(&v, b.data() + at, 4);  // the test host is little-endian (x86-64)
  return v;
}
uint64_t U64At(const std::string& b, size_t at) {
  uint64_t v;
  std::memcpy(&v, b.data() + at, 8);
  return v;
}
void SetU32(std::string& b, size_t at, uint32_t v) { std::memcpy(b.data() + at, &v, 4); }
void SetU64(std::string& b, size_t at, uint64_t v) { std::memcpy(b.data() + at, &v, 8); }

// Path table: 32 + (4+21) + (4+23) = 84 → records at 128.
constexpr size_t kRecords = 128;
size_t Rec(size_t i) { return kRecords + 128 * i; }

Status DecodeError(const std::string& bytes) {
  Result<prepared::ExpertsIndex> r = prepared::DecodeExpertsIndex(bytes, kSource);
  return r.ok() ? Status::Ok() : r.status();
}

void ExpectInvalid(const Status& s, std::initializer_list<const char*> parts) {
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kInvalid);
  for (const char* p : parts) {
    EXPECT_NE(s.message().find(p), std::string::npos) << "missing \"" << p << "\" in: " << s.message();
  }
}

TEST(ExpertsIndex, BytesFollowTheDocumentedLayout) {
  const std::string b = prepared::EncodeExpertsIndex(TinyIndex());
  ASSERT_EQ(b.size(), kRecords + 12 * 128);
  EXPECT_EQ(b.substr(0, 4), "K3EI");
  EXPECT_EQ(U32At(b, 4), 1u);
  EXPECT_EQ(U32At(b, 8), 4u);
  EXPECT_EQ(U32At(b, 12), 1u);
  EXPECT_EQ(U32At(b, 16), 4u);
  EXPECT_EQ(U32At(b, 20), 2u);
  EXPECT_EQ(U32At(b, 24), 128u);
  EXPECT_EQ(U32At(b, 28), 0u);
  EXPECT_EQ(U32At(b, 32), 21u);
  EXPECT_EQ(b.substr(36, 21), "experts/layer-001.bin");
  EXPECT_EQ(U32At(b, 57), 23u);
  EXPECT_EQ(b.substr(61, 23), "/stripe/b/layer-001.bin");
  EXPECT_EQ(b.substr(84, 44), std::string(44, '\0'));
  // Record 5 = (layer 2, expert 1): file 1, offset 2 x 4096.
  const size_t r = Rec(5);
  EXPECT_EQ(U32At(b, r + 0), 1u);
  EXPECT_EQ(U32At(b, r + 4), 0u);
  EXPECT_EQ(U64At(b, r + 8), 8192u);
  EXPECT_EQ(U64At(b, r + 16), test::kTinyExpertBytes);
  const uint64_t sub_offsets[6] = {0, 1024, 1088, 2112, 2176, 3200};
  const uint32_t sub_sizes[6] = {1024, 64, 1024, 64, 1024, 64};
  for (size_t s = 0; s < 6; ++s) {
    EXPECT_EQ(U64At(b, r + 24 + 8 * s), sub_offsets[s]);
    EXPECT_EQ(U32At(b, r + 72 + 4 * s), sub_sizes[s]);
  }
  EXPECT_EQ(U64At(b, r + 96), 0x1122334455667788ull + 5);
  EXPECT_EQ(b.substr(r + 104, 24), std::string(24, '\0'));
}

TEST(ExpertsIndex, RoundTrip) {
  const prepared::ExpertsIndex in = TinyIndex();
  Result<prepared::ExpertsIndex> out = prepared::DecodeExpertsIndex(prepared::EncodeExpertsIndex(in), kSource);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->n_layers, 4u);
  EXPECT_EQ(out->first_moe_layer, 1u);
  EXPECT_EQ(out->n_experts, 4u);
  EXPECT_EQ(out->files, in.files);
  ASSERT_EQ(out->records.size(), in.records.size());
  for (size_t i = 0; i < in.records.size(); ++i) {
    const prepared::ExpertRecord& a = in.records[i];
    const prepared::ExpertRecord& b = out->records[i];
    EXPECT_EQ(a.file_id, b.file_id);
    EXPECT_EQ(a.offset, b.offset);
    EXPECT_EQ(a.length, b.length);
    EXPECT_EQ(a.sub_offset, b.sub_offset);
    EXPECT_EQ(a.sub_size, b.sub_size);
    EXPECT_EQ(a.xxh3_64, b.xxh3_64);
  }
  EXPECT_EQ(&out->At(3, 2), &out->records[10]);  // (3 - 1) x 4 + 2
  const ModelConfig c = test::TinyConfig();
  EXPECT_TRUE(prepared::ValidateExpertsIndex(*out, TinyCheck(c), kSource).ok());
}

TEST(ExpertsIndex, AllDenseModelHasNoRecords) {
  prepared::ExpertsIndex idx;
  idx.n_layers = 2;
  idx.first_moe_layer = 2;
  idx.n_experts = 8;
  Result<prepared::ExpertsIndex> out = prepared::DecodeExpertsIndex(prepared::EncodeExpertsIndex(idx), kSource);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(out->records.empty());
}

TEST(ExpertsIndex, TruncatedHeader) {
  ExpectInvalid(DecodeError(prepared::EncodeExpertsIndex(TinyIndex()).substr(0, 20)),
                {kSource, "32-byte header"});
}

TEST(ExpertsIndex, BadMagic) {
  std::string b = prepared::EncodeExpertsIndex(TinyIndex());
  b[3] = 'X';
  ExpectInvalid(DecodeError(b), {kSource, "byte offset 0", "magic"});
}

TEST(ExpertsIndex, BadVersion) {
  std::string b = prepared::EncodeExpertsIndex(TinyIndex());
  SetU32(b, 4, 2);
  ExpectInvalid(DecodeError(b), {kSource, "byte offset 4", "version 2"});
}

TEST(ExpertsIndex, WrongRecordSize) {
  std::string b = prepared::EncodeExpertsIndex(TinyIndex());
  SetU32(b, 24, 64);
  ExpectInvalid(DecodeError(b), {"byte offset 24", "record_size is 64", "must be 128"});
}

TEST(ExpertsIndex, NonzeroReservedHeaderField) {
  std::string b = prepared::EncodeExpertsIndex(TinyIndex());
  b[30] = 1;
  ExpectInvalid(DecodeError(b), {"byte offset 28", "reserved"});
}

TEST(ExpertsIndex, FirstMoeLayerAboveNLayers) {
  std::string b = prepared::EncodeExpertsIndex(TinyIndex());
  SetU32(b, 12, 5);
  ExpectInvalid(DecodeError(b), {"byte offset 12", "first_moe_layer 5", "n_layers 4"});
}

// Header counts are held to the config's bounds before the record count is even computed.
TEST(ExpertsIndex, HeaderCountsAboveTheBoundsRefused) {
  std::string b = prepared::EncodeExpertsIndex(TinyIndex());
  SetU32(b, 8, 1000000000);
  ExpectInvalid(DecodeError(b), {kSource, "byte offset 8", "n_layers 1000000000",
                                 "exceeds the bound 4096"});
  b = prepared::EncodeExpertsIndex(TinyIndex());
  SetU32(b, 16, 65537);
  ExpectInvalid(DecodeError(b), {"byte offset 16", "n_experts 65537", "exceeds the bound 65536"});
  b = prepared::EncodeExpertsIndex(TinyIndex());
  SetU32(b, 8, 4096);
  SetU32(b, 16, 65536);
  ExpectInvalid(DecodeError(b), {"byte offset 16", "exceeds the bound 4194304 routed experts"});
}

TEST(ExpertsIndex, RecordOffsetAboveTheBoundRefused) {
  std::string b = prepared::EncodeExpertsIndex(TinyIndex());
  SetU64(b, Rec(3) + 8, uint64_t{1} << 60);
  ExpectInvalid(DecodeError(b), {"record 3 (layer 1, expert 3)", "offset 1152921504606846976",
                                 "exceeds the bound 1125899906842624"});
}

TEST(ExpertsIndex, PathTableNotPadded) {
  std::string b = prepared::EncodeExpertsIndex(TinyIndex());
  b[100] = 'x';
  ExpectInvalid(DecodeError(b), {"byte offset 100", "padding", "multiple of 64"});
}

TEST(ExpertsIndex, ZeroLengthPath) {
  prepared::ExpertsIndex idx = TinyIndex();
  idx.files[1] = "";
  ExpectInvalid(DecodeError(prepared::EncodeExpertsIndex(idx)), {"byte offset 57", "path_len of file 1 is 0"});
}

TEST(ExpertsIndex, PathLenAbove4096) {
  std::string b = prepared::EncodeExpertsIndex(TinyIndex());
  SetU32(b, 32, 5000);
  ExpectInvalid(DecodeError(b), {"byte offset 32", "path_len of file 0 is 5000", "1..4096"});
}

TEST(ExpertsIndex, PathRunsPastEndOfFile) {
  std::string b = prepared::EncodeExpertsIndex(TinyIndex());
  SetU32(b, 32, 4000);
  ExpectInvalid(DecodeError(b), {"byte offset 32", "runs past the end"});
}

TEST(ExpertsIndex, NFilesThatCannotFit) {
  std::string b = prepared::EncodeExpertsIndex(TinyIndex());
  SetU32(b, 20, 0xFFFFFFFFu);
  ExpectInvalid(DecodeError(b), {"byte offset 20", "n_files 4294967295"});
}

TEST(ExpertsIndex, RecordCountMismatch) {
  const std::string b = prepared::EncodeExpertsIndex(TinyIndex());
  ExpectInvalid(DecodeError(b.substr(0, b.size() - 128)),
                {kSource, "record count mismatch", "hold 11 records", "= 12"});
  std::string more = b;
  SetU32(more, 16, 5);  // header now implies 15 records
  ExpectInvalid(DecodeError(more), {"record count mismatch", "n_experts 5", "= 15"});
  ExpectInvalid(DecodeError(b.substr(0, b.size() - 1)), {"partial"});
}

TEST(ExpertsIndex, NonzeroRecordPadding) {
  std::string b = prepared::EncodeExpertsIndex(TinyIndex());
  b[Rec(6) + 127] = 1;
  ExpectInvalid(DecodeError(b), {"byte offset 896", "record 6 (layer 2, expert 2)", "padding byte 127"});
}

TEST(ExpertsIndex, UnknownFlagBits) {
  std::string b = prepared::EncodeExpertsIndex(TinyIndex());
  SetU32(b, Rec(0) + 4, 0x10);
  ExpectInvalid(DecodeError(b), {"record 0 (layer 1, expert 0)", "flags 0x00000010", "unknown bits"});
}

TEST(ExpertsIndex, FileIdOutOfRange) {
  std::string b = prepared::EncodeExpertsIndex(TinyIndex());
  SetU32(b, Rec(3), 2);
  ExpectInvalid(DecodeError(b), {"byte offset 512", "record 3", "file_id 2", "n_files 2"});
}

TEST(ExpertsIndex, SubOffsetOverlap) {
  std::string b = prepared::EncodeExpertsIndex(TinyIndex());
  SetU64(b, Rec(1) + 24 + 8 * 2, 1000);  // w2.packed starts inside w1.packed
  ExpectInvalid(DecodeError(b), {"record 1", "w2.weight_packed", "sub_offset 1000", "overlaps",
                                 "must be 1088"});
}

TEST(ExpertsIndex, SubOffsetOutOfOrder) {
  prepared::ExpertsIndex idx = TinyIndex();
  // w1.scale placed after w2.packed: the canonical order is violated.
  std::swap(idx.records[4].sub_offset[1], idx.records[4].sub_offset[2]);
  ExpectInvalid(DecodeError(prepared::EncodeExpertsIndex(idx)),
                {"record 4 (layer 2, expert 0)", "w1.weight_scale", "gap", "canonical order"});
}

TEST(ExpertsIndex, LengthNotSumOfSubSizes) {
  std::string b = prepared::EncodeExpertsIndex(TinyIndex());
  SetU64(b, Rec(2) + 16, 4096);
  ExpectInvalid(DecodeError(b), {"record 2", "length 4096", "3264"});
}

TEST(ExpertsIndex, SubSizeNotMatchingConfig) {
  prepared::ExpertsIndex idx = TinyIndex();
  const ModelConfig c = test::TinyConfig();
  ModelConfig other = c;
  other.moe_inter = 96;  // a different model's experts
  idx.records[9] = prepared::MakeExpertRecord(1, 4 * 4096, prepared::ExpertSubSizes(other), 0);
  Result<prepared::ExpertsIndex> decoded = prepared::DecodeExpertsIndex(prepared::EncodeExpertsIndex(idx), kSource);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();  // structurally fine
  ExpectInvalid(prepared::ValidateExpertsIndex(*decoded, TinyCheck(c), kSource),
                {kSource, "record 9 (layer 3, expert 1)", "w1.weight_packed", "is 1536",
                 "implies 1024"});
}

TEST(ExpertsIndex, HeaderDisagreesWithConfig) {
  prepared::ExpertsIndex idx = TinyIndex();
  ModelConfig c = test::TinyConfig();
  c.n_layers = 5;
  ExpectInvalid(prepared::ValidateExpertsIndex(idx, TinyCheck(c), kSource),
                {"byte offset 8", "n_layers is 4", "config says 5"});
}

TEST(ExpertsIndex, ExpertOutsideFile) {
  const ModelConfig c = test::TinyConfig();
  prepared::ExpertsIndexCheck check = TinyCheck(c);
  check.file_sizes[1] = 5 * 4096 + 100;  // the last expert of file 1 no longer fits
  ExpectInvalid(prepared::ValidateExpertsIndex(TinyIndex(), check, kSource),
                {"record 11 (layer 3, expert 3)", "[20480, 23744)", "/stripe/b/layer-001.bin",
                 "of 20580 bytes"});
}

TEST(ExpertsIndex, ExpertsOverlap) {
  prepared::ExpertsIndex idx = TinyIndex();
  idx.records[8].offset = idx.records[6].offset + 64;  // same file (0), inside record 6
  idx.records[8].file_id = 0;
  const ModelConfig c = test::TinyConfig();
  prepared::ExpertsIndexCheck check = TinyCheck(c);
  check.require_aligned = false;
  ExpectInvalid(prepared::ValidateExpertsIndex(idx, check, kSource),
                {"record 6 (layer 2, expert 2)", "record 8 (layer 3, expert 0)", "overlap",
                 "experts/layer-001.bin"});
}

TEST(ExpertsIndex, CopyModeExpertNotAligned) {
  prepared::ExpertsIndex idx = TinyIndex();
  idx.records[2].offset += 64;
  const ModelConfig c = test::TinyConfig();
  ExpectInvalid(prepared::ValidateExpertsIndex(idx, TinyCheck(c), kSource),
                {"record 2", "offset 4160", "multiple of 4096"});
}

TEST(ExpertsIndex, PathTableSizeDisagreesWithManifest) {
  const ModelConfig c = test::TinyConfig();
  prepared::ExpertsIndexCheck check = TinyCheck(c);
  check.file_sizes.pop_back();
  ExpectInvalid(prepared::ValidateExpertsIndex(TinyIndex(), check, kSource), {"lists 2 files", "lists 1"});
}

// ---- absent records (a share's experts held by another rank) ---------------------------------

// TinyIndex with record 5 (layer 2, expert 1) absent.
prepared::ExpertsIndex IndexWithAbsent5() {
  prepared::ExpertsIndex idx = TinyIndex();
  idx.records[5] = prepared::MakeAbsentRecord();
  return idx;
}

TEST(ExpertsIndex, AbsentRecordRoundTripsWithEveryOtherFieldZero) {
  const std::string b = prepared::EncodeExpertsIndex(IndexWithAbsent5());
  EXPECT_EQ(U32At(b, Rec(5) + 4), prepared::kExpertFlagAbsent);
  for (size_t at = 0; at < 128; ++at) {
    if (at < 4 || at >= 8) {
      EXPECT_EQ(b[Rec(5) + at], '\0') << "byte " << at;
    }
  }
  Result<prepared::ExpertsIndex> back = prepared::DecodeExpertsIndex(b, kSource);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->records[5].absent());
  EXPECT_FALSE(back->records[4].absent());
}

// Each field of an absent record set nonzero is refused naming the record and the field.
TEST(ExpertsIndex, AbsentRecordWithANonzeroFieldRefused) {
  struct Case {
    size_t at;
    bool wide;
    const char* field;
  };
  for (const Case& c : {Case{0, false, "file_id is 1"}, Case{8, true, "offset is 1"},
                        Case{16, true, "length is 1"},
                        Case{24 + 8 * 1, true, "sub_offset of w1.weight_scale is 1"},
                        Case{72 + 4 * 2, false, "sub_size of w2.weight_packed is 1"},
                        Case{96, true, "xxh3_64 is 1"}}) {
    std::string b = prepared::EncodeExpertsIndex(IndexWithAbsent5());
    if (c.wide) {
      SetU64(b, Rec(5) + c.at, 1);
    } else {
      SetU32(b, Rec(5) + c.at, 1);
    }
    ExpectInvalid(DecodeError(b), {kSource, "byte offset 768", "record 5 (layer 2, expert 1)",
                                   "absent record", c.field, "must be 0"});
  }
}

TEST(ExpertsIndex, AbsentFlagWithAnUnknownBitIsStillUnknown) {
  std::string b = prepared::EncodeExpertsIndex(IndexWithAbsent5());
  SetU32(b, Rec(5) + 4, prepared::kExpertFlagAbsent | 0x4);
  ExpectInvalid(DecodeError(b), {"record 5", "flags 0x00000005", "unknown bits"});
}

TEST(ExpertsIndex, AbsentRecordWithoutAShareRefused) {
  const ModelConfig c = test::TinyConfig();
  ExpectInvalid(prepared::ValidateExpertsIndex(IndexWithAbsent5(), TinyCheck(c), kSource),
                {kSource, "record 5 (layer 2, expert 1)", "absent, but k3.json has no share"});
}

// Rank 0 of 2 holds experts 0-1 of each layer; 2-3 are absent. Records of file 0 only.
prepared::ExpertsIndex ShareIndex() {
  const ModelConfig c = test::TinyConfig();
  prepared::ExpertsIndex idx = TinyIndex();
  idx.files = {"experts/layer-001.bin"};
  for (uint32_t i = 0; i < 12; ++i) {
    idx.records[i] = i % 4 < 2 ? prepared::MakeExpertRecord(0, i * 4096, prepared::ExpertSubSizes(c), i + 1)
                               : prepared::MakeAbsentRecord();
  }
  return idx;
}

prepared::ExpertsIndexCheck ShareCheck(const ModelConfig& c, const prepared::ExpertShare* share) {
  prepared::ExpertsIndexCheck check;
  check.config = &c;
  check.file_sizes = {12 * 4096};
  check.require_aligned = true;
  check.share = share;
  return check;
}

TEST(ExpertsIndex, ShareWithExactlyTheOtherRanksExpertsAbsentValidates) {
  const ModelConfig c = test::TinyConfig();
  const prepared::ExpertShare share{2, 0, "contiguous"};
  Status s = prepared::ValidateExpertsIndex(ShareIndex(), ShareCheck(c, &share), kSource);
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(ExpertsIndex, ShareWithAnOwnedExpertAbsentRefused) {
  const ModelConfig c = test::TinyConfig();
  const prepared::ExpertShare share{2, 0, "contiguous"};
  prepared::ExpertsIndex idx = ShareIndex();
  idx.records[5] = prepared::MakeAbsentRecord();
  ExpectInvalid(prepared::ValidateExpertsIndex(idx, ShareCheck(c, &share), kSource),
                {"record 5 (layer 2, expert 1)", "absent, but k3.json's share says this "
                 "directory holds it", "rank 0 of 2 holds experts 0..1"});
}

TEST(ExpertsIndex, ShareWithAnotherRanksExpertPresentRefused) {
  const ModelConfig c = test::TinyConfig();
  const prepared::ExpertShare share{2, 1, "contiguous"};  // rank 1 holds 2-3: the index is rank 0's
  ExpectInvalid(prepared::ValidateExpertsIndex(ShareIndex(), ShareCheck(c, &share), kSource),
                {"record 0 (layer 1, expert 0)", "present, but k3.json's share does not hold it",
                 "rank 1 of 2 holds experts 2..3", "rank 0's"});
}

TEST(ExpertsIndex, PathTableFileUsedByNoPresentRecordRefused) {
  const ModelConfig c = test::TinyConfig();
  const prepared::ExpertShare share{2, 0, "contiguous"};
  prepared::ExpertsIndex idx = ShareIndex();
  idx.files.push_back("experts/layer-002.bin");
  prepared::ExpertsIndexCheck check = ShareCheck(c, &share);
  check.file_sizes.push_back(4096);
  ExpectInvalid(prepared::ValidateExpertsIndex(idx, check, kSource),
                {"path table entry 1", "experts/layer-002.bin", "used by no present record"});
}

}  // namespace
}  // namespace k3::prepared
