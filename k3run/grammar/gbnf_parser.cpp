// The GBNF text syntax (llama.cpp's grammar-parser.cpp, same precedence and line rules),
// parsed by recursive descent straight into GrammarBuilder calls.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "k3run/grammar/grammar.h"
#include "k3run/grammar/grammar_builder.h"

namespace k3::run::grammar {
namespace {

// Largest m or n in {m,n}: each repetition is expanded into copies, so the bound is a size bound.
constexpr uint64_t kMaxRepetition = 10000;
constexpr size_t kMaxRepeatedElements = size_t{1} << 22;
// Deepest nesting of parentheses (the parser recurses once per level).
constexpr int kMaxNesting = 1000;

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string Quote(std::string_view s) {
  std::string q(1, '"');
  q.append(s);
  q.push_back('"');
  return q;
}

class GbnfParser {
 public:
  GbnfParser(const SourceText* text, const std::map<std::string, int, std::less<>>* specials)
      : text_(text), s_(text->text), specials_(specials), b_(text) {}

  Result<GrammarTables> Run(std::vector<std::string> special_names) {
    SkipSpace(true);
    while (pos_ < s_.size()) K3_RETURN_IF_ERROR(ParseRule());
    return b_.Finish(std::move(special_names));
  }

 private:
  char Peek(size_t ahead = 0) const { return pos_ + ahead < s_.size() ? s_[pos_ + ahead] : '\0'; }
  bool AtEnd() const { return pos_ >= s_.size(); }
  Status Error(size_t offset, const std::string& what) const { return text_->Error(offset, what); }

  // Spaces, tabs and # comments; newlines too when `newline_ok` (inside parentheses, after
  // `::=` and `|`, between rules).
  void SkipSpace(bool newline_ok) {
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else if (newline_ok && (c == '\n' || c == '\r')) {
        ++pos_;
      } else {
        return;
      }
    }
  }

  std::string_view ParseName() {
    const size_t begin = pos_;
    while (pos_ < s_.size() && IsWordChar(s_[pos_])) ++pos_;
    return s_.substr(begin, pos_ - begin);
  }

  Status ParseRule() {
    const size_t name_at = pos_;
    const std::string_view name = ParseName();
    if (name.empty()) {
      return Error(name_at, "expected a rule name, found " + Describe(name_at));
    }
    const int32_t rule = b_.NamedRule(name, name_at);
    K3_RETURN_IF_ERROR(b_.Define(rule, name_at));
    SkipSpace(false);
    if (s_.substr(pos_, 3) != "::=") {
      return Error(pos_, "expected \"::=\" after the rule name " + Quote(name));
    }
    pos_ += 3;
    SkipSpace(true);
    K3_RETURN_IF_ERROR(ParseAlternates(rule, false));
    if (Peek() == '\r') ++pos_;
    if (Peek() == '\n') {
      ++pos_;
    } else if (!AtEnd()) {
      return Error(pos_, "unexpected " + Describe(pos_));
    }
    SkipSpace(true);
    return Status::Ok();
  }

  Status ParseAlternates(int32_t rule, bool nested) {
    while (true) {
      std::vector<Element> seq;
      K3_RETURN_IF_ERROR(ParseSequence(nested, &seq));
      b_.AddAlternative(rule, std::move(seq));
      if (Peek() != '|') return Status::Ok();
      ++pos_;
      SkipSpace(true);
    }
  }

  // What is at `offset`, for messages: the character, or "the end of the grammar".
  std::string Describe(size_t offset) const {
    if (offset >= s_.size()) return "the end of the grammar";
    const char c = s_[offset];
    if (c == '\n' || c == '\r') return "the end of the line";
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7F) {
      static const char* kHex = "0123456789ABCDEF";
      const auto u = static_cast<unsigned char>(c);
      return std::string("byte 0x") + kHex[u >> 4] + kHex[u & 15];
    }
    std::string quoted(1, '\'');
    quoted.push_back(c);
    quoted.push_back('\'');
    return quoted;
  }

