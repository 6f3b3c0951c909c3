#include "grammar_walk.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <random>

#include "k3run/grammar/utf8_ranges.h"

namespace k3::run::grammar::test {
namespace {

std::string RandomPiece(std::mt19937_64& rng) {
  static const char* kWords[] = {"the",  "name",     "value",  "id",     "user",  "data",
                                 "type", "list",     "true",   "false",  "null",  "key",
                                 "item", "argument", "open",   "a",      "ab",    "x",
                                 "tree", "node",     "string", "number", "object"};
  static const std::string kPunct = "\"{}[],:.-+eE \\/!?#&<>|=_'()*;@$%^~`\n\t";
  std::string s;
  switch (rng() % 10) {
    case 0:
    case 1:
    case 2: {
      s = kWords[rng() % (sizeof(kWords) / sizeof(kWords[0]))];
      if (rng() % 4 == 0) s[0] = static_cast<char>(s[0] - 'a' + 'A');
      break;
    }
    case 3:
    case 4: {
      const int n = 1 + static_cast<int>(rng() % 4);
      for (int i = 0; i < n; ++i) s.push_back(static_cast<char>('0' + rng() % 10));
      break;
    }
    case 5:
    case 6:
      s.push_back(kPunct[rng() % kPunct.size()]);
      break;
    case 7: {
      static const uint32_t kBlocks[][2] = {
          {0xA0, 0xFF},     {0x370, 0x3FF},     {0x4E00, 0x4FFF},    {0xD7F0, 0xD7FF},
          {0xE000, 0xE0FF}, {0x1F600, 0x1F64F}, {0x10FF00, 0x10FFFF}};
      const auto& b = kBlocks[rng() % 7];
      s = Utf8Of(b[0] + static_cast<uint32_t>(rng() % (b[1] - b[0] + 1)));
      break;
    }
    case 8: {  // a truncated character: its first 1..n-1 bytes
      uint32_t cp = 0x800 + static_cast<uint32_t>(rng() % 0x10000);
      if (cp >= kSurrogateLo && cp <= kSurrogateHi) cp += 0x800;
      std::string c = Utf8Of(cp);
      if (c.size() > 1) c.resize(1 + rng() % (c.size() - 1));
      s = c;
      break;
    }
    default: {  // bytes that never start a valid sequence, or a lone continuation
      static const unsigned char kBad[] = {0xFF, 0xFE, 0xC0, 0xC1, 0xF5, 0x80, 0xBF};
      s.push_back(static_cast<char>(kBad[rng() % sizeof(kBad)]));
      break;
    }
  }
  return s;
}

const std::vector<std::string>& StructuralTokens() {
  static const std::vector<std::string> k = {"{\"",
                                             "\":",
                                             "\": ",
                                             "\",",
                                             "\", \"",
                                             "\"}",
                                             "\"]",
                                             "},",
                                             "}]",
                                             "]}",
                                             "[{",
                                             "[\"",
                                             "],",
                                             ", ",
                                             ",\"",
                                             "\":\"",
                                             "\": \"",
                                             "\":{",
                                             "\":[",
                                             "true",
                                             "false",
                                             "null",
                                             "0",
                                             "1",
                                             "-1",
                                             "12",
                                             "3.5",
                                             "e+",
                                             "1e",
                                             "\\\"",
                                             "\\n",
                                             "\\u00e9",
                                             "\\ud83d\\ude00",
                                             "argument",
                                             "argument key=\"",
                                             "\" type=\"",
                                             "string\"",
                                             "number\"",
                                             "object\"",
                                             "array\"",
                                             "boolean\"",
                                             "null\"",
                                             " key",
                                             "=\""};
  return k;
}

}  // namespace

std::shared_ptr<Vocabulary> SyntheticVocabulary(const SyntheticVocabularyOptions& o) {
  auto v = std::make_shared<Vocabulary>();
  std::mt19937_64 rng(o.seed);
  for (int b = 0; b < 256; ++b) v->bytes.emplace_back(1, static_cast<char>(b));
  if (o.structural_tokens) {
    for (const std::string& s : StructuralTokens()) v->bytes.push_back(s);
  }
  for (int64_t i = 0; i < o.random_tokens; ++i) {
    const int want =
        o.min_length +
        static_cast<int>(rng() % static_cast<uint64_t>(o.max_length - o.min_length + 1));
    std::string s;
    while (static_cast<int>(s.size()) < want) s += RandomPiece(rng);
    s.resize(static_cast<size_t>(want));  // may cut a character: partial UTF-8 on purpose
    v->bytes.push_back(std::move(s));
  }
  v->special_symbol.assign(v->bytes.size(), kOrdinaryToken);
  for (int i = 0; i < o.grammar_specials; ++i) {
    v->bytes.emplace_back();
    v->special_symbol.push_back(i);
  }
  for (int i = 0; i < o.unnamed_specials; ++i) {
    v->bytes.emplace_back();
    v->special_symbol.push_back(kNeverToken);
  }
  v->bytes.emplace_back();
  v->special_symbol.push_back(kEndToken);
  return v;
}

WalkResult RandomWalk(const TokenMasker& masker, const Vocabulary& vocab,
                      std::shared_ptr<const Grammar> grammar, const WalkOptions& o,
                      bool keep_states) {
  WalkResult r;
  std::mt19937_64 rng(o.seed);
  Matcher m(std::move(grammar));
  std::vector<uint64_t> mask;
  std::vector<int32_t> allowed;
  auto is_single = [&](int32_t id, auto pred) {
    const std::string& b = vocab.bytes[static_cast<size_t>(id)];
    return vocab.special_symbol[static_cast<size_t>(id)] == kOrdinaryToken && b.size() == 1 &&
           pred(static_cast<unsigned char>(b[0]));
  };
  for (int step = 0; step < o.max_tokens; ++step) {
    if (keep_states) r.states.push_back(m);
    masker.Allowed(m, &mask);
    allowed.clear();
    for (size_t w = 0; w < mask.size(); ++w) {
      for (uint64_t bits = mask[w]; bits != 0; bits &= bits - 1) {
        allowed.push_back(
            static_cast<int32_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(bits))));
      }
    }
    if (allowed.empty()) {
      r.failure = "dead end after " + std::to_string(r.bytes.size()) + " bytes";
      return r;
    }
    auto symbol = [&](int32_t id) { return vocab.special_symbol[static_cast<size_t>(id)]; };
    std::vector<int32_t> ends, others;
    for (const int32_t id : allowed) (symbol(id) == kEndToken ? ends : others).push_back(id);
    std::vector<int32_t> pool;
    if (static_cast<int>(r.bytes.size()) >= o.soft_length) {
      const std::vector<std::function<bool(int32_t)>> tiers = {
          [&](int32_t id) { return symbol(id) == kEndToken; },
          [&](int32_t id) {
            return std::find(o.closing_symbols.begin(), o.closing_symbols.end(), symbol(id)) !=
                   o.closing_symbols.end();
          },
          [&](int32_t id) {
            return is_single(id, [](unsigned char c) { return c == '"' || c == ']' || c == '}'; });
          },
          [&](int32_t id) {
            return is_single(id, [](unsigned char c) {
              return c < 0x80 && std::ispunct(c) && c != '[' && c != '{';
            });
          },
          [&](int32_t id) { return is_single(id, [](unsigned char) { return true; }); },
      };
      for (const auto& tier : tiers) {
        for (const int32_t id : allowed) {
          if (tier(id)) pool.push_back(id);
        }
        if (!pool.empty()) break;
      }
      if (pool.empty()) pool = allowed;
    } else if (!ends.empty() && (others.empty() || rng() % 8 == 0)) {
      pool = ends;
    } else {
      pool = others;
    }
    const int32_t id = pool[rng() % pool.size()];
    r.ids.push_back(id);
    if (!m.AcceptToken(vocab, id)) {
      r.failure = "the mask allowed id " + std::to_string(id) + " but the matcher refused it";
      return r;
    }
    const int32_t s = symbol(id);
    if (s == kEndToken) {
      r.finished = true;
      return r;
    }
    if (s >= 0) {
      r.pieces.push_back({s, ""});
    } else {
      const std::string& b = vocab.bytes[static_cast<size_t>(id)];
      if (r.pieces.empty() || r.pieces.back().symbol >= 0) r.pieces.push_back({-1, ""});
      r.pieces.back().bytes += b;
      r.bytes += b;
    }
  }
  r.failure = "no end after " + std::to_string(o.max_tokens) + " tokens";
  return r;
}

}  // namespace k3::run::grammar::test
