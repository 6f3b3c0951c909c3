// formats/sequence_state: byte layout, bit-exact round trip, one test per refusal rule (code,
// source, field), atomic writes, reading through Env, and the fuzz seed corpus.
#include "formats/sequence_state.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <fstream>
#include <optional>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <initializer_list>

#include "tests/support/fault_env.h"
#include "tests/support/files.h"
#include "tests/support/temp_dir.h"

namespace k3::seqstate {
namespace {

constexpr char kSource[] = "/s/chat.k3ss";
// Also the fuzz target's expected model (tests/fuzz/sequence_state_fuzz.cpp).
constexpr Hash128 kModel{0x0123456789abcdefull, 0xfedcba9876543210ull};
constexpr Hash128 kOtherModel{0x0123456789abcdefull, 0xfedcba9876543211ull};

float Bits(uint32_t u) { return std::bit_cast<float>(u); }

// 4 layers, 5 tokens, sections for layers 0 (KDA, 6 floats), 1 (MLA, 3), 3 (KDA, empty).
// Body: tokens at 64..84; section 0 at 84 (floats at 100), 1 at 124 (floats at 140), 2 at 152.
SequenceState TinyState() {
  SequenceState s;
  s.model = kModel;
  s.layers = 4;
  s.tokens = {1, 2, 100000, 0, 7};
  s.sections.push_back({0, kKda, {1.5f, -0.0f, Bits(0x7fc12345u), Bits(0xffa00001u),
                                  Bits(0x00000001u), Bits(0x7f800000u)}});
  s.sections.push_back({1, kMla, {3.0f, -2.25f, 1e-30f}});
  s.sections.push_back({3, kKda, {}});
  return s;
}
constexpr size_t kSection0 = 84;
constexpr size_t kSection1 = 124;
constexpr size_t kSection2 = 152;
constexpr size_t kTinySize = 168;

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

// After editing the body: body_bytes and body_xxh3_64 made to match again, so the edit reaches
// the structure checks that run after the hash.
std::string Rehash(std::string b) {
  SetU64(b, 40, b.size() - 64);
  SetU64(b, 48, Xxh3_64(b.data() + 64, b.size() - 64));
  return b;
}

Status DecodeError(const std::string& bytes, const Hash128& model = kModel) {
  Result<SequenceState> r = DecodeSequenceState(bytes, kSource, model);
  return r.ok() ? Status::Ok() : r.status();
}

void ExpectRefused(const Status& s, Code code, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), code) << s.message();
  for (const std::string& p : parts) {
    EXPECT_NE(s.message().find(p), std::string::npos) << "missing \"" << p << "\" in: " << s.message();
  }
}

void ExpectSameBits(const SequenceState& a, const SequenceState& b) {
  EXPECT_EQ(a.model, b.model);
  EXPECT_EQ(a.layers, b.layers);
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.sections.size(), b.sections.size());
  for (size_t i = 0; i < a.sections.size(); ++i) {
    EXPECT_EQ(a.sections[i].layer, b.sections[i].layer);
    EXPECT_EQ(a.sections[i].kind, b.sections[i].kind);
    ASSERT_EQ(a.sections[i].data.size(), b.sections[i].data.size());
    for (size_t k = 0; k < a.sections[i].data.size(); ++k) {
      EXPECT_EQ(std::bit_cast<uint32_t>(a.sections[i].data[k]),
                std::bit_cast<uint32_t>(b.sections[i].data[k]))
          << "section " << i << " float " << k;
    }
  }
}

