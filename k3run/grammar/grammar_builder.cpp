#include "k3run/grammar/grammar_builder.h"

#include <algorithm>
#include <cassert>

namespace k3::run::grammar {
namespace {

// Bounds what parsing may build, so that a hostile grammar fails with a message instead of
// exhausting memory: elements of all alternatives, and stack entries of all closures.
constexpr size_t kMaxElements = size_t{1} << 22;
constexpr size_t kMaxClosureEntries = size_t{1} << 23;

ByteSet RangeSet(uint8_t lo, uint8_t hi) {
  ByteSet s;
  for (int b = lo; b <= hi; ++b) s.Add(static_cast<uint8_t>(b));
  return s;
}

}  // namespace

std::string SourceText::Where(size_t offset) const {
  offset = std::min(offset, text.size());
  size_t line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return std::string(source) + ":" + std::to_string(line) + ":" +
         std::to_string(offset - line_start + 1);
}

Status SourceText::Error(size_t offset, const std::string& what) const {
  return Status::Invalid(Where(offset) + ": " + what);
}

int32_t GrammarBuilder::NamedRule(std::string_view name, size_t offset) {
  auto it = by_name_.find(name);
  if (it != by_name_.end()) return it->second;
  const auto id = static_cast<int32_t>(rules_.size());
  Rule r;
  r.name = std::string(name);
  r.offset = offset;
  r.first_use = offset;
  rules_.push_back(std::move(r));
  by_name_.emplace(std::string(name), id);
  return id;
}

Status GrammarBuilder::Define(int32_t rule, size_t offset) {
  Rule& r = rules_[static_cast<size_t>(rule)];
  if (r.defined) {
    return text_->Error(offset, "rule \"" + r.name + "\" is defined twice (first at " +
                                    text_->Where(r.offset) + ")");
  }
  r.defined = true;
  r.offset = offset;
  return Status::Ok();
}

int32_t GrammarBuilder::NewRule(size_t offset, bool repetition) {
  const auto id = static_cast<int32_t>(rules_.size());
  Rule r;
  r.offset = offset;
  r.defined = true;
  r.repetition = repetition;
  rules_.push_back(std::move(r));
  return id;
}

void GrammarBuilder::AddAlternative(int32_t rule, std::vector<Element> alt) {
  rules_[static_cast<size_t>(rule)].alts.push_back(std::move(alt));
}

Element GrammarBuilder::BytesElement(const ByteSet& set) {
  auto [it, inserted] = byte_set_ids_.emplace(set, static_cast<int32_t>(byte_sets_.size()));
  if (inserted) byte_sets_.push_back(set);
  return {ElementKind::kBytes, it->second};
}

void GrammarBuilder::AppendCodePoint(uint32_t cp, std::vector<Element>* seq) {
  std::vector<uint8_t> bytes;
  AppendUtf8(cp, &bytes);
  for (const uint8_t b : bytes) seq->push_back(BytesElement(RangeSet(b, b)));
}

Element GrammarBuilder::ClassElement(const std::vector<CodePointRange>& ranges) {
  assert(!ranges.empty());
  Language lang;
  for (const ByteRangeSeq& s : Utf8Sequences(ranges)) {
    RangeSeq seq;
    for (int i = 0; i < s.length; ++i) seq.emplace_back(s.lo[i], s.hi[i]);
    lang.push_back(std::move(seq));
  }
  std::sort(lang.begin(), lang.end());
  if (std::all_of(lang.begin(), lang.end(), [](const RangeSeq& s) { return s.size() == 1; })) {
    ByteSet set;
    for (const RangeSeq& s : lang) {
      for (int b = s[0].first; b <= s[0].second; ++b) set.Add(static_cast<uint8_t>(b));
    }
    return BytesElement(set);
  }
  return {ElementKind::kRule, LanguageRule(lang)};
}

// A rule matching exactly the byte strings of `lang`, built so that its alternatives start
// with disjoint byte sets: bytes whose continuations are the same set share one alternative.
// So after each byte at most one alternative survives and the matcher's stacks never branch
// inside a character. Rules are shared by every class that needs the same continuation.
int32_t GrammarBuilder::LanguageRule(const Language& lang) {
  auto found = language_rules_.find(lang);
  if (found != language_rules_.end()) return found->second;
  std::array<Language, 256> next;
  bool has_empty = false;
  for (const RangeSeq& seq : lang) {
    if (seq.empty()) {
      has_empty = true;
      continue;
    }
    for (int b = seq[0].first; b <= seq[0].second; ++b) {
      next[static_cast<size_t>(b)].emplace_back(seq.begin() + 1, seq.end());
    }
  }
  std::map<Language, ByteSet> groups;  // ordered: the same grammar always compiles alike
  for (int b = 0; b < 256; ++b) {
    Language& l = next[static_cast<size_t>(b)];
    if (l.empty()) continue;
    std::sort(l.begin(), l.end());
    l.erase(std::unique(l.begin(), l.end()), l.end());
    groups[l].Add(static_cast<uint8_t>(b));
  }
  const int32_t id = NewRule(0, false);
  language_rules_.emplace(lang, id);
  for (const auto& [suffix, first] : groups) {
    std::vector<Element> alt = {BytesElement(first)};
    if (suffix.size() == 1) {
      for (const auto& [lo, hi] : suffix[0]) alt.push_back(BytesElement(RangeSet(lo, hi)));
    } else {
      alt.push_back({ElementKind::kRule, LanguageRule(suffix)});
    }
    AddAlternative(id, std::move(alt));
  }
  if (has_empty) AddAlternative(id, {});
  return id;
}

Status GrammarBuilder::CheckDefined() const {
  const Rule* first = nullptr;
  for (const Rule& r : rules_) {
    if (!r.defined && (first == nullptr || r.first_use < first->first_use)) first = &r;
  }
  if (first != nullptr)
    return text_->Error(first->first_use, "undefined rule \"" + first->name + "\"");
  return Status::Ok();
}

std::vector<bool> GrammarBuilder::Nullable() const {
  const size_t n = rules_.size();
  std::vector<bool> nullable(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const auto& alt : rules_[r].alts) {
        const bool all = std::all_of(alt.begin(), alt.end(), [&](const Element& e) {
          return e.kind == ElementKind::kRule && nullable[static_cast<size_t>(e.arg)];
        });
        if (all) {
          nullable[r] = true;
          changed = true;
          break;
        }
      }
    }
  }
  return nullable;
}

