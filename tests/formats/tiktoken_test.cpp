// Tests for formats/tiktoken: one test per validation rule, each with a malformed input and a
// check that the message names the source, the line (or JSON path) and the rule.
#include "formats/tiktoken.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "common/env.h"

namespace k3::tiktoken {
namespace {

using ::testing::HasSubstr;

// Parses `text` expecting failure; returns the message.
std::string ModelError(const std::string& text) {
  Result<Vocab> r = ParseTiktokenModel(text, "t.model");
  EXPECT_FALSE(r.ok()) << "accepted:\n" << text;
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), Code::kInvalid);
  return r.status().message();
}

// "YQ==" a, "Yg==" b, "Yw==" c, "YWI=" ab.
TEST(TiktokenModel, ParsesRanksInOrder) {
  Result<Vocab> r = ParseTiktokenModel("YQ== 0\nYg== 1\nYWI= 2\n", "t.model");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tokens, (std::vector<std::string>{"a", "b", "ab"}));
}

TEST(TiktokenModel, AcceptsMissingFinalNewline) {
  Result<Vocab> r = ParseTiktokenModel("YQ== 0\nYg== 1", "t.model");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tokens.size(), 2u);
}

// RFC 4648 §10 test vectors, in both directions.
TEST(TiktokenModel, Base64MatchesRfc4648Vectors) {
  const std::pair<std::string, std::string> kVectors[] = {
      {"f", "Zg=="}, {"fo", "Zm8="}, {"foo", "Zm9v"}, {"foob", "Zm9vYg=="},
      {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"}};
  std::string text;
  int rank = 0;
  for (const auto& [plain, b64] : kVectors) {
    EXPECT_EQ(Base64Encode(plain), b64);
    text += b64 + " " + std::to_string(rank++) + "\n";
  }
  Result<Vocab> r = ParseTiktokenModel(text, "t.model");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (size_t i = 0; i < std::size(kVectors); ++i) EXPECT_EQ(r->tokens[i], kVectors[i].first);
}

TEST(TiktokenModel, RoundTripAllByteValues) {
  Vocab v;
  for (int i = 0; i < 256; ++i) v.tokens.emplace_back(1, static_cast<char>(i));
  v.tokens.push_back(std::string("\xFF\x00\x01", 3));
  v.tokens.push_back("hello world");
  const std::string text = SerializeTiktokenModel(v);
  Result<Vocab> r = ParseTiktokenModel(text, "t.model");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tokens, v.tokens);
  EXPECT_EQ(SerializeTiktokenModel(*r), text);
}

TEST(TiktokenModel, BadBase64Character) {
  const std::string m = ModelError("YQ== 0\nY!== 1\n");
  EXPECT_THAT(m, HasSubstr("t.model line 2"));
  EXPECT_THAT(m, HasSubstr("bad base64"));
  EXPECT_THAT(m, HasSubstr("not in the base64 alphabet"));
}

TEST(TiktokenModel, BadBase64MissingPadding) {
  const std::string m = ModelError("YQ== 0\nYg 1\n");
  EXPECT_THAT(m, HasSubstr("t.model line 2 (byte 7)"));
  EXPECT_THAT(m, HasSubstr("not a multiple of 4"));
}

TEST(TiktokenModel, BadBase64PaddingInMiddle) {
  const std::string m = ModelError("YQ==Yg== 0\n");
  EXPECT_THAT(m, HasSubstr("t.model line 1"));
  EXPECT_THAT(m, HasSubstr("'=' before the end"));
}

// "YR==" decodes to "a" as well but with nonzero unused bits: two spellings of one token.
TEST(TiktokenModel, BadBase64NonCanonical) {
  const std::string m = ModelError("Yg== 0\nYR== 1\n");
  EXPECT_THAT(m, HasSubstr("t.model line 2"));
  EXPECT_THAT(m, HasSubstr("non-canonical"));
}

TEST(TiktokenModel, MissingRank) {
  EXPECT_THAT(ModelError("YQ== 0\nYg==\n"), HasSubstr("t.model line 2 (byte 7): missing rank"));
  EXPECT_THAT(ModelError("YQ== 0\nYg== \n"), HasSubstr("t.model line 2 (byte 7): missing rank"));
}

TEST(TiktokenModel, RankGap) {
  const std::string m = ModelError("YQ== 0\nYg== 2\nYw== 3\n");
  EXPECT_THAT(m, HasSubstr("t.model line 2"));
  EXPECT_THAT(m, HasSubstr("rank gap: rank 1 is missing"));
}

TEST(TiktokenModel, DuplicateRank) {
  const std::string m = ModelError("YQ== 0\nYg== 1\nYw== 1\n");
  EXPECT_THAT(m, HasSubstr("t.model line 3"));
  EXPECT_THAT(m, HasSubstr("duplicate rank 1 (first on line 2)"));
}

TEST(TiktokenModel, RankOutOfOrder) {
  const std::string m = ModelError("YQ== 0\nYw== 2\nYg== 1\n");
  EXPECT_THAT(m, HasSubstr("t.model line 2"));
  EXPECT_THAT(m, HasSubstr("rank out of order"));
  EXPECT_THAT(m, HasSubstr("rank 1 is on line 3"));
}

TEST(TiktokenModel, RankMustStartAtZero) {
  EXPECT_THAT(ModelError("YQ== 1\n"), HasSubstr("t.model line 1 (byte 0): rank gap: rank 0"));
}

TEST(TiktokenModel, RankLeadingZero) {
  EXPECT_THAT(ModelError("YQ== 0\nYg== 01\n"), HasSubstr("t.model line 2 (byte 7): rank has a "
                                                         "leading zero"));
}

TEST(TiktokenModel, DuplicateBytes) {
  const std::string m = ModelError("YQ== 0\nYg== 1\nYQ== 2\n");
  EXPECT_THAT(m, HasSubstr("t.model line 3"));
  EXPECT_THAT(m, HasSubstr("duplicate token bytes (same as rank 0 on line 1)"));
}

TEST(TiktokenModel, EmptyToken) {
  const std::string m = ModelError("YQ== 0\n 1\n");
  EXPECT_THAT(m, HasSubstr("t.model line 2"));
  EXPECT_THAT(m, HasSubstr("empty token"));
}

TEST(TiktokenModel, TrailingJunk) {
  EXPECT_THAT(ModelError("YQ== 0\nYg== 1 x\n"),
              HasSubstr("t.model line 2 (byte 7): trailing junk after the rank at column 7"));
  EXPECT_THAT(ModelError("YQ== 0 \n"), HasSubstr("t.model line 1 (byte 0): trailing junk"));
  EXPECT_THAT(ModelError("YQ==  0\n"), HasSubstr("t.model line 1 (byte 0): missing rank"));
}

TEST(TiktokenModel, CrlfLineEnding) {
  EXPECT_THAT(ModelError("YQ== 0\r\n"), HasSubstr("t.model line 1 (byte 0): carriage return"));
}

TEST(TiktokenModel, EmptyLine) {
  EXPECT_THAT(ModelError("YQ== 0\n\nYg== 1\n"), HasSubstr("t.model line 2 (byte 7): empty line"));
  EXPECT_THAT(ModelError("YQ== 0\n\n"), HasSubstr("t.model line 2 (byte 7): empty line"));
}

TEST(TiktokenModel, EmptyFile) {
  EXPECT_THAT(ModelError(""), HasSubstr("t.model: empty tiktoken.model"));
}

TEST(TiktokenModel, ValidateVocabRules) {
  EXPECT_THAT(ValidateVocab(Vocab{{"a", ""}}, "mem").message(), HasSubstr("mem: rank 1 has empty"));
  EXPECT_THAT(ValidateVocab(Vocab{{"a", "b", "a"}}, "mem").message(),
              HasSubstr("mem: rank 2 duplicates the token bytes of rank 0"));
  EXPECT_FALSE(ValidateVocab(Vocab{}, "mem").ok());
  EXPECT_TRUE(ValidateVocab(Vocab{{"a", "b"}}, "mem").ok());
}

// ---- tokenizer_config.json ------------------------------------------------------------

// Hand-written in the released shape (subset of the 256 added tokens, extra keys kept).
constexpr char kReleasedShape[] = R"({
  "added_tokens_decoder": {
    "163584": {"content": "[BOS]", "lstrip": false, "normalized": false, "rstrip": false,
               "single_word": false, "special": true},
    "163586": {"content": "<|end_of_msg|>", "lstrip": false, "normalized": false,
               "rstrip": false, "single_word": false, "special": true},
    "163585": {"content": "[EOS]", "lstrip": false, "normalized": false, "rstrip": false,
               "single_word": false, "special": true},
    "163587": {"content": "<|open|>", "lstrip": false, "normalized": false, "rstrip": false,
               "single_word": false, "special": false},
    "163838": {"content": "[UNK]", "special": true},
    "163839": {"content": "[PAD]", "special": true}
  },
  "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", null]},
  "bos_token": "[BOS]",
  "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}",
  "clean_up_tokenization_spaces": false,
  "eos_token": "[EOS]",
  "model_max_length": 1000000000000000019884624838656,
  "pad_token": "[PAD]",
  "tokenizer_class": "TikTokenTokenizer",
  "unk_token": {"content": "[UNK]", "special": true}
})";