TEST(SequenceState, BytesFollowTheDocumentedLayout) {
  const std::string b = EncodeSequenceState(TinyState());
  ASSERT_EQ(b.size(), kTinySize);
  EXPECT_EQ(b.substr(0, 4), "K3SS");
  EXPECT_EQ(U32At(b, 4), 1u);
  EXPECT_EQ(U64At(b, 8), kModel.high);
  EXPECT_EQ(U64At(b, 16), kModel.low);
  EXPECT_EQ(U32At(b, 24), 4u);
  EXPECT_EQ(U32At(b, 28), 3u);
  EXPECT_EQ(U64At(b, 32), 5u);
  EXPECT_EQ(U64At(b, 40), kTinySize - 64);
  EXPECT_EQ(U64At(b, 48), Xxh3_64(b.data() + 64, kTinySize - 64));
  EXPECT_EQ(U64At(b, 56), 0u);
  EXPECT_EQ(U32At(b, 64 + 8), 100000u);
  EXPECT_EQ(U32At(b, kSection0), 0u);
  EXPECT_EQ(U32At(b, kSection0 + 4), kKda);
  EXPECT_EQ(U64At(b, kSection0 + 8), 6u);
  EXPECT_EQ(U32At(b, kSection0 + 16 + 4), 0x80000000u);  // -0.0f
  EXPECT_EQ(U32At(b, kSection0 + 16 + 12), 0xffa00001u);  // signalling NaN, payload kept
  EXPECT_EQ(U32At(b, kSection1), 1u);
  EXPECT_EQ(U32At(b, kSection1 + 4), kMla);
  EXPECT_EQ(U64At(b, kSection2 + 8), 0u);
}

TEST(SequenceState, RoundTripIsBitExact) {
  const SequenceState s = TinyState();
  const std::string b = EncodeSequenceState(s);
  Result<SequenceState> back = DecodeSequenceState(b, kSource, kModel);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSameBits(s, *back);
  EXPECT_EQ(EncodeSequenceState(*back), b);
}

TEST(SequenceState, EmptySequenceRoundTrips) {
  SequenceState s;
  s.model = kModel;
  s.layers = 1;
  const std::string b = EncodeSequenceState(s);
  EXPECT_EQ(b.size(), 64u);
  Result<SequenceState> back = DecodeSequenceState(b, kSource, kModel);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSameBits(s, *back);
}

// --- kInvalid: the header, in check order ---

TEST(SequenceState, EmptyFileIsNotAStateFile) {
  ExpectRefused(DecodeError(""), Code::kInvalid, {kSource, "magic", "not a k3 sequence state file"});
}

TEST(SequenceState, ShorterThanMagicIsNotAStateFile) {
  ExpectRefused(DecodeError("K3S"), Code::kInvalid, {kSource, "magic", "not a k3 sequence state file"});
}

TEST(SequenceState, BadMagic) {
  std::string b = EncodeSequenceState(TinyState());
  b[3] = 'I';
  ExpectRefused(DecodeError(b), Code::kInvalid,
                {kSource, "byte offset 0", "magic", "not a k3 sequence state file"});
}

TEST(SequenceState, WrongVersion) {
  std::string b = EncodeSequenceState(TinyState());
  SetU32(b, 4, 2);
  ExpectRefused(DecodeError(b), Code::kInvalid,
                {kSource, "byte offset 4", "version 2; this k3run reads version 1",
                 "save the state again"});
}

TEST(SequenceState, WrongVersionIsReportedBeforeTruncation) {
  std::string b = EncodeSequenceState(TinyState()).substr(0, 20);
  SetU32(b, 4, 7);
  ExpectRefused(DecodeError(b), Code::kInvalid, {kSource, "version 7"});
}

TEST(SequenceState, NonzeroReservedByte) {
  std::string b = EncodeSequenceState(TinyState());
  b[61] = 1;
  ExpectRefused(DecodeError(b), Code::kInvalid, {kSource, "byte offset 61", "reserved", "must be 0"});
}

TEST(SequenceState, ZeroLayers) {
  std::string b = EncodeSequenceState(TinyState());
  SetU32(b, 24, 0);
  ExpectRefused(DecodeError(b), Code::kInvalid, {kSource, "byte offset 24", "layers is 0", "1..4096"});
}

TEST(SequenceState, TooManyLayers) {
  std::string b = EncodeSequenceState(TinyState());
  SetU32(b, 24, 4097);
  ExpectRefused(DecodeError(b), Code::kInvalid, {kSource, "byte offset 24", "layers is 4097"});
}

