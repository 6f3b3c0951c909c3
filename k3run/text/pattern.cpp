#include "k3run/text/pattern.h"

#include <string>

#include "k3run/text/tokenizer.h"

namespace k3::tok {
namespace {

// tokenization_kimi.py's pat_str: tests/k3run/tokenizer/data/tokenizer-pattern.txt holds the
// same alternatives one per line (a test checks they are equal).
constexpr std::string_view kKimiPattern =
    R"([\p{Han}]+)"
    "|"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    "|"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    "|"
    R"(\p{N}{1,3})"
    "|"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*)"
    "|"
    R"(\s*[\r\n]+)"
    "|"
    R"(\s+(?!\S))"
    "|"
    R"(\s+)";

// Unicode White_Space (PropList.txt), which is what the regex crate's Unicode \s means.
constexpr std::string_view kWhiteSpaceItems =
    R"(\x{9}-\x{D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::string At(size_t offset) { return "at byte " + std::to_string(offset) + " of the pattern"; }

// Length of the escape starting at s[i] == '\\': `\p{..}` / `\x{..}` as a unit, else 2.
size_t EscapeLength(std::string_view s, size_t i) {
  if (i + 2 < s.size() && (s[i + 1] == 'p' || s[i + 1] == 'P' || s[i + 1] == 'x') &&
      s[i + 2] == '{') {
    const size_t close = s.find('}', i + 3);
    if (close != std::string_view::npos) return close - i + 1;
  }
  return i + 1 < s.size() ? 2 : 1;
}

// End (one past the closing ']') of the class opening at s[i] == '[', honouring escapes and
// nested classes; npos when unterminated. A ']' right after '[' or '[^' is a literal.
size_t ClassEnd(std::string_view s, size_t i) {
  int depth = 0;
  size_t j = i;
  while (j < s.size()) {
    const char c = s[j];
    if (c == '\\') {
      j += EscapeLength(s, j);
      continue;
    }
    if (c == '[') {
      ++depth;
      ++j;
      if (j < s.size() && s[j] == '^') ++j;
      if (j < s.size() && s[j] == ']') ++j;
      continue;
    }
    if (c == ']' && --depth == 0) return j + 1;
    ++j;
  }
  return std::string_view::npos;
}

// `Y` of an operand `[^Y]` or `[Y]`, as a lookaround body: a lone escape stays bare.
std::string LookBody(std::string_view inner) {
  const bool single_escape = !inner.empty() && inner[0] == '\\' && EscapeLength(inner, 0) == inner.size();
  return single_escape ? std::string(inner) : "[" + std::string(inner) + "]";
}

}  // namespace

std::string_view KimiPattern() { return kKimiPattern; }

Result<std::string> RewriteClassIntersections(std::string_view p) {
  std::string out;
  out.reserve(p.size() * 2);
  size_t i = 0;
  while (i < p.size()) {
    if (p[i] == '\\') {
      const size_t n = EscapeLength(p, i);
      out.append(p.substr(i, n));
      i += n;
      continue;
    }
    if (p[i] != '[') {
      out.push_back(p[i++]);
      continue;
    }
    const size_t end = ClassEnd(p, i);
    if (end == std::string_view::npos) {
      return Status::Invalid("tokenizer pattern: unterminated character class " + At(i) +
                             "; the pattern must come from tokenization_kimi.py unchanged");
    }
    const std::string_view cls = p.substr(i, end - i);
    const size_t amp = cls.find("&&");
    if (amp == std::string_view::npos) {
      out.append(cls);
      i = end;
      continue;
    }
    // Only `[X&&[^Y]]` / `[X&&[Y]]` with a flat X: the forms the released pattern uses.
    const std::string_view x = cls.substr(1, amp - 1);
    const std::string_view rhs = cls.substr(amp + 2, cls.size() - amp - 3);  // without final ']'
    const bool flat_x = x.find('[') == std::string_view::npos && !x.empty() && x[0] != '^';
    const bool class_rhs = rhs.size() >= 2 && rhs.front() == '[' && ClassEnd(rhs, 0) == rhs.size();
    if (!flat_x || !class_rhs || rhs.find("&&") != std::string_view::npos) {
      return Status::Invalid("tokenizer pattern: unsupported class intersection '" +
                             std::string(cls) + "' " + At(i) +
                             "; only [X&&[^Y]] and [X&&[Y]] with a plain X can be rewritten");
    }
    const bool negated = rhs[1] == '^';
    const std::string_view inner = rhs.substr(negated ? 2 : 1, rhs.size() - (negated ? 3 : 2));
    out.append(negated ? "(?:(?!" : "(?:(?=");
    out.append(LookBody(inner));
    out.append(")[");
    out.append(x);
    out.append("])");
    i = end;
  }
  return out;
}

Result<std::string> KimiPatternForPcre2(std::string_view pattern) {
  K3_ASSIGN_OR_RETURN(std::string p, RewriteClassIntersections(pattern));
  std::string out;
  out.reserve(p.size() * 2);
  int class_depth = 0;
  for (size_t i = 0; i < p.size();) {
    const char c = p[i];
    if (c == '\\') {
      const size_t n = EscapeLength(p, i);
      const std::string_view esc = std::string_view(p).substr(i, n);
      if (esc == "\\p{Han}" || esc == "\\P{Han}") {
        out.append(esc[1] == 'p' ? "\\p{sc:Han}" : "\\P{sc:Han}");
      } else if (esc == "\\s") {
        out.append(class_depth > 0 ? std::string(kWhiteSpaceItems)
                                   : "[" + std::string(kWhiteSpaceItems) + "]");
      } else if (esc == "\\S") {
        if (class_depth > 0) {
          return Status::Invalid("tokenizer pattern: \\S inside a character class " + At(i) +
                                 " has no PCRE2 translation here");
        }
        out.append("[^" + std::string(kWhiteSpaceItems) + "]");
      } else if (n > 2 && (esc[1] == 'p' || esc[1] == 'P') && esc.find('=') == std::string_view::npos &&
                 esc.find(':') == std::string_view::npos && esc.size() > 5) {
        // General categories (L, Lu, N, M, …) mean the same in both engines; any other
        // script name would need the sc: treatment above.
        const std::string_view name = esc.substr(3, esc.size() - 4);
        if (name.size() > 2) {
          return Status::Invalid("tokenizer pattern: property \\p{" + std::string(name) + "} " +
                                 At(i) + " is not a general category; its PCRE2 meaning "
                                 "(script extensions) would differ from tiktoken's");
        }
        out.append(esc);
      } else {
        out.append(esc);
      }
      i += n;
      continue;
    }
    if (c == '[') {
      ++class_depth;
      out.push_back(c);
      ++i;
      if (i < p.size() && p[i] == '^') out.push_back(p[i++]);
      if (i < p.size() && p[i] == ']') out.push_back(p[i++]);
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out.push_back(c);
    ++i;
  }
  return out;
}

}  // namespace k3::tok
