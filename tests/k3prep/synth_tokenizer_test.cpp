// Tests for k3prep/synth_tokenizer: the files `k3prep synth` writes parse with the strict
// readers and carry the layout and added-token ids DESIGN.md §8 fixes. Expected ids below are
// written out from DESIGN.md §8 (vocab − 256 + (released − 163584)), not computed by the code.
#include "k3prep/synth/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "formats/tiktoken.h"
#include "tests/support/fault_env.h"
#include "tests/support/temp_dir.h"

namespace k3::synth {
namespace {

using ::testing::HasSubstr;

struct Written {
  tiktoken::Vocab vocab;
  tiktoken::TokenizerConfig config;
  int64_t merges = 0;
};

Written WriteAndLoad(int64_t vocab_size, const test::TempDir& dir) {
  Written w;
  const Status s = WriteSynthTokenizer(Env::Default(), dir.path(), vocab_size, &w.merges);
  EXPECT_TRUE(s.ok()) << s.ToString();
  Result<tiktoken::Vocab> v = tiktoken::LoadTiktokenModel(Env::Default(), dir.Join("tiktoken.model"));
  EXPECT_TRUE(v.ok()) << v.status().ToString();
  Result<tiktoken::TokenizerConfig> c =
      tiktoken::LoadTokenizerConfig(Env::Default(), dir.Join("tokenizer_config.json"));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (v.ok()) w.vocab = *v;
  if (c.ok()) w.config = *c;
  return w;
}

const tiktoken::AddedToken* ById(const tiktoken::TokenizerConfig& c, int64_t id) {
  for (const auto& t : c.added_tokens) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

// The checks shared by every vocab size. `ids` are the expected ids of [BOS], <|end_of_msg|>,
// <|open|>, <|close|>, <|sep|>, <|media_pad|>, [PAD] and one reserved id with its name.
struct Expected {
  int64_t vocab, bos, end_of_msg, open, close, sep, media_pad, pad, reserved;
  const char* reserved_name;
};

void CheckLayout(const Written& w, const Expected& e) {
  const auto& tokens = w.vocab.tokens;
  ASSERT_EQ(static_cast<int64_t>(tokens.size()), e.vocab - 256);
  std::set<std::string> unique(tokens.begin(), tokens.end());
  EXPECT_EQ(unique.size(), tokens.size()) << "ranks' bytes are not unique";
  for (int i = 0; i < 256; ++i) {
    ASSERT_EQ(tokens[static_cast<size_t>(i)], std::string(1, static_cast<char>(i))) << i;
  }
  EXPECT_GT(w.merges, 0);
  EXPECT_LE(w.merges, e.vocab - 512);
  for (int64_t r = 256; r < 256 + w.merges; ++r) {
    const std::string& t = tokens[static_cast<size_t>(r)];
    EXPECT_GE(t.size(), 2u) << "merge rank " << r;
    EXPECT_EQ(t.find('\xFF'), std::string::npos) << "merge rank " << r;
  }
  for (size_t r = static_cast<size_t>(256 + w.merges); r < tokens.size(); ++r) {
    EXPECT_NE(tokens[r].find('\xFF'), std::string::npos) << "filler rank " << r;
  }

  const auto& added = w.config.added_tokens;
  ASSERT_EQ(added.size(), 256u);
  for (size_t i = 0; i < added.size(); ++i) {
    EXPECT_EQ(added[i].id, e.vocab - 256 + static_cast<int64_t>(i));
  }
  const std::pair<int64_t, const char*> named[] = {
      {e.bos, "[BOS]"},         {e.bos + 1, "[EOS]"},       {e.end_of_msg, "<|end_of_msg|>"},
      {e.open, "<|open|>"},     {e.close, "<|close|>"},     {e.sep, "<|sep|>"},
      {e.media_pad, "<|media_pad|>"}, {e.pad, "[PAD]"},     {e.pad - 1, "[UNK]"},
      {e.reserved, e.reserved_name}};
  for (const auto& [id, content] : named) {
    const tiktoken::AddedToken* t = ById(w.config, id);
    ASSERT_NE(t, nullptr) << id;
    EXPECT_EQ(t->content, content) << id;
  }
  for (const auto& t : added) {
    const bool plain = t.id == e.open || t.id == e.close || t.id == e.sep;
    EXPECT_EQ(t.special, !plain) << t.content;
  }
  EXPECT_EQ(w.config.bos_token, "[BOS]");
  EXPECT_EQ(w.config.eos_token, "[EOS]");
  EXPECT_EQ(w.config.pad_token, "[PAD]");
  EXPECT_EQ(w.config.unk_token, "[UNK]");
}

// tiny preset: 1280 = 1024 ranks + 256 added tokens.
TEST(SynthTokenizer, Vocab1280) {
  test::TempDir dir;
  const Written w = WriteAndLoad(1280, dir);
  CheckLayout(w, {1280, 1024, 1026, 1027, 1028, 1029, 1045, 1279, 1032,
                  "<|reserved_token_1032|>"});
  // The corpus supports far more than 1280 − 512 merges: all of them are learned.
  EXPECT_EQ(w.merges, 768);
}

// small preset.
TEST(SynthTokenizer, Vocab4352) {
  test::TempDir dir;
  const Written w = WriteAndLoad(4352, dir);
  CheckLayout(w, {4352, 4096, 4098, 4099, 4100, 4101, 4117, 4351, 4104,
                  "<|reserved_token_4104|>"});
  EXPECT_EQ(w.merges, 3840);
}

// bench preset: the released vocab size, so the added ids are the released ones.
TEST(SynthTokenizer, Vocab163840) {
  test::TempDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  const Written w = WriteAndLoad(163840, dir);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "vocab 163840: " << w.merges << " learned merges, "
            << (163840 - 512 - w.merges) << " filler tokens, " << s << " s\n";
  ::testing::Test::RecordProperty("learned_merges", static_cast<int>(w.merges));
  CheckLayout(w, {163840, 163584, 163586, 163587, 163588, 163589, 163605, 163839, 163592,
                  "<|reserved_token_163592|>"});
  EXPECT_GT(w.merges, 5000);
  EXPECT_LT(w.merges, 163840 - 512) << "the corpus cannot support this many merges";
  const tiktoken::AddedToken* osagent = ById(w.config, 163649);
  ASSERT_NE(osagent, nullptr);
  EXPECT_EQ(osagent->content, "<osagent_mode>");
}

TEST(SynthTokenizer, ConfigJsonIds) {
  const SpecialIds ids = SynthSpecialIds(1280);
  EXPECT_EQ(ids.bos, 1024);
  EXPECT_EQ(ids.eos, 1026);
  EXPECT_EQ(ids.pad, 1279);
  EXPECT_EQ(ids.media_placeholder, 1045);
  const SpecialIds rel = SynthSpecialIds(163840);
  EXPECT_EQ(rel.bos, 163584);
  EXPECT_EQ(rel.eos, 163586);
  EXPECT_EQ(rel.pad, 163839);
  EXPECT_EQ(rel.media_placeholder, 163605);
}

TEST(SynthTokenizer, SmallestVocabHasNoRoomForMerges) {
  Result<SynthTokenizer> t = BuildSynthTokenizer(512);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->learned_merges, 0);
  EXPECT_EQ(t->vocab.tokens.size(), 256u);
}

TEST(SynthTokenizer, VocabBelow512IsRefused) {
  test::TempDir dir;
  const Status s = WriteSynthTokenizer(Env::Default(), dir.path(), 511);
  EXPECT_EQ(s.code(), Code::kInvalid);
  EXPECT_THAT(s.message(), HasSubstr("--set vocab_size=511"));
  EXPECT_THAT(s.message(), HasSubstr("512"));
  EXPECT_TRUE(dir.List().empty());
}

TEST(SynthTokenizer, Deterministic) {
  Result<SynthTokenizer> a = BuildSynthTokenizer(2000);
  Result<SynthTokenizer> b = BuildSynthTokenizer(2000);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->vocab.tokens, b->vocab.tokens);
  // A larger vocab extends the merge list of a smaller one.
  Result<SynthTokenizer> c = BuildSynthTokenizer(3000);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(std::equal(a->vocab.tokens.begin(), a->vocab.tokens.begin() + 256 + 1488,
                         c->vocab.tokens.begin()));
}

// A crash before the rename leaves no file under a final name.
TEST(SynthTokenizer, FailedRenameLeavesNoFinalFile) {
  test::TempDir dir;
  test::FaultEnv env;
  env.SetRule(dir.Join("tokenizer_config.json"), test::FaultRule::RenameFails());
  const Status s = WriteSynthTokenizer(&env, dir.path(), 1280);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.ToString(), HasSubstr("tokenizer_config.json"));
  for (const std::string& name : dir.List()) {
    EXPECT_NE(name, "tokenizer_config.json");
    EXPECT_EQ(name.find(".k3tmp"), std::string::npos) << name;
  }
}

// The generated byte arrays are exactly the corpus files (names in order, bytes equal).
TEST(SynthTokenizer, EmbeddedCorpusMatchesSourceFiles) {
  std::vector<std::filesystem::path> files;
  for (const auto& e :
       std::filesystem::directory_iterator(std::string(K3_SOURCE_DIR) + "/tests/data/corpus")) {
    if (e.path().extension() == ".txt") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  const auto docs = EmbeddedCorpus();
  ASSERT_EQ(docs.size(), files.size());
  size_t total = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    EXPECT_EQ(docs[i].name, files[i].filename().string());
    std::ifstream in(files[i], std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    EXPECT_EQ(docs[i].text, text) << files[i];
    total += text.size();
  }
  EXPECT_GT(total, 250u * 1000);
}

}  // namespace
}  // namespace k3::synth