TEST(SequenceState, TooManyTokens) {
  std::string b = EncodeSequenceState(TinyState());
  SetU64(b, 32, (uint64_t{1} << 20) + 1);
  ExpectRefused(DecodeError(b), Code::kInvalid, {kSource, "byte offset 32", "n_tokens", "2^20"});
}

TEST(SequenceState, TooManySections) {
  std::string b = EncodeSequenceState(TinyState());
  SetU32(b, 28, 65537);
  ExpectRefused(DecodeError(b), Code::kInvalid, {kSource, "byte offset 28", "n_sections", "65536"});
}

TEST(SequenceState, ForeignModel) {
  const std::string b = EncodeSequenceState(TinyState());
  ExpectRefused(DecodeError(b, kOtherModel), Code::kInvalid,
                {kSource, "byte offset 8", "model",
                 "saved for another prepared directory (k3.json xxh3-128 " + kModel.Hex() + ")",
                 "this one is " + kOtherModel.Hex()});
}

TEST(SequenceState, ForeignModelIsReportedBeforeTheBodyHash) {
  std::string b = EncodeSequenceState(TinyState());
  b[100] ^= 1;
  ExpectRefused(DecodeError(b, kOtherModel), Code::kInvalid, {kSource, "another prepared directory"});
}

// --- kIntegrity: size and body hash ---

TEST(SequenceState, TruncatedHeader) {
  const std::string b = EncodeSequenceState(TinyState()).substr(0, 40);
  ExpectRefused(DecodeError(b), Code::kIntegrity, {kSource, "truncated", "64-byte header"});
}

TEST(SequenceState, TruncatedBody) {
  const std::string b = EncodeSequenceState(TinyState()).substr(0, kTinySize - 1);
  ExpectRefused(DecodeError(b), Code::kIntegrity,
                {kSource, "truncated", "body_bytes", std::to_string(kTinySize - 1)});
}

TEST(SequenceState, TrailingBytes) {
  const std::string b = EncodeSequenceState(TinyState()) + "xy";
  ExpectRefused(DecodeError(b), Code::kIntegrity,
                {kSource, "byte offset 168", "2 trailing bytes", "body_bytes"});
}

TEST(SequenceState, BodyHashMismatch) {
  std::string b = EncodeSequenceState(TinyState());
  b[kSection1 + 16] ^= 0x01;  // one bit of one float
  ExpectRefused(DecodeError(b), Code::kIntegrity,
                {kSource, "byte offset 48", "body_xxh3_64", "altered or damaged"});
}

// --- kInvalid: body structure, after the hash passed ---

TEST(SequenceState, TokensRunPastTheBody) {
  SequenceState s = TinyState();
  s.sections.clear();
  std::string b = EncodeSequenceState(s);
  SetU64(b, 32, 6);  // 6 tokens declared, 5 present
  ExpectRefused(DecodeError(Rehash(b)), Code::kInvalid,
                {kSource, "byte offset 64", "tokens", "n_tokens 6", "past the end of the body"});
}

TEST(SequenceState, NegativeTokenId) {
  std::string b = EncodeSequenceState(TinyState());
  SetU32(b, 64 + 12, 0xffffffffu);
  ExpectRefused(DecodeError(Rehash(b)), Code::kInvalid,
                {kSource, "byte offset 76", "tokens[3] is -1", ">= 0"});
}

TEST(SequenceState, SectionHeaderRunsPastTheBody) {
  std::string b = EncodeSequenceState(TinyState());
  SetU32(b, 28, 4);  // a fourth section that is not there
  ExpectRefused(DecodeError(Rehash(b)), Code::kInvalid,
                {kSource, "byte offset 168", "section 3", "16-byte header", "past the end"});
}