std::string ConfigError(const std::string& text) {
  Result<TokenizerConfig> r = ParseTokenizerConfig(text, "tc.json");
  EXPECT_FALSE(r.ok()) << "accepted:\n" << text;
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), Code::kInvalid);
  return r.status().message();
}

std::string WithDecoder(const std::string& entries, const std::string& extra = "") {
  return "{\"added_tokens_decoder\": {" + entries + "}" + extra + "}";
}

TEST(TokenizerConfig, ParsesReleasedShape) {
  Result<TokenizerConfig> r = ParseTokenizerConfig(kReleasedShape, "tc.json");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->added_tokens.size(), 6u);
  EXPECT_EQ(r->added_tokens[0].id, 163584);  // sorted by id
  EXPECT_EQ(r->added_tokens[1].id, 163585);
  EXPECT_EQ(r->added_tokens[1].content, "[EOS]");
  EXPECT_EQ(r->added_tokens[3].content, "<|open|>");
  EXPECT_FALSE(r->added_tokens[3].special);
  EXPECT_TRUE(r->added_tokens[2].special);
  EXPECT_EQ(r->bos_token, "[BOS]");
  EXPECT_EQ(r->eos_token, "[EOS]");
  EXPECT_EQ(r->unk_token, "[UNK]");
  EXPECT_EQ(r->pad_token, "[PAD]");
  EXPECT_EQ(r->model_max_length, UINT64_MAX);  // 1e30 saturates
  EXPECT_EQ(FindAddedToken(*r, "<|end_of_msg|>"), 163586);
  EXPECT_EQ(FindAddedToken(*r, "nope"), -1);
}