// Left recursion: a rule that can reach itself through references each preceded only by
// things that may match nothing. Expanding it would never consume a byte, so it is refused
// (llama.cpp loops or overflows its stack on it). Depth-first search with an explicit stack, so
// a long chain of rules cannot overflow ours.
Status GrammarBuilder::CheckLeftRecursion(const std::vector<bool>& nullable) const {
  const size_t n = rules_.size();
  std::vector<std::vector<int32_t>> left(n);
  for (size_t r = 0; r < n; ++r) {
    for (const auto& alt : rules_[r].alts) {
      for (const Element& e : alt) {
        if (e.kind != ElementKind::kRule) break;
        left[r].push_back(e.arg);
        if (!nullable[static_cast<size_t>(e.arg)]) break;
      }
    }
  }
  std::vector<uint8_t> color(n, 0);              // 0 unvisited, 1 on the path, 2 done
  std::vector<std::pair<int32_t, size_t>> path;  // rule, next edge to follow
  std::vector<int32_t> cycle;
  for (size_t root = 0; root < n && cycle.empty(); ++root) {
    if (color[root] != 0) continue;
    color[root] = 1;
    path.emplace_back(static_cast<int32_t>(root), 0);
    while (!path.empty() && cycle.empty()) {
      auto& [r, edge] = path.back();
      const auto& edges = left[static_cast<size_t>(r)];
      if (edge == edges.size()) {
        color[static_cast<size_t>(r)] = 2;
        path.pop_back();
        continue;
      }
      const int32_t next = edges[edge++];
      if (color[static_cast<size_t>(next)] == 1) {
        auto on_path =
            std::find_if(path.begin(), path.end(), [&](const auto& f) { return f.first == next; });
        for (; on_path != path.end(); ++on_path) cycle.push_back(on_path->first);
      } else if (color[static_cast<size_t>(next)] == 0) {
        color[static_cast<size_t>(next)] = 1;
        path.emplace_back(next, 0);
      }
    }
  }
  if (cycle.empty()) return Status::Ok();
  // Name the cycle by its named rules, starting from the one defined first.
  size_t begin = cycle.size();
  for (size_t i = 0; i < cycle.size(); ++i) {
    const Rule& r = rules_[static_cast<size_t>(cycle[i])];
    if (!r.name.empty() &&
        (begin == cycle.size() || r.offset < rules_[static_cast<size_t>(cycle[begin])].offset)) {
      begin = i;
    }
  }
  if (begin == cycle.size()) {
    size_t rep = 0;
    for (size_t i = 0; i < cycle.size(); ++i) {
      if (rules_[static_cast<size_t>(cycle[i])].repetition) rep = i;
    }
    return text_->Error(rules_[static_cast<size_t>(cycle[rep])].offset,
                        "left recursion: this repetition repeats something that can match the "
                        "empty string");
  }
  const Rule& named = rules_[static_cast<size_t>(cycle[begin])];
  std::string chain = named.name;
  for (size_t k = 1; k <= cycle.size(); ++k) {
    const Rule& r = rules_[static_cast<size_t>(cycle[(begin + k) % cycle.size()])];
    if (!r.name.empty()) chain += " -> " + r.name;
  }
  return text_->Error(named.offset, "left recursion: rule \"" + named.name +
                                        "\" can reach itself before matching any input (" + chain +
                                        ")");
}