TEST(SequenceState, SectionFloatsRunPastTheBody) {
  std::string b = EncodeSequenceState(TinyState());
  SetU64(b, kSection2 + 8, 1);  // the last section claims a float the body does not hold
  ExpectRefused(DecodeError(Rehash(b)), Code::kInvalid,
                {kSource, "byte offset 152", "section 2", "n_floats 1", "past the end of the body"});
}

TEST(SequenceState, HugeFloatCountRunsPastTheBody) {
  std::string b = EncodeSequenceState(TinyState());
  SetU64(b, kSection1 + 8, ~uint64_t{0});  // 4 × n_floats would overflow
  ExpectRefused(DecodeError(Rehash(b)), Code::kInvalid,
                {kSource, "byte offset 124", "section 1", "n_floats 18446744073709551615"});
}

TEST(SequenceState, UnknownSectionKind) {
  std::string b = EncodeSequenceState(TinyState());
  SetU32(b, kSection1 + 4, 3);
  ExpectRefused(DecodeError(Rehash(b)), Code::kInvalid,
                {kSource, "byte offset 124", "section 1", "kind is 3", "unknown"});
}

TEST(SequenceState, SectionLayerNotBelowLayers) {
  std::string b = EncodeSequenceState(TinyState());
  SetU32(b, kSection2, 4);
  ExpectRefused(DecodeError(Rehash(b)), Code::kInvalid,
                {kSource, "byte offset 152", "section 2", "layer is 4", "< layers 4"});
}

TEST(SequenceState, SameLayerTwice) {
  std::string b = EncodeSequenceState(TinyState());
  SetU32(b, kSection2, 0);
  ExpectRefused(DecodeError(Rehash(b)), Code::kInvalid,
                {kSource, "byte offset 152", "section 2", "layer 0 already has a section (section 0)"});
}

TEST(SequenceState, BytesLeftOverAfterTheLastSection) {
  std::string b = EncodeSequenceState(TinyState());
  SetU32(b, 28, 2);  // the third section's bytes are now left over
  ExpectRefused(DecodeError(Rehash(b)), Code::kInvalid,
                {kSource, "byte offset 152", "16 bytes left over", "n_sections 2"});
}

// --- Write and Read through Env ---

TEST(SequenceState, WriteThenReadRoundTrips) {
  test::TempDir tmp;
  const std::string path = tmp.Join("chat.k3ss");
  ASSERT_TRUE(WriteSequenceState(Env::Default(), path, TinyState()).ok());
  EXPECT_EQ(test::ReadWholeFile(path), EncodeSequenceState(TinyState()));
  Result<SequenceState> back = ReadSequenceState(Env::Default(), path, kModel);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSameBits(TinyState(), *back);
}

TEST(SequenceState, FailedWriteLeavesNoFile) {
  for (const test::FaultRule& rule : {test::FaultRule::EnospcAfter(100), test::FaultRule::SyncFails(),
                                      test::FaultRule::RenameFails()}) {
    test::TempDir tmp;
    const std::string path = tmp.Join("chat.k3ss");
    test::FaultEnv env;
    env.SetRule(path, rule);
    EXPECT_FALSE(WriteSequenceState(&env, path, TinyState()).ok());
    EXPECT_TRUE(tmp.List().empty()) << "left behind: " << tmp.List().front();
  }
}

TEST(SequenceState, FailedWriteKeepsTheOldState) {
  test::TempDir tmp;
  const std::string path = tmp.Join("chat.k3ss");
  SequenceState old = TinyState();
  old.tokens = {9};
  ASSERT_TRUE(WriteSequenceState(Env::Default(), path, old).ok());
  test::FaultEnv env;
  env.SetRule(path, test::FaultRule::EnospcAfter(100));
  EXPECT_FALSE(WriteSequenceState(&env, path, TinyState()).ok());
  EXPECT_EQ(test::ReadWholeFile(path), EncodeSequenceState(old));
  EXPECT_FALSE(std::filesystem::exists(TempPathFor(path)));
}