TEST(TokenizerConfig, RoundTrip) {
  TokenizerConfig c;
  c.added_tokens = {{7, "[A]", true}, {9, "<|x|>", false}, {8, "[B]", true}};
  c.bos_token = "[A]";
  c.pad_token = "[B]";
  c.model_max_length = 4096;
  const std::string text = SerializeTokenizerConfig(c);
  Result<TokenizerConfig> r = ParseTokenizerConfig(text, "tc.json");
  ASSERT_TRUE(r.ok()) << r.status().ToString() << "\n" << text;
  ASSERT_EQ(r->added_tokens.size(), 3u);
  EXPECT_EQ(r->added_tokens[0].content, "[A]");
  EXPECT_EQ(r->added_tokens[1].content, "[B]");
  EXPECT_EQ(r->added_tokens[2].content, "<|x|>");
  EXPECT_FALSE(r->added_tokens[2].special);
  EXPECT_EQ(r->bos_token, "[A]");
  EXPECT_EQ(r->pad_token, "[B]");
  EXPECT_EQ(r->eos_token, "");
  EXPECT_EQ(r->model_max_length, 4096u);
  EXPECT_EQ(SerializeTokenizerConfig(*r), text);
  // Released key order inside an entry.
  EXPECT_THAT(text, HasSubstr("\"7\": {\n      \"content\": \"[A]\",\n      \"lstrip\": false,"));
}

TEST(TokenizerConfig, NotJson) {
  const std::string m = ConfigError("{\"added_tokens_decoder\": {,}}");
  EXPECT_THAT(m, HasSubstr("tc.json: not valid JSON at byte 27"));
}

TEST(TokenizerConfig, TopLevelNotObject) {
  EXPECT_THAT(ConfigError("[1, 2]"), HasSubstr("tc.json: top level must be a JSON object"));
}

TEST(TokenizerConfig, MissingAddedTokensDecoder) {
  EXPECT_THAT(ConfigError("{\"bos_token\": \"[BOS]\"}"),
              HasSubstr("tc.json: missing \"added_tokens_decoder\""));
}

TEST(TokenizerConfig, DecoderNotObject) {
  EXPECT_THAT(ConfigError("{\"added_tokens_decoder\": []}"),
              HasSubstr("added_tokens_decoder must be an object, found array"));
}