  Status ParseSequence(bool nested, std::vector<Element>* seq) {
    size_t item_start = SIZE_MAX;  // where the last item's elements begin (for repetition)
    while (!AtEnd()) {
      const size_t at = pos_;
      const char c = Peek();
      if (c == '"') {
        item_start = seq->size();
        K3_RETURN_IF_ERROR(ParseLiteral(seq));
      } else if (c == '[') {
        item_start = seq->size();
        K3_RETURN_IF_ERROR(ParseClass(seq));
      } else if (c == '.') {
        item_start = seq->size();
        ++pos_;
        seq->push_back(b_.ClassElement(NormalizeClass({}, /*negate=*/true)));
      } else if (c == '(') {
        item_start = seq->size();
        if (++depth_ > kMaxNesting) {
          return Error(at, "parentheses nested deeper than " + std::to_string(kMaxNesting));
        }
        ++pos_;
        SkipSpace(true);
        const int32_t group = b_.NewRule(at, false);
        K3_RETURN_IF_ERROR(ParseAlternates(group, true));
        if (Peek() != ')') {
          return Error(pos_, "expected \")\" to close the \"(\" at " + text_->Where(at) +
                                 ", found " + Describe(pos_));
        }
        ++pos_;
        --depth_;
        seq->push_back({ElementKind::kRule, group});
      } else if (c == '<') {
        item_start = seq->size();
        K3_RETURN_IF_ERROR(ParseSpecial(seq));
      } else if (IsWordChar(c)) {
        item_start = seq->size();
        const std::string_view name = ParseName();
        seq->push_back({ElementKind::kRule, b_.NamedRule(name, at)});
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (item_start == SIZE_MAX) {
          return Error(at, "repetition '" + std::string(1, c) + "' with nothing before it");
        }
        K3_RETURN_IF_ERROR(ParseRepetition(item_start, seq));
      } else if (c == '|' || c == '\n' || c == '\r' || (c == ')' && nested)) {
        return Status::Ok();
      } else if (c == '!' && Peek(1) == '<') {
        return Error(at, "negated special tokens (!<...>) are not supported");
      } else {
        return Error(at, "unexpected " + Describe(at));
      }
      SkipSpace(nested);
    }
    return Status::Ok();
  }

  // One code point of a literal or class at pos_, escapes decoded (llama.cpp's set).
  Result<uint32_t> ParseChar() {
    const size_t at = pos_;
    const auto c = static_cast<unsigned char>(Peek());
    if (c == '\\') {
      const char e = Peek(1);
      pos_ += 2;
      switch (e) {
        case 'n':
          return uint32_t{'\n'};
        case 'r':
          return uint32_t{'\r'};
        case 't':
          return uint32_t{'\t'};
        case '\\':
          return uint32_t{'\\'};
        case '"':
          return uint32_t{'"'};
        case '[':
          return uint32_t{'['};
        case ']':
          return uint32_t{']'};
        case 'x':
          return ParseHexEscape(at, 2);
        case 'u':
          return ParseHexEscape(at, 4);
        case 'U':
          return ParseHexEscape(at, 8);
        default:
          if (e == '\0' && at + 1 >= s_.size()) return Error(at, "bad escape: \\ at the end");
          return Error(at, "bad escape \"\\" + std::string(1, e) +
                               "\" (known: \\n \\r \\t \\\\ \\\" \\[ \\] \\xHH \\uHHHH "
                               "\\UHHHHHHHH)");
      }
    }
    // A raw character: one UTF-8 sequence of the grammar text.
    int length = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xE  ? 3
                 : (c >> 3) == 0x1E ? 4
                                    : 0;
    uint32_t cp = length == 1 ? c : length == 2 ? c & 0x1Fu : length == 3 ? c & 0x0Fu : c & 0x07u;
    for (int i = 1; i < length; ++i) {
      const auto k = static_cast<unsigned char>(Peek(static_cast<size_t>(i)));
      if ((k & 0xC0) != 0x80) {
        length = 0;
        break;
      }
      cp = (cp << 6) | (k & 0x3Fu);
    }
    const bool overlong =
        (length == 2 && cp < 0x80) || (length == 3 && cp < 0x800) || (length == 4 && cp < 0x10000);
    if (length == 0 || overlong || cp > kMaxCodePoint ||
        (cp >= kSurrogateLo && cp <= kSurrogateHi)) {
      return Error(at, "invalid UTF-8 in the grammar text");
    }
    pos_ += static_cast<size_t>(length);
    return cp;
  }