// closure(p): END → {ε}; a terminal → {[p]}; a reference to R → for each alternative a of R and
// each chain c of closure(a): c = ε (R matched nothing) gives closure(p + 1); otherwise
// [p + 1] + c, where p + 1 is pushed only if it is not END (so right recursion does not grow
// the stack). Computed bottom-up over the "needs" graph (alternative starts, and p + 1 when R
// is nullable), which has no cycle because the grammar has no left recursion; explicit stack.
Status GrammarBuilder::ComputeClosures(GrammarTables* t,
                                       const std::vector<int32_t>& rule_of_position,
                                       const std::vector<std::vector<int32_t>>& alt_starts,
                                       const std::vector<bool>& nullable) const {
  const std::vector<Element>& el = t->elements;
  const size_t n = el.size();
  std::vector<std::vector<std::vector<int32_t>>> chains(n);
  std::vector<uint8_t> state(n, 0);  // 0 new, 1 needs pushed, 2 done
  size_t total = 0;
  auto needs = [&](int32_t p, std::vector<int32_t>* out) {
    out->clear();
    const Element& e = el[static_cast<size_t>(p)];
    if (e.kind != ElementKind::kRule) return;
    *out = alt_starts[static_cast<size_t>(e.arg)];
    if (nullable[static_cast<size_t>(e.arg)]) out->push_back(p + 1);
  };
  auto compute = [&](int32_t p) {
    const auto up = static_cast<size_t>(p);
    std::vector<std::vector<int32_t>> out;
    const Element& e = el[up];
    if (e.kind == ElementKind::kEnd) {
      out.emplace_back();
    } else if (e.kind != ElementKind::kRule) {
      out.push_back({p});
    } else {
      const bool push_continuation = el[up + 1].kind != ElementKind::kEnd;
      for (const int32_t a : alt_starts[static_cast<size_t>(e.arg)]) {
        for (const auto& c : chains[static_cast<size_t>(a)]) {
          if (c.empty()) {
            for (const auto& d : chains[up + 1]) out.push_back(d);
            continue;
          }
          std::vector<int32_t> chain;
          chain.reserve(c.size() + 1);
          if (push_continuation) chain.push_back(p + 1);
          chain.insert(chain.end(), c.begin(), c.end());
          out.push_back(std::move(chain));
        }
      }
      std::sort(out.begin(), out.end());
      out.erase(std::unique(out.begin(), out.end()), out.end());
    }
    for (const auto& c : out) total += c.size() + 1;
    chains[up] = std::move(out);
  };
  std::vector<int32_t> stack;
  std::vector<int32_t> deps;
  for (size_t root = 0; root < n; ++root) {
    if (state[root] == 2) continue;
    stack.push_back(static_cast<int32_t>(root));
    while (!stack.empty()) {
      const int32_t p = stack.back();
      const auto up = static_cast<size_t>(p);
      if (state[up] == 2) {
        stack.pop_back();
        continue;
      }
      if (state[up] == 0) {
        state[up] = 1;
        needs(p, &deps);
        for (const int32_t d : deps) {
          if (state[static_cast<size_t>(d)] == 0) stack.push_back(d);
        }
        continue;
      }
      compute(p);  // every need is done: each was pushed above p and popped before it
      state[up] = 2;
      stack.pop_back();
      if (total > kMaxClosureEntries) {
        const Rule& r = rules_[static_cast<size_t>(rule_of_position[up])];
        return text_->Error(r.offset,
                            "grammar too large: expanding the references its rules "
                            "start with needs more than " +
                                std::to_string(kMaxClosureEntries) +
                                " stack entries (rules nested too deep or too ambiguous)");
      }
    }
  }
  t->closure_begin.assign(1, 0);
  t->chain_begin.assign(1, 0);
  for (size_t p = 0; p < n; ++p) {
    for (const auto& c : chains[p]) {
      t->chain_positions.insert(t->chain_positions.end(), c.begin(), c.end());
      t->chain_begin.push_back(static_cast<int32_t>(t->chain_positions.size()));
    }
    t->closure_begin.push_back(static_cast<int32_t>(t->chain_begin.size() - 1));
  }
  return Status::Ok();
}