TEST(TokenizerConfig, DuplicateId) {
  const std::string m = ConfigError(WithDecoder(
      R"("5": {"content": "[A]", "special": true}, "5": {"content": "[B]", "special": true})"));
  EXPECT_THAT(m, HasSubstr("tc.json: duplicate JSON key \"5\" in object .added_tokens_decoder"));
}

TEST(TokenizerConfig, DuplicateKeyTopLevel) {
  const std::string m = ConfigError(
      WithDecoder(R"("5": {"content": "[A]", "special": true})",
                  R"(, "bos_token": "[A]", "bos_token": "[A]")"));
  EXPECT_THAT(m, HasSubstr("duplicate JSON key \"bos_token\" in object (top level)"));
}

TEST(TokenizerConfig, DuplicateKeyInsideEntry) {
  const std::string m = ConfigError(
      WithDecoder(R"("5": {"content": "[A]", "special": true, "special": false})"));
  EXPECT_THAT(m, HasSubstr("duplicate JSON key \"special\" in object .added_tokens_decoder.5"));
}

TEST(TokenizerConfig, DuplicateContent) {
  const std::string m = ConfigError(WithDecoder(
      R"("5": {"content": "[A]", "special": true}, "6": {"content": "[A]", "special": true})"));
  EXPECT_THAT(m, HasSubstr("tc.json: duplicate added token content \"[A]\" (ids 5 and 6)"));
}

TEST(TokenizerConfig, IdNotCanonical) {
  for (const char* id : {"-1", "01", "x", "", "1.0", "99999999999999999999"}) {
    const std::string m =
        ConfigError(WithDecoder("\"" + std::string(id) + "\": {\"content\": \"[A]\", "
                                "\"special\": true}"));
    EXPECT_THAT(m, HasSubstr("tc.json: added_tokens_decoder[\"" + std::string(id) + "\"]"));
    EXPECT_THAT(m, HasSubstr("non-negative decimal integer"));
  }
}

TEST(TokenizerConfig, EntryNotObject) {
  EXPECT_THAT(ConfigError(WithDecoder(R"("5": "[A]")")),
              HasSubstr("added_tokens_decoder[\"5\"] must be an object, found string"));
}

TEST(TokenizerConfig, ContentNotString) {
  EXPECT_THAT(ConfigError(WithDecoder(R"("5": {"content": 5, "special": true})")),
              HasSubstr("added_tokens_decoder[\"5\"].content must be a string, found number"));
  EXPECT_THAT(ConfigError(WithDecoder(R"("5": {"special": true})")),
              HasSubstr("added_tokens_decoder[\"5\"].content must be a string, found nothing"));
}

TEST(TokenizerConfig, EmptyContent) {
  EXPECT_THAT(ConfigError(WithDecoder(R"("5": {"content": "", "special": true})")),
              HasSubstr("tc.json: added token id 5 has empty content"));
}

TEST(TokenizerConfig, SpecialNotBool) {
  EXPECT_THAT(ConfigError(WithDecoder(R"("5": {"content": "[A]", "special": "yes"})")),
              HasSubstr("added_tokens_decoder[\"5\"].special must be a boolean, found string"));
  EXPECT_THAT(ConfigError(WithDecoder(R"("5": {"content": "[A]"})")),
              HasSubstr("added_tokens_decoder[\"5\"]: missing \"special\""));
}

TEST(TokenizerConfig, FlagNotBool) {
  EXPECT_THAT(
      ConfigError(WithDecoder(R"("5": {"content": "[A]", "special": true, "lstrip": 0})")),
      HasSubstr("added_tokens_decoder[\"5\"].lstrip must be a boolean, found number"));
}

TEST(TokenizerConfig, SpecialNameNotString) {
  EXPECT_THAT(ConfigError(WithDecoder(R"("5": {"content": "[A]", "special": true})",
                                      R"(, "eos_token": 5)")),
              HasSubstr("tc.json: eos_token must be a string"));
}

TEST(TokenizerConfig, SpecialNameNotAddedToken) {
  EXPECT_THAT(ConfigError(WithDecoder(R"("5": {"content": "[A]", "special": true})",
                                      R"(, "pad_token": "[PAD]")")),
              HasSubstr("tc.json: pad_token \"[PAD]\" is not in added_tokens_decoder"));
}