TEST(SequenceState, WriteRefusesAStateItCouldNotLoad) {
  test::TempDir tmp;
  const std::string path = tmp.Join("chat.k3ss");
  SequenceState s = TinyState();
  s.sections[2].layer = 0;
  ExpectRefused(WriteSequenceState(Env::Default(), path, s), Code::kInvalid, {path, "section 2"});
  s = TinyState();
  s.tokens[1] = -3;
  ExpectRefused(WriteSequenceState(Env::Default(), path, s), Code::kInvalid, {path, "tokens[1]"});
  s = TinyState();
  s.layers = 0;
  ExpectRefused(WriteSequenceState(Env::Default(), path, s), Code::kInvalid, {path, "layers is 0"});
  EXPECT_TRUE(tmp.List().empty());
}

TEST(SequenceState, ReadMissingFileNamesTheFlag) {
  test::TempDir tmp;
  const std::string path = tmp.Join("none.k3ss");
  Result<SequenceState> r = ReadSequenceState(Env::Default(), path, kModel);
  ASSERT_FALSE(r.ok());
  ExpectRefused(r.status(), Code::kInvalid, {path, "no such file", "--load-state"});
}

TEST(SequenceState, ReadTruncatedFileIsIntegrity) {
  test::TempDir tmp;
  const std::string path = tmp.WriteFile("chat.k3ss", EncodeSequenceState(TinyState()));
  test::FaultEnv env;
  env.SetRule(path, test::FaultRule::Truncated(kTinySize - 4));
  Result<SequenceState> r = ReadSequenceState(&env, path, kModel);
  ASSERT_FALSE(r.ok());
  ExpectRefused(r.status(), Code::kIntegrity, {path, "truncated"});
}

TEST(SequenceState, ReadChecksTheHeaderBeforeReadingTheBody) {
  test::TempDir tmp;
  const std::string path = tmp.WriteFile("chat.k3ss", EncodeSequenceState(TinyState()));
  test::FaultEnv env;
  env.SetRule(path, test::FaultRule::EioAt(100));  // a body byte: never read for a foreign model
  Result<SequenceState> r = ReadSequenceState(&env, path, kOtherModel);
  ASSERT_FALSE(r.ok());
  ExpectRefused(r.status(), Code::kInvalid, {path, "another prepared directory"});
  r = ReadSequenceState(&env, path, kModel);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kIo);
}

// --- The fuzz seed corpus (tests/fuzz/corpus/sequence_state_fuzz/) ---

// The committed seeds are exactly these; K3_UPDATE_FUZZ_SEEDS=1 rewrites them.
TEST(SequenceState, FuzzSeedCorpus) {
  const std::string dir = std::string(K3_SOURCE_DIR) + "/tests/fuzz/corpus/sequence_state_fuzz/";
  const std::string valid = EncodeSequenceState(TinyState());
  std::string duplicate = valid;
  SetU32(duplicate, kSection2, 0);
  duplicate = Rehash(duplicate);
  const std::string truncated = valid.substr(0, kSection1 + 20);
  const struct {
    const char* name;
    const std::string& bytes;
    Code code;
  } seeds[] = {{"valid.k3ss", valid, Code::kOk},
               {"same_layer_twice.k3ss", duplicate, Code::kInvalid},
               {"truncated.k3ss", truncated, Code::kIntegrity}};
  const char* update = std::getenv("K3_UPDATE_FUZZ_SEEDS");
  for (const auto& seed : seeds) {
    if (update != nullptr && std::string(update) == "1") {
      ASSERT_TRUE(test::WriteWholeFile(dir + seed.name, seed.bytes));
    }
    EXPECT_EQ(test::ReadWholeFile(dir + seed.name), seed.bytes)
        << seed.name << " is stale: run this test with K3_UPDATE_FUZZ_SEEDS=1";
    EXPECT_EQ(DecodeError(seed.bytes).code(), seed.code) << seed.name;
  }
}


// --- ReadSequenceStateInto: a state larger than the read buffer, streamed into a sink ---

