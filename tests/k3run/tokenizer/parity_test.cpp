// Parity with the real tiktoken core (npm `tiktoken`, WASM build of the Rust implementation):
// the same ids for ≥ 300 cases, with o200k_base's 199,998 ranks + the 256 K3 added tokens, and
// with the synth tokenizer; plus byte-exact round trips. Needs node and
// tests/k3run/tokenizer/parity/node_modules (scripts/setup.sh); SKIPS visibly without them.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/env.h"
#include "k3prep/synth/tokenizer.h"
#include "k3run/text/text_split.h"
#include "k3run/text/tokenizer.h"
#include "tests/support/temp_dir.h"

namespace k3::tok {
namespace {

const std::string kParityDir = std::string(K3_SOURCE_DIR) + "/tests/k3run/tokenizer/parity";
const std::string kPatternFile = std::string(K3_SOURCE_DIR) + "/tests/k3run/tokenizer/data/tokenizer-pattern.txt";

struct Case {
  std::string name;
  std::string bytes;
  bool allow_special = true;
};

std::string ReadOrDie(const std::string& path) {
  Result<std::string> s = ReadFileToString(Env::Default(), path);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? *s : std::string();
}

// Why the test cannot run, or "" when node and the npm package are there.
std::string MissingPrerequisite() {
  if (std::system("command -v node >/dev/null 2>&1") != 0) return "node is not on PATH";
  if (!std::filesystem::exists(kParityDir + "/node_modules/tiktoken/encoders/o200k_base.json")) {
    return "npm package tiktoken is not installed in " + kParityDir +
           "/node_modules (run scripts/setup.sh; it needs the npm registry)";
  }
  return "";
}

// The 256 K3 added tokens (released contents and special flags, from the synth tokenizer,
// which copies them from the release) re-numbered to start at `first_id`.
tiktoken::TokenizerConfig K3Specials(int64_t first_id) {
  Result<synth::SynthTokenizer> s = synth::BuildSynthTokenizer(synth::kMinVocab);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  tiktoken::TokenizerConfig c = s->config;
  for (size_t k = 0; k < c.added_tokens.size(); ++k) c.added_tokens[k].id = first_id + static_cast<int64_t>(k);
  return c;
}

// o200k_base.json "bpe_ranks": "! 0 tok0 tok1 …" (a marker, the first rank, base64 tokens of
// consecutive ranks) → tiktoken.model text, parsed by the strict reader.
tiktoken::Vocab O200kVocab() {
  const nlohmann::json j = nlohmann::json::parse(ReadOrDie(kParityDir + "/node_modules/tiktoken/encoders/o200k_base.json"));
  const std::string ranks = j.at("bpe_ranks").get<std::string>();
  std::vector<std::string_view> fields;
  for (size_t at = 0; at <= ranks.size();) {
    size_t sp = ranks.find(' ', at);
    if (sp == std::string::npos) sp = ranks.size();
    if (sp > at) fields.emplace_back(std::string_view(ranks).substr(at, sp - at));
    at = sp + 1;
  }
  EXPECT_GE(fields.size(), 3u);
  EXPECT_EQ(fields[0], "!");
  EXPECT_EQ(fields[1], "0");
  std::string model;
  for (size_t k = 2; k < fields.size(); ++k) {
    model.append(fields[k]).append(" ").append(std::to_string(k - 2)).append("\n");
  }
  Result<tiktoken::Vocab> v = tiktoken::ParseTiktokenModel(model, "o200k_base.json");
  EXPECT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->tokens.size(), 199998u);
  return v.ok() ? std::move(v).value() : tiktoken::Vocab{};
}

std::vector<Case> BuildCases() {
  std::vector<Case> cases;
  // 1. Hand-written cases, one JSON string per line.
  const std::string jsonl = ReadOrDie(kParityDir + "/cases.jsonl");
  size_t line = 0;
  for (size_t at = 0; at < jsonl.size();) {
    size_t nl = jsonl.find('\n', at);
    if (nl == std::string::npos) nl = jsonl.size();
    ++line;
    const std::string text = nlohmann::json::parse(jsonl.substr(at, nl - at)).get<std::string>();
    cases.push_back({"cases.jsonl:" + std::to_string(line), text, true});
    if (text.find("<|") != std::string::npos || text.find('[') != std::string::npos) {
      cases.push_back({"cases.jsonl:" + std::to_string(line) + " (specials off)", text, false});
    }
    at = nl + 1;
  }
  // 2. Invalid UTF-8: both sides repair first (Python errors="replace" / WHATWG decoding).
  const std::vector<std::string> invalid = {
      "a\xFF" "b", "\x80", "caf\xC3", "\xE4\xB8", "\xE4\xB8" "abc", "\xF0\x9F\x98", "\xF0\x9F\x98!",
      "\xC0\xAF", "\xED\xA0\x80 surrogate", "\xF4\x90\x80\x80 beyond", "\xE0\x80\x80", "x\xFE\xFEy",
      "\xE4\xB8\xAD\xFF\xE6\x96\x87", "Hello \xFFworld\xFF", "\xC3\x28", "\xE2\x82\x41\xE2\x82",
      "\x80\x80\x80\x80 continuation run", "[BOS]\xFF<|end_of_msg|>", "  \xFF  ", "'\xFF's"};
  for (size_t k = 0; k < invalid.size(); ++k) cases.push_back({"invalid-utf8 #" + std::to_string(k), invalid[k], true});
  // 3. Paragraphs of the multilingual corpus (every file, first lines) and whole files.
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(std::string(K3_SOURCE_DIR) + "/tests/data/corpus")) {
    if (e.path().extension() == ".txt") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  std::string all;
  for (const auto& f : files) {
    const std::string text = ReadOrDie(f.string());
    all += text;
    cases.push_back({f.filename().string(), text, true});
    size_t at = 0;
    for (int k = 0; k < 6 && at < text.size(); ++k) {
      size_t nl = text.find('\n', at);
      if (nl == std::string::npos) nl = text.size();
      cases.push_back({f.filename().string() + " line " + std::to_string(k + 1), text.substr(at, nl - at + 1), true});
      at = nl + 1;
    }
  }
  // 4. Long runs around upstream's 25,000-character split, and 100 KB inputs.
  cases.push_back({"30000 spaces", std::string(30000, ' ') + "x", true});
  cases.push_back({"25001 a", std::string(25001, 'a'), true});
  cases.push_back({"50000 newlines", std::string(50000, '\n'), true});
  std::string han;
  for (int k = 0; k < 26000; ++k) han += "\xE4\xB8\xAD";  // 中
  cases.push_back({"26000 Han", han, true});
  std::string tabs_spaces;
  for (int k = 0; k < 20000; ++k) tabs_spaces += k % 7 == 0 ? "\t" : " ";
  cases.push_back({"20000 tabs+spaces then word", tabs_spaces + "word", true});
  std::string digits;
  for (int k = 0; k < 30000; ++k) digits += static_cast<char>('0' + k % 10);
  cases.push_back({"30000 digits", digits, true});
  for (size_t k = 0; k < 3; ++k) {
    const size_t start = (all.size() / 4) * k;
    std::string big = all.substr(start, 100 * 1024);
    big = ReplaceInvalidUtf8(big);  // a cut may split a character at either end
    cases.push_back({"100KB corpus slice #" + std::to_string(k), big, true});
  }
  return cases;
}

// Encodes every case with node; returns one id list per case.
std::vector<std::vector<int32_t>> NodeEncode(const k3::test::TempDir& dir, const std::string& model_text,
                                             const tiktoken::TokenizerConfig& config,
                                             const std::vector<Case>& cases) {
  const std::string model = dir.WriteFile("tiktoken.model", model_text);
  nlohmann::json specials = nlohmann::json::object();
  for (const auto& t : config.added_tokens) specials[t.content] = t.id;
  const std::string specials_path = dir.WriteFile("specials.json", specials.dump());
  nlohmann::json list = nlohmann::json::array();
  for (size_t k = 0; k < cases.size(); ++k) {
    const std::string path = dir.WriteFile("case" + std::to_string(k) + ".bin", cases[k].bytes);
    list.push_back({{"file", path}, {"allow_special", cases[k].allow_special}});
  }
  const std::string cases_path = dir.WriteFile("cases.json", list.dump());
  const std::string out = dir.Join("out.json");
  const std::string cmd = "cd '" + kParityDir + "' && node encode.mjs encode '" + model + "' '" +
                          specials_path + "' '" + kPatternFile + "' '" + cases_path + "' '" + out + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const nlohmann::json res = nlohmann::json::parse(ReadOrDie(out));
  return res.get<std::vector<std::vector<int32_t>>>();
}

void ExpectParity(const tiktoken::Vocab& vocab, const tiktoken::TokenizerConfig& config, const std::string& label) {
  const std::vector<Case> cases = BuildCases();
  ASSERT_GE(cases.size(), 300u);
  k3::test::TempDir dir;
  const std::vector<std::vector<int32_t>> want =
      NodeEncode(dir, tiktoken::SerializeTiktokenModel(vocab), config, cases);
  ASSERT_EQ(want.size(), cases.size());
  const int64_t v = static_cast<int64_t>(vocab.tokens.size() + config.added_tokens.size());
  Result<Tokenizer> tok = Tokenizer::FromParts(vocab, config, v, label);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  size_t mismatches = 0, round_trips = 0;
  for (size_t k = 0; k < cases.size(); ++k) {
    const std::vector<int32_t> got = tok->Encode(cases[k].bytes, cases[k].allow_special);
    if (got != want[k]) {
      size_t i = 0;
      while (i < got.size() && i < want[k].size() && got[i] == want[k][i]) ++i;
      auto show = [&](const std::vector<int32_t>& ids) {
        std::string s;
        for (size_t j = i; j < ids.size() && j < i + 4; ++j) s += std::to_string(ids[j]) + "='" + std::string(tok->TokenBytes(ids[j])) + "' ";
        return s;
      };
      ADD_FAILURE() << label << ": case " << cases[k].name << " differs at id #" << i << "\n  ours:     " << show(got)
                    << "\n  tiktoken: " << show(want[k]);
      if (++mismatches > 20) break;
    }
    if (IsValidUtf8(cases[k].bytes)) {
      EXPECT_EQ(tok->Decode(got), cases[k].bytes) << label << ": round trip of " << cases[k].name;
      ++round_trips;
    }
  }
  std::printf("[ PARITY ] %s: %zu cases compared with npm tiktoken, %zu mismatches, %zu round trips\n",
              label.c_str(), cases.size(), mismatches, round_trips);
}

TEST(TokenizerParity, O200kRanksWithK3SpecialsMatchTiktoken) {
  const std::string missing = MissingPrerequisite();
  if (!missing.empty()) GTEST_SKIP() << "SKIPPED: tokenizer parity not checked: " << missing;
  const tiktoken::Vocab vocab = O200kVocab();
  ASSERT_FALSE(vocab.tokens.empty());
  ExpectParity(vocab, K3Specials(static_cast<int64_t>(vocab.tokens.size())), "o200k+K3");
}

TEST(TokenizerParity, SynthTokenizerMatchesTiktoken) {
  const std::string missing = MissingPrerequisite();
  if (!missing.empty()) GTEST_SKIP() << "SKIPPED: tokenizer parity not checked: " << missing;
  Result<synth::SynthTokenizer> s = synth::BuildSynthTokenizer(4352);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ExpectParity(s->vocab, s->config, "synth-4352");
}

}  // namespace
}  // namespace k3::tok