TEST(TokenizerConfig, WrongTokenizerClass) {
  EXPECT_THAT(ConfigError(WithDecoder("", R"(, "tokenizer_class": "GPT2Tokenizer")")),
              HasSubstr("tc.json: tokenizer_class must be \"TikTokenTokenizer\""));
}

TEST(TokenizerConfig, ModelMaxLengthNotNumber) {
  EXPECT_THAT(ConfigError(WithDecoder("", R"(, "model_max_length": -3)")),
              HasSubstr("tc.json: model_max_length must be a non-negative number"));
  EXPECT_THAT(ConfigError(WithDecoder("", R"(, "model_max_length": "big")")),
              HasSubstr("model_max_length must be a non-negative number"));
}

TEST(TokenizerConfig, ValidateRejectsDuplicateIdInMemory) {
  TokenizerConfig c;
  c.added_tokens = {{5, "[A]", true}, {5, "[B]", true}};
  EXPECT_THAT(ValidateTokenizerConfig(c, "mem").message(),
              HasSubstr("mem: duplicate added token id 5"));
  c.added_tokens = {{-2, "[A]", true}};
  EXPECT_THAT(ValidateTokenizerConfig(c, "mem").message(), HasSubstr("negative id -2"));
}

TEST(TokenizerConfig, ValidateRejectsInvalidUtf8Content) {
  TokenizerConfig c;
  c.added_tokens = {{5, "[A\xFF]", true}};
  EXPECT_THAT(ValidateTokenizerConfig(c, "mem").message(),
              HasSubstr("mem: added token id 5 has content that is not valid UTF-8"));
  c.added_tokens = {{5, "\xE4\xB8\xAD\xF0\x9F\x91\x8D", true}};  // 中👍
  EXPECT_TRUE(ValidateTokenizerConfig(c, "mem").ok());
}

TEST(TokenizerConfig, AddedTokensMustBeAboveVocab) {
  Vocab v{{"a", "b", "c"}};
  TokenizerConfig c;
  c.added_tokens = {{2, "[A]", true}};
  EXPECT_THAT(CheckAddedTokensOutsideVocab(v, c, "dir").message(),
              HasSubstr("dir: added token \"[A]\" has id 2, which is a rank of tiktoken.model"));
  c.added_tokens = {{3, "[A]", true}};
  EXPECT_TRUE(CheckAddedTokensOutsideVocab(v, c, "dir").ok());
}

// ---- Env helpers ------------------------------------------------------------------------

class TiktokenFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("k3_tiktoken_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const char* name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

TEST_F(TiktokenFiles, WriteThenLoad) {
  Vocab v{{"a", "bc", std::string("\0\xFF", 2)}};
  ASSERT_TRUE(WriteTiktokenModel(Env::Default(), Path("tiktoken.model"), v).ok());
  Result<Vocab> r = LoadTiktokenModel(Env::Default(), Path("tiktoken.model"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tokens, v.tokens);

  TokenizerConfig c;
  c.added_tokens = {{3, "[BOS]", true}};
  c.bos_token = "[BOS]";
  ASSERT_TRUE(WriteTokenizerConfig(Env::Default(), Path("tokenizer_config.json"), c).ok());
  Result<TokenizerConfig> rc = LoadTokenizerConfig(Env::Default(), Path("tokenizer_config.json"));
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  EXPECT_EQ(rc->bos_token, "[BOS]");
}

TEST_F(TiktokenFiles, WriteRefusesInvalidVocabAndLeavesNoFile) {
  const Status s = WriteTiktokenModel(Env::Default(), Path("tiktoken.model"), Vocab{{"a", "a"}});
  EXPECT_EQ(s.code(), Code::kInvalid);
  EXPECT_THAT(s.message(), HasSubstr("tiktoken.model: rank 1 duplicates"));
  EXPECT_FALSE(std::filesystem::exists(Path("tiktoken.model")));
}

TEST_F(TiktokenFiles, LoadNamesThePathInParseErrors) {
  ASSERT_TRUE(WriteFileAtomic(Env::Default(), Path("tiktoken.model"), "YQ== 0\nYQ== 1\n").ok());
  Result<Vocab> r = LoadTiktokenModel(Env::Default(), Path("tiktoken.model"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr(Path("tiktoken.model") + " line 2"));
}

TEST_F(TiktokenFiles, LoadMissingFileFails) {
  Result<Vocab> r = LoadTiktokenModel(Env::Default(), Path("absent.model"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("absent.model"));
}

}  // namespace
}  // namespace k3::tiktoken
