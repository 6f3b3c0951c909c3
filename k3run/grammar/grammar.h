// A parsed GBNF grammar (llama.cpp's syntax; the accepted subset is in docs/GRAMMAR.md) compiled
// into a byte-level pushdown automaton (grammar_tables.h).
//
// Syntax in brief: `name ::= alt | alt` (a rule ends at a newline outside parentheses; a newline
// may follow `::=`, `|` or `(`), "literal" and [class] / [^class] over Unicode code points with
// \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH escapes (code points, never raw bytes), `.` (any
// code point), ( ) groups, * + ? {m} {m,} {m,n} {,n}, # comments, rule references, and
// special-token terminals <|name|>, <[name]> or <name> (see Parse). Start rule: root.
// What it refuses, each as kInvalid "source:line:column: what": an undefined rule, a rule
// defined twice, left recursion (a rule that can reach itself before consuming input, including
// a repetition of something that can match nothing), an unknown special token, a bad escape, a
// surrogate or out-of-range code point, a reversed range, an empty class, an empty grammar, no
// root, invalid UTF-8 in the text.
// Thread safety: immutable after Parse; share it across threads freely.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "k3run/grammar/grammar_tables.h"

namespace k3::run::grammar {

class Grammar {
 public:
  // `special_names[i]` is the text of special-token symbol i exactly as the tokenizer spells it
  // ("<|open|>", "[EOS]"); the caller maps token ids to symbols (Vocabulary::special_symbol).
  // In the grammar, `<|open|>` names the special "<|open|>", `<[EOS]>` the special "[EOS]", and
  // `<think>` the special "<think>". Token ids (`<[123]>`) are refused: name the token.
  // `source` names the grammar in error messages (a file name, "--grammar", "response_format").
  static Result<std::shared_ptr<const Grammar>> Parse(std::string_view gbnf,
                                                      const std::vector<std::string>& special_names,
                                                      std::string_view source);

  const std::vector<std::string>& special_names() const { return tables_.special_names; }
  // The symbol of special text `name`, or -1.
  int SpecialSymbol(std::string_view name) const;
  // The compiled automaton, for Matcher and TokenMasker.
  const GrammarTables& tables() const { return tables_; }

  explicit Grammar(GrammarTables tables) : tables_(std::move(tables)) {}

 private:
  GrammarTables tables_;
};

}  // namespace k3::run::grammar
