#include "k3prep/synth/bpe_trainer.h"

#include <algorithm>
#include <cassert>
#include <queue>
#include <unordered_map>
#include <utility>

namespace k3::bpe {
namespace {

// ---- pre-split --------------------------------------------------------------------------

// Character classes. Scripts get distinct values from kScript upwards.
enum : int {
  kSpace = 0,
  kDigit,
  kPunct,
  kEmoji,
  kContinue,  // joins whatever run is open (combining marks, ZWJ, variation selectors)
  kScript = 16,
};

struct Range {
  char32_t lo, hi;
  int cls;
};

// Exceptions inside script blocks: punctuation and digits. Checked before kScripts.
constexpr Range kSpecial[] = {
    {0x00D7, 0x00D7, kPunct}, {0x00F7, 0x00F7, kPunct}, {0x037E, 0x037E, kPunct},
    {0x0387, 0x0387, kPunct}, {0x055A, 0x055F, kPunct}, {0x0589, 0x058A, kPunct},
    {0x05BE, 0x05BE, kPunct}, {0x05C0, 0x05C0, kPunct}, {0x05C3, 0x05C3, kPunct},
    {0x05C6, 0x05C6, kPunct}, {0x05F3, 0x05F4, kPunct}, {0x060C, 0x060C, kPunct},
    {0x061B, 0x061B, kPunct}, {0x061F, 0x061F, kPunct}, {0x0660, 0x0669, kDigit},
    {0x066A, 0x066D, kPunct}, {0x06D4, 0x06D4, kPunct}, {0x06F0, 0x06F9, kDigit},
    {0x0964, 0x0965, kPunct}, {0x0966, 0x096F, kDigit}, {0x09E6, 0x09EF, kDigit},
    {0x0BE6, 0x0BEF, kDigit}, {0x0E4F, 0x0E4F, kPunct}, {0x0E50, 0x0E59, kDigit},
    {0x0E5A, 0x0E5B, kPunct}, {0x10FB, 0x10FB, kPunct}, {0x1360, 0x1368, kPunct},
    {0x1369, 0x137C, kDigit}, {0x3005, 0x3005, kScript + 40}, {0x3007, 0x3007, kScript + 40},
    {0xFF10, 0xFF19, kDigit},
};

// Script blocks. Each Indic block (0900..0DFF, 128 code points each) is its own script; see
// Classify. kScript + 40 is Han (shared with 々 and 〇 above).
constexpr Range kScripts[] = {
    {0x0041, 0x005A, kScript + 1},  {0x0061, 0x007A, kScript + 1},
    {0x00AA, 0x00AA, kScript + 1},  {0x00B5, 0x00B5, kScript + 1},
    {0x00BA, 0x00BA, kScript + 1},  {0x00C0, 0x02AF, kScript + 1},  // Latin-1 letters … IPA
    {0x02B0, 0x02FF, kContinue},    {0x0300, 0x036F, kContinue},    // modifiers, combining
    {0x0370, 0x03FF, kScript + 2},  {0x1F00, 0x1FFF, kScript + 2},  // Greek
    {0x0400, 0x052F, kScript + 3},  {0x1C80, 0x1C8F, kScript + 3},  // Cyrillic
    {0x2DE0, 0x2DFF, kScript + 3},  {0xA640, 0xA69F, kScript + 3},
    {0x0530, 0x058F, kScript + 4},                                  // Armenian
    {0x0590, 0x05FF, kScript + 5},                                  // Hebrew
    {0x0600, 0x06FF, kScript + 6},  {0x0750, 0x077F, kScript + 6},  // Arabic
    {0x08A0, 0x08FF, kScript + 6},  {0xFB50, 0xFDFF, kScript + 6},
    {0xFE70, 0xFEFF, kScript + 6},
    {0x0E00, 0x0E7F, kScript + 20}, {0x0E80, 0x0EFF, kScript + 21},  // Thai, Lao
    {0x0F00, 0x0FFF, kScript + 22}, {0x1000, 0x109F, kScript + 23},  // Tibetan, Myanmar
    {0x10A0, 0x10FF, kScript + 24}, {0x1C90, 0x1CBF, kScript + 24},  // Georgian
    {0x2D00, 0x2D2F, kScript + 24},
    {0x1100, 0x11FF, kScript + 25}, {0x3130, 0x318F, kScript + 25},  // Hangul
    {0xA960, 0xA97F, kScript + 25}, {0xAC00, 0xD7FF, kScript + 25},
    {0x1200, 0x139F, kScript + 26}, {0x2D80, 0x2DDF, kScript + 26},  // Ethiopic
    {0x1780, 0x17FF, kScript + 27},                                  // Khmer
    {0x1E00, 0x1EFF, kScript + 1},                                   // Latin Extended Additional
    {0x200C, 0x200D, kContinue},    {0x20D0, 0x20FF, kContinue},     // ZWNJ/ZWJ, keycap etc.
    {0x2300, 0x23FF, kEmoji},       {0x2600, 0x27BF, kEmoji},
    {0x2B00, 0x2BFF, kEmoji},
    {0x3040, 0x309F, kScript + 41},                                  // Hiragana
    {0x30A0, 0x30FF, kScript + 42}, {0x31F0, 0x31FF, kScript + 42},  // Katakana
    {0xFF66, 0xFF9F, kScript + 42},
    {0x3400, 0x4DBF, kScript + 40}, {0x4E00, 0x9FFF, kScript + 40},  // Han
    {0xF900, 0xFAFF, kScript + 40}, {0x20000, 0x3FFFF, kScript + 40},
    {0xFE00, 0xFE0F, kContinue},                                     // variation selectors
    {0x1F3FB, 0x1F3FF, kContinue},                                   // skin-tone modifiers
    {0x1F000, 0x1FAFF, kEmoji},
    {0xE0020, 0xE007F, kContinue},                                   // emoji tag sequences
    {0xE0100, 0xE01EF, kContinue},
};

bool IsSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

int Classify(char32_t c) {
  if (c < 0x80) {
    if (IsSpace(c)) return kSpace;
    if (c >= '0' && c <= '9') return kDigit;
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')) return kScript + 1;
    return kPunct;
  }
  if (IsSpace(c)) return kSpace;
  for (const Range& r : kSpecial) {
    if (c >= r.lo && c <= r.hi) return r.cls;
  }
  // Indic blocks: Devanagari, Bengali, Gurmukhi, Gujarati, Oriya, Tamil, Telugu, Kannada,
  // Malayalam, Sinhala; their signs and vowel marks sit inside the block, so the block is the
  // word.
  if (c >= 0x0900 && c <= 0x0DFF) return kScript + 8 + static_cast<int>((c - 0x0900) >> 7);
  for (const Range& r : kScripts) {
    if (c >= r.lo && c <= r.hi) return r.cls;
  }
  return kPunct;
}

// Decodes one UTF-8 sequence at s[i]. Returns its length (1..4), or 0 when s[i] does not start
// a valid, shortest-form sequence of a scalar value.
size_t DecodeUtf8(std::string_view s, size_t i, char32_t* cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t len;
  char32_t v;
  char32_t min;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, v = b0 & 0x1Fu, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, v = b0 & 0x0Fu, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, v = b0 & 0x07u, min = 0x10000;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b & 0x3Fu);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return len;
}

// ---- training ---------------------------------------------------------------------------

using Pair = uint64_t;  // (left id << 32) | right id
Pair MakePair(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
int32_t Left(Pair p) { return static_cast<int32_t>(p >> 32); }
int32_t Right(Pair p) { return static_cast<int32_t>(p & 0xFFFFFFFFu); }

struct Word {
  std::vector<int32_t> syms;
  int64_t count = 0;
};

struct Candidate {
  int64_t count;
  Pair pair;
};

// Three-way comparison of the concatenations x1+x2 and y1+y2 without building them.
int CompareConcat(std::string_view x1, std::string_view x2, std::string_view y1,
                  std::string_view y2) {
  const size_t nx = x1.size() + x2.size(), ny = y1.size() + y2.size();
  for (size_t i = 0; i < std::min(nx, ny); ++i) {
    const auto cx = static_cast<unsigned char>(i < x1.size() ? x1[i] : x2[i - x1.size()]);
    const auto cy = static_cast<unsigned char>(i < y1.size() ? y1[i] : y2[i - y1.size()]);
    if (cx != cy) return cx < cy ? -1 : 1;
  }
  return nx == ny ? 0 : (nx < ny ? -1 : 1);
}

class Trainer {
 public:
  explicit Trainer(const PieceCounts& counts) {
    for (int i = 0; i < 256; ++i) AddToken(std::string(1, static_cast<char>(i)));
    words_.reserve(counts.size());
    for (const auto& [piece, count] : counts) {
      if (piece.empty() || count <= 0) continue;
      Word w;
      w.count = count;
      for (char c : piece) w.syms.push_back(static_cast<unsigned char>(c));
      words_.push_back(std::move(w));
    }
    for (size_t wi = 0; wi < words_.size(); ++wi) {
      const Word& w = words_[wi];
      for (size_t k = 0; k + 1 < w.syms.size(); ++k) {
        const Pair p = MakePair(w.syms[k], w.syms[k + 1]);
        pair_count_[p] += w.count;
        pair_words_[p].push_back(static_cast<int32_t>(wi));
      }
    }
    for (const auto& [p, c] : pair_count_) {
      if (c >= 2) heap_.push({c, p});
    }
  }

  std::vector<std::string> Run(int64_t max_merges, TrainStats* stats) {
    std::vector<std::string> learned;
    stats->unique_pieces = static_cast<int64_t>(words_.size());
    while (static_cast<int64_t>(learned.size()) < max_merges) {
      if (heap_.empty()) {
        stats->exhausted = true;
        break;
      }
      const Candidate top = heap_.top();
      heap_.pop();
      const auto it = pair_count_.find(top.pair);
      if (it == pair_count_.end() || it->second != top.count) continue;  // stale entry
      std::string merged = tokens_[static_cast<size_t>(Left(top.pair))] +
                           tokens_[static_cast<size_t>(Right(top.pair))];
      int32_t id;
      if (const auto found = token_id_.find(merged); found != token_id_.end()) {
        id = found->second;
        ++stats->reused_merges;
      } else {
        id = AddToken(merged);
        learned.push_back(std::move(merged));
      }
      stats->last_pair_count = top.count;
      Apply(top.pair, id);
    }
    stats->new_tokens = static_cast<int64_t>(learned.size());
    return learned;
  }

 private:
  int32_t AddToken(std::string bytes) {
    const auto id = static_cast<int32_t>(tokens_.size());
    token_id_.emplace(bytes, id);
    tokens_.push_back(std::move(bytes));
    return id;
  }

  // Replaces every occurrence of `pair` (left to right, non-overlapping) by `id` and updates
  // the pair counts incrementally: only the words listed for the pair are touched.
  void Apply(Pair pair, int32_t id) {
    std::vector<int32_t> affected = std::move(pair_words_[pair]);
    pair_words_.erase(pair);
    std::sort(affected.begin(), affected.end());
    affected.erase(std::unique(affected.begin(), affected.end()), affected.end());
    const int32_t a = Left(pair), b = Right(pair);
    std::vector<std::pair<Pair, int64_t>> deltas;
    std::vector<int32_t> merged;
    for (int32_t wi : affected) {
      Word& w = words_[static_cast<size_t>(wi)];
      merged.clear();
      bool hit = false;
      for (size_t k = 0; k < w.syms.size(); ++k) {
        if (k + 1 < w.syms.size() && w.syms[k] == a && w.syms[k + 1] == b) {
          merged.push_back(id);
          ++k;
          hit = true;
        } else {
          merged.push_back(w.syms[k]);
        }
      }
      if (!hit) continue;  // listed for the pair earlier, merged away since
      for (size_t k = 0; k + 1 < w.syms.size(); ++k) {
        deltas.emplace_back(MakePair(w.syms[k], w.syms[k + 1]), -w.count);
      }
      for (size_t k = 0; k + 1 < merged.size(); ++k) {
        const Pair p = MakePair(merged[k], merged[k + 1]);
        deltas.emplace_back(p, w.count);
        // Pairs without the new id were in this word before, so it is already listed for them.
        if (merged[k] == id || merged[k + 1] == id) pair_words_[p].push_back(wi);
      }
      w.syms.swap(merged);
    }
    std::sort(deltas.begin(), deltas.end());
    for (size_t i = 0; i < deltas.size();) {
      const Pair p = deltas[i].first;
      int64_t d = 0;
      for (; i < deltas.size() && deltas[i].first == p; ++i) d += deltas[i].second;
      if (d == 0) continue;
      int64_t& c = pair_count_[p];
      c += d;
      assert(c >= 0);
      if (c == 0) {
        pair_count_.erase(p);
      } else if (c >= 2) {
        heap_.push({c, p});
      }
    }
    assert(pair_count_.count(pair) == 0);
  }

  struct Lower {
    const std::vector<std::string>* tokens;
    // True when x ranks below y: fewer occurrences, then larger concatenation, then larger ids.
    bool operator()(const Candidate& x, const Candidate& y) const {
      if (x.count != y.count) return x.count < y.count;
      const auto& t = *tokens;
      const int c = CompareConcat(t[static_cast<size_t>(Left(x.pair))],
                                  t[static_cast<size_t>(Right(x.pair))],
                                  t[static_cast<size_t>(Left(y.pair))],
                                  t[static_cast<size_t>(Right(y.pair))]);
      if (c != 0) return c > 0;
      return x.pair > y.pair;
    }
  };

  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t> token_id_;  // lookups only: order never observed
  std::vector<Word> words_;
  std::unordered_map<Pair, int64_t> pair_count_;
  std::unordered_map<Pair, std::vector<int32_t>> pair_words_;
  std::priority_queue<Candidate, std::vector<Candidate>, Lower> heap_{Lower{&tokens_}};
};

}  // namespace

std::vector<std::string_view> PreSplit(std::string_view text) {
  std::vector<std::string_view> pieces;
  size_t start = 0;  // of the open run
  int run = -1;      // class of the open run; -1 when none is open
  auto close = [&](size_t end) {
    if (run >= 0 && end > start) pieces.push_back(text.substr(start, end - start));
    run = -1;
  };
  size_t i = 0;
  while (i < text.size()) {
    char32_t cp = 0;
    const size_t len = DecodeUtf8(text, i, &cp);
    if (len == 0) {  // an invalid byte stands alone
      close(i);
      pieces.push_back(text.substr(i, 1));
      start = ++i;
      continue;
    }
    int cls = Classify(cp);
    if (cls == kContinue) {
      if (run >= 0 && run != kSpace) {
        i += len;
        continue;
      }
      cls = kPunct;
    }
    if (run == cls) {
      i += len;
      continue;
    }
    if (run == kSpace && text[i - 1] == ' ') {
      // The run's last space moves into the new run.
      close(i - 1);
      start = i - 1;
    } else {
      close(i);
      start = i;
    }
    run = cls;
    i += len;
  }
  close(text.size());
  return pieces;
}

void CountPieces(std::string_view text, PieceCounts* counts) {
  for (std::string_view piece : PreSplit(text)) ++(*counts)[std::string(piece)];
}

std::vector<std::string> Train(const PieceCounts& counts, int64_t max_merges,
                               TrainStats* stats) {
  TrainStats local;
  if (stats == nullptr) stats = &local;
  *stats = TrainStats{};
  Trainer trainer(counts);
  return trainer.Run(max_merges, stats);
}

}  // namespace k3::bpe