Result<GrammarTables> GrammarBuilder::Finish(std::vector<std::string> special_names) {
  if (rules_.empty()) return text_->Error(0, "empty grammar: no rules");
  K3_RETURN_IF_ERROR(CheckDefined());
  auto root = by_name_.find("root");
  if (root == by_name_.end()) return text_->Error(0, "no rule named \"root\" (the start rule)");
  const std::vector<bool> nullable = Nullable();
  K3_RETURN_IF_ERROR(CheckLeftRecursion(nullable));

  GrammarTables t;
  t.special_names = std::move(special_names);
  t.byte_sets = byte_sets_;
  std::vector<int32_t> rule_of_position = {root->second, root->second};
  t.elements = {{ElementKind::kRule, root->second}, {ElementKind::kEnd, 0}};
  t.start = 0;
  std::vector<std::vector<int32_t>> alt_starts(rules_.size());
  size_t count = 2;
  for (const Rule& r : rules_) {
    for (const auto& alt : r.alts) count += alt.size() + 1;
  }
  if (count > kMaxElements) {
    return text_->Error(0, "grammar too large: " + std::to_string(count) +
                               " elements after expanding repetitions (limit " +
                               std::to_string(kMaxElements) + ")");
  }
  t.elements.reserve(count);
  for (size_t r = 0; r < rules_.size(); ++r) {
    for (const auto& alt : rules_[r].alts) {
      alt_starts[r].push_back(static_cast<int32_t>(t.elements.size()));
      t.elements.insert(t.elements.end(), alt.begin(), alt.end());
      t.elements.push_back({ElementKind::kEnd, 0});
      rule_of_position.resize(t.elements.size(), static_cast<int32_t>(r));
    }
  }
  K3_RETURN_IF_ERROR(ComputeClosures(&t, rule_of_position, alt_starts, nullable));
  return t;
}

}  // namespace k3::run::grammar