  Result<uint32_t> ParseHexEscape(size_t at, int digits) {
    uint64_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const int h = HexValue(Peek());
      if (h < 0) {
        return Error(at, "bad escape: \\" + std::string(1, s_[at + 1]) + " needs " +
                             std::to_string(digits) + " hex digits");
      }
      v = v * 16 + static_cast<uint64_t>(h);
      ++pos_;
    }
    if (v > kMaxCodePoint) return Error(at, "bad escape: code point above U+10FFFF");
    if (v >= kSurrogateLo && v <= kSurrogateHi) {
      return Error(at, "bad escape: a surrogate (U+D800..U+DFFF) is not a character");
    }
    return static_cast<uint32_t>(v);
  }

  Status ParseLiteral(std::vector<Element>* seq) {
    const size_t open = pos_++;
    while (Peek() != '"') {
      if (AtEnd()) return Error(open, "unterminated string literal");
      K3_ASSIGN_OR_RETURN(const uint32_t cp, ParseChar());
      b_.AppendCodePoint(cp, seq);
    }
    ++pos_;
    return Status::Ok();
  }

  Status ParseClass(std::vector<Element>* seq) {
    const size_t open = pos_++;
    const bool negate = Peek() == '^';
    if (negate) ++pos_;
    std::vector<CodePointRange> ranges;
    while (Peek() != ']') {
      if (AtEnd()) return Error(open, "unterminated character class");
      const size_t at = pos_;
      K3_ASSIGN_OR_RETURN(const uint32_t lo, ParseChar());
      uint32_t hi = lo;
      if (Peek() == '-' && Peek(1) != ']' && pos_ + 1 < s_.size()) {
        ++pos_;
        K3_ASSIGN_OR_RETURN(hi, ParseChar());
        if (hi < lo) {
          return Error(at, "reversed range \"" + std::string(s_.substr(at, pos_ - at)) +
                               "\" in a character class");
        }
      }
      ranges.push_back({lo, hi});
    }
    ++pos_;
    if (ranges.empty() && !negate) return Error(open, "empty character class");
    const std::vector<CodePointRange> normal = NormalizeClass(std::move(ranges), negate);
    if (normal.empty()) return Error(open, "character class matches no character");
    seq->push_back(b_.ClassElement(normal));
    return Status::Ok();
  }

  // <|name|>, <[name]> or <name>: one special-token symbol.
  Status ParseSpecial(std::vector<Element>* seq) {
    const size_t open = pos_;
    size_t close = open + 1;
    while (close < s_.size() && s_[close] != '>' && s_[close] != ' ' && s_[close] != '\t' &&
           s_[close] != '\n' && s_[close] != '\r') {
      ++close;
    }
    if (close >= s_.size() || s_[close] != '>' || close == open + 1) {
      return Error(open, "unterminated special token: expected <|name|>, <[name]> or <name>");
    }
    const std::string_view spelled = s_.substr(open, close - open + 1);
    std::string_view name = spelled;
    if (spelled.size() >= 4 && spelled[1] == '[' && spelled[spelled.size() - 2] == ']') {
      name = spelled.substr(1, spelled.size() - 2);
      const std::string_view inner = name.substr(1, name.size() - 2);
      if (!inner.empty() && inner.find_first_not_of("0123456789") == std::string_view::npos) {
        return Error(open, "token ids such as " + std::string(spelled) +
                               " are not accepted: name the special token");
      }
    }
    auto it = specials_->find(name);
    if (it == specials_->end()) return Error(open, "unknown special token " + Quote(name));
    seq->push_back({ElementKind::kSpecial, it->second});
    pos_ = close + 1;
    return Status::Ok();
  }

  Result<uint64_t> ParseCount() {
    uint64_t v = 0;
    const size_t at = pos_;
    while (Peek() >= '0' && Peek() <= '9') {
      v = v * 10 + static_cast<uint64_t>(Peek() - '0');
      if (v > kMaxRepetition) {
        return Error(at, "repetition bound above the limit " + std::to_string(kMaxRepetition));
      }
      ++pos_;
    }
    return v;
  }

  // Rewrites the last item S = seq[item_start..] as llama.cpp does: S* → R ::= S R | "";
  // S+ → S R; S? → R ::= S | ""; S{m,n} → m copies of S, then n−m nested optionals
  // (R1 ::= S R2 | "", …), never an ambiguous chain of independent optionals.
  Status ParseRepetition(size_t item_start, std::vector<Element>* seq) {
    const size_t at = pos_;
    const std::vector<Element> item(seq->begin() + static_cast<std::ptrdiff_t>(item_start),
                                    seq->end());
    seq->resize(item_start);
    uint64_t min = 0;
    uint64_t max = UINT64_MAX;  // unbounded
    const char op = Peek();
    ++pos_;
    if (op == '+') {
      min = 1;
    } else if (op == '?') {
      max = 1;
    } else if (op == '{') {
      SkipSpace(false);
      const bool has_min = Peek() >= '0' && Peek() <= '9';
      K3_ASSIGN_OR_RETURN(min, ParseCount());
      SkipSpace(false);
      if (Peek() == '}') {
        if (!has_min) return Error(at, "bad repetition \"{}\": expected {m}, {m,}, {m,n} or {,n}");
        max = min;
      } else if (Peek() == ',') {
        ++pos_;
        SkipSpace(false);
        if (Peek() >= '0' && Peek() <= '9') {
          K3_ASSIGN_OR_RETURN(max, ParseCount());
        }
        SkipSpace(false);
      }
      if (Peek() != '}') return Error(at, "bad repetition: expected {m}, {m,}, {m,n} or {,n}");
      ++pos_;
      if (max < min) {
        return Error(at, "bad repetition {" + std::to_string(min) + "," + std::to_string(max) +
                             "}: the maximum is below the minimum");
      }
    }
    const uint64_t copies = max == UINT64_MAX ? min + 1 : max;
    if (copies * (item.size() + 1) > kMaxRepeatedElements) {
      return Error(at, "repetition too large: " + std::to_string(copies) + " copies of " +
                           std::to_string(item.size()) + " elements");
    }
    for (uint64_t i = 0; i < min; ++i) seq->insert(seq->end(), item.begin(), item.end());
    if (max == UINT64_MAX) {
      const int32_t star = b_.NewRule(at, true);
      std::vector<Element> again = item;
      again.push_back({ElementKind::kRule, star});
      b_.AddAlternative(star, std::move(again));
      b_.AddAlternative(star, {});
      seq->push_back({ElementKind::kRule, star});
    } else if (max > min) {
      int32_t inner = -1;
      for (uint64_t k = max - min; k > 0; --k) {
        const int32_t opt = b_.NewRule(at, false);
        std::vector<Element> alt = item;
        if (inner >= 0) alt.push_back({ElementKind::kRule, inner});
        b_.AddAlternative(opt, std::move(alt));
        b_.AddAlternative(opt, {});
        inner = opt;
      }
      seq->push_back({ElementKind::kRule, inner});
    }
    return Status::Ok();
  }

  const SourceText* text_;
  std::string_view s_;
  const std::map<std::string, int, std::less<>>* specials_;
  GrammarBuilder b_;
  size_t pos_ = 0;
  int depth_ = 0;  // open parentheses
};

}  // namespace

Result<std::shared_ptr<const Grammar>> Grammar::Parse(std::string_view gbnf,
                                                      const std::vector<std::string>& special_names,
                                                      std::string_view source) {
  std::map<std::string, int, std::less<>> specials;
  for (size_t i = 0; i < special_names.size(); ++i) {
    auto [it, inserted] = specials.emplace(special_names[i], static_cast<int>(i));
    if (!inserted) {
      return Status::Invalid(std::string(source) + ": special token " + Quote(special_names[i]) +
                             " is listed twice (symbols " + std::to_string(it->second) + " and " +
                             std::to_string(i) + ")");
    }
  }
  const SourceText text{source, gbnf};
  GbnfParser parser(&text, &specials);
  K3_ASSIGN_OR_RETURN(GrammarTables tables, parser.Run(special_names));
  return std::shared_ptr<const Grammar>(std::make_shared<Grammar>(std::move(tables)));
}

int Grammar::SpecialSymbol(std::string_view name) const {
  for (size_t i = 0; i < tables_.special_names.size(); ++i) {
    if (tables_.special_names[i] == name) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace k3::run::grammar