// Records what a sink is given, and each piece's size.
class RecordingSink : public StateSink {
 public:
  Status Tokens(std::vector<int32_t> tokens) override {
    got.tokens = std::move(tokens);
    ++calls;
    return Status::Ok();
  }
  Status Section(uint32_t layer, uint32_t kind, uint64_t n_floats) override {
    got.sections.push_back({layer, kind, {}});
    ++calls;
    (void)n_floats;
    return refuse_section ? Status::Invalid("refused by the sink") : Status::Ok();
  }
  void Floats(const float* data, size_t n) override {
    largest_piece = std::max(largest_piece, n);
    auto& d = got.sections.back().data;
    d.insert(d.end(), data, data + n);
  }
  SequenceState got;
  int calls = 0;
  size_t largest_piece = 0;
  bool refuse_section = false;
};

// 2 layers with 700,001 and 300,000 floats: 4 MB, four read buffers' worth, sections that
// straddle buffer boundaries.
SequenceState LargeState() {
  SequenceState s;
  s.model = kModel;
  s.layers = 2;
  s.tokens = {5, 6, 7};
  std::vector<float> a(700001), b(300000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = Bits(static_cast<uint32_t>(i * 2654435761u));
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i) * -0.5f;
  s.sections.push_back({1, kMla, std::move(a)});
  s.sections.push_back({0, kKda, std::move(b)});
  return s;
}

TEST(SequenceState, ReadIntoStreamsThroughOneBufferWithTheSameBits) {
  test::TempDir tmp;
  const std::string path = tmp.Join("big.k3ss");
  ASSERT_TRUE(WriteSequenceState(Env::Default(), path, LargeState()).ok());
  for (const std::optional<size_t> short_reads :
       {std::optional<size_t>(), std::optional<size_t>(777)}) {
    test::FaultEnv env;
    size_t largest_read = 0;
    test::FaultRule rule;
    rule.max_read_chunk = short_reads;
    rule.before_read = [&](uint64_t, size_t n) { largest_read = std::max(largest_read, n); };
    env.SetRule(path, rule);
    RecordingSink sink;
    const Status st = ReadSequenceStateInto(&env, path, kModel, &sink);
    ASSERT_TRUE(st.ok()) << st.ToString();
    sink.got.model = kModel;
    sink.got.layers = 2;
    ExpectSameBits(LargeState(), sink.got);
    EXPECT_LE(largest_read, kStateReadChunk);  // never the whole 4 MB file at once
    EXPECT_LE(sink.largest_piece * 4, kStateReadChunk);
  }
}

TEST(SequenceState, ReadIntoGivesTheSinkNothingWhenTheHashFails) {
  test::TempDir tmp;
  const std::string path = tmp.Join("big.k3ss");
  std::string b = EncodeSequenceState(LargeState());
  b[b.size() - 3] ^= 0x10;  // the last section's last float, past the first read buffers
  std::ofstream(path, std::ios::binary) << b;
  RecordingSink sink;
  ExpectRefused(ReadSequenceStateInto(Env::Default(), path, kModel, &sink), Code::kIntegrity,
                {path, "byte offset 48", "body_xxh3_64"});
  EXPECT_EQ(sink.calls, 0);
}

TEST(SequenceState, ReadIntoStopsAtARefusingSinkAndAtAReadError) {
  test::TempDir tmp;
  const std::string path = tmp.Join("big.k3ss");
  ASSERT_TRUE(WriteSequenceState(Env::Default(), path, LargeState()).ok());
  RecordingSink refusing;
  refusing.refuse_section = true;
  ExpectRefused(ReadSequenceStateInto(Env::Default(), path, kModel, &refusing), Code::kInvalid,
                {"refused by the sink"});
  EXPECT_EQ(refusing.got.sections.size(), 1u);  // stopped at the first section
  test::FaultEnv env;
  env.SetRule(path, test::FaultRule::EioAt(3u << 20));
  RecordingSink sink;
  const Status st = ReadSequenceStateInto(&env, path, kModel, &sink);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Code::kIo) << st.ToString();
}

}  // namespace
}  // namespace k3::seqstate
