// Builds GrammarTables from rules given as alternatives of elements (the GBNF parser's output):
// compiles code-point classes into byte rules, checks the rules (all defined, a root, no left
// recursion), lays the alternatives out in one array and computes every position's closure.
// Internal to k3run/grammar.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "k3run/grammar/grammar_tables.h"
#include "k3run/grammar/utf8_ranges.h"

namespace k3::run::grammar {

// The grammar text and its name, to turn a byte offset into "source:line:column" (1-based;
// columns count bytes).
struct SourceText {
  std::string_view source;
  std::string_view text;
  std::string Where(size_t offset) const;
  Status Error(size_t offset, const std::string& what) const;
};

class GrammarBuilder {
 public:
  explicit GrammarBuilder(const SourceText* text) : text_(text) {}

  // The id of the rule named `name`, created at its first mention (use or definition).
  int32_t NamedRule(std::string_view name, size_t offset);
  // Marks `rule` as defined here; refuses a second definition.
  Status Define(int32_t rule, size_t offset);
  // A rule of its own for a group or a repetition written at `offset`. `repetition`: it repeats
  // something, so a cycle through it alone is "a repetition of something that can match nothing".
  int32_t NewRule(size_t offset, bool repetition);
  void AddAlternative(int32_t rule, std::vector<Element> alt);

  Element BytesElement(const ByteSet& set);
  // One code point out of `ranges` (NormalizeClass output, not empty): a kBytes element when
  // all of them are ASCII, else a reference to a rule over their UTF-8 sequences.
  Element ClassElement(const std::vector<CodePointRange>& ranges);
  // The bytes of code point `cp`, one kBytes element each.
  void AppendCodePoint(uint32_t cp, std::vector<Element>* seq);

  bool empty() const { return rules_.empty(); }
  Result<GrammarTables> Finish(std::vector<std::string> special_names);

 private:
  using RangeSeq = std::vector<std::pair<uint8_t, uint8_t>>;
  using Language = std::vector<RangeSeq>;  // sorted, unique: a set of byte-range sequences

  struct Rule {
    std::string name;  // "" for groups and repetitions
    std::vector<std::vector<Element>> alts;
    size_t offset = 0;     // the definition (named) or the construct (others)
    size_t first_use = 0;  // named rules: where first mentioned
    bool defined = false;
    bool repetition = false;
  };

  int32_t LanguageRule(const Language& lang);
  Status CheckDefined() const;
  std::vector<bool> Nullable() const;  // per rule: can it match the empty string
  Status CheckLeftRecursion(const std::vector<bool>& nullable) const;
  Status ComputeClosures(GrammarTables* t, const std::vector<int32_t>& rule_of_position,
                         const std::vector<std::vector<int32_t>>& alt_starts,
                         const std::vector<bool>& nullable) const;

  const SourceText* text_;
  std::vector<Rule> rules_;
  std::map<std::string, int32_t, std::less<>> by_name_;
  std::vector<ByteSet> byte_sets_;
  std::map<ByteSet, int32_t> byte_set_ids_;
  std::map<Language, int32_t> language_rules_;
};

}  // namespace k3::run::grammar
