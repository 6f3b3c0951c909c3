// k3_bench_grammar_mask: what constrained decoding costs per generated token at the released
// vocabulary size. Never run by CTest.
//
//   k3_bench_grammar_mask [--soft-length=N (600)] [--seed=N (1)] [--cache-kib=N (4096)]
//                         [any --benchmark_* flag]
//
// Vocabulary: 163,840 ids = 256 single bytes, random 2–12-byte strings mixing ASCII words,
// punctuation, digits, UTF-8, truncated UTF-8 and 0xFF-style bytes (grammar_walk.h), and 256
// special ids (the 3 XTML specials, 252 the grammar cannot name, 1 end id).
// Schema: a nested object (strings, integers, numbers, an enum, nested objects, arrays of
// objects), in both forms (kJsonText, kXtmlArguments). One seeded walk through each grammar
// records the Matcher state before every token; then, per token:
//   cold   TokenMasker::ComputeAllowed (no cache): the trie walk alone;
//   cached TokenMasker::Allowed on a fresh masker, states in walk order: a repeated state
//          (inside a string, between members) is a cache hit; the first visit pays the walk.
// Reports median, p99 and mean per token in microseconds, and the cache hit rate. Target:
// median ≤ 1 ms per token (cached). Then Google Benchmark runs both over the same states.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "grammar_walk.h"
#include "k3run/grammar/grammar.h"
#include "k3run/grammar/json_schema.h"
#include "k3run/grammar/token_masker.h"

namespace k3::run::grammar {
namespace {

constexpr int64_t kVocab = 163840;
constexpr int kSpecialIds = 256;
constexpr double kTargetMedianUs = 1000.0;

const char* kSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string"},
    "age": {"type": "integer"},
    "email": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
    "address": {"type": "object", "properties": {
        "street": {"type": "string"}, "city": {"type": "string"},
        "geo": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                "required": ["lat", "lon"]}},
      "required": ["street", "city", "geo"]},
    "orders": {"type": "array", "maxItems": 4, "items": {"type": "object", "properties": {
        "id": {"type": "integer"}, "status": {"enum": ["new", "paid", "shipped"]},
        "total": {"type": "number"}}, "required": ["id", "status", "total"]}}
  },
  "required": ["name", "age", "address", "orders"]
})";

using Clock = std::chrono::steady_clock;

struct Case {
  std::string name;
  std::shared_ptr<const Grammar> grammar;
  std::vector<Matcher> states;
  size_t output_bytes = 0;
};

std::shared_ptr<Vocabulary> BenchVocabulary(uint64_t seed) {
  test::SyntheticVocabularyOptions o;
  o.seed = seed;
  o.structural_tokens = false;
  o.grammar_specials = 3;
  o.unnamed_specials = kSpecialIds - 4;
  o.random_tokens = kVocab - 256 - kSpecialIds;
  return test::SyntheticVocabulary(o);
}

struct Summary {
  double median = 0, p99 = 0, mean = 0;
};

Summary Summarize(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  Summary s;
  s.median = us[us.size() / 2];
  s.p99 = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  for (const double u : us) s.mean += u;
  s.mean /= static_cast<double>(us.size());
  return s;
}

double Micros(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

std::vector<Case>* g_cases = nullptr;
std::shared_ptr<const Vocabulary> g_vocab;

void BM_MaskCold(benchmark::State& state, const Case* c) {
  TokenMasker masker(c->grammar, g_vocab, 0);
  std::vector<uint64_t> bits;
  size_t i = 0;
  for (auto _ : state) {
    masker.ComputeAllowed(c->states[i], &bits);
    benchmark::DoNotOptimize(bits.data());
    i = (i + 1) % c->states.size();
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_MaskCached(benchmark::State& state, const Case* c) {
  TokenMasker masker(c->grammar, g_vocab);
  std::vector<uint64_t> bits;
  size_t i = 0;
  for (auto _ : state) {
    masker.Allowed(c->states[i], &bits);
    benchmark::DoNotOptimize(bits.data());
    i = (i + 1) % c->states.size();
  }
  state.SetItemsProcessed(state.iterations());
}

int Main(int argc, char** argv) {
  int soft_length = 600;
  uint64_t seed = 1;
  size_t cache_bytes = TokenMasker::kDefaultCacheBytes;
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--soft-length=", 14) == 0) {
      soft_length = std::atoi(argv[i] + 14);
    } else if (std::strncmp(argv[i], "--cache-kib=", 12) == 0) {
      cache_bytes = size_t{1024} * std::strtoull(argv[i] + 12, nullptr, 10);
    } else if (std::strncmp(argv[i], "--seed=", 7) == 0) {
      seed = std::strtoull(argv[i] + 7, nullptr, 10);
    } else {
      rest.push_back(argv[i]);
    }
  }
  const auto t_vocab = Clock::now();
  g_vocab = BenchVocabulary(seed);
  std::printf("vocabulary: %zu ids (%d special) built in %.0f ms\n", g_vocab->bytes.size(),
              kSpecialIds, Micros(t_vocab) / 1000);

  static std::vector<Case> cases;
  g_cases = &cases;
  const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(kSchema);
  const std::vector<std::string> specials(kXtmlSpecialNames.begin(), kXtmlSpecialNames.end());
  for (const SchemaForm form : {SchemaForm::kJsonText, SchemaForm::kXtmlArguments}) {
    Case c;
    c.name = form == SchemaForm::kJsonText ? "json" : "xtml";
    auto gbnf = JsonSchemaToGbnf(schema, form);
    if (!gbnf.ok()) {
      std::fprintf(stderr, "%s\n", gbnf.status().ToString().c_str());
      return 1;
    }
    auto g = Grammar::Parse(*gbnf, specials, "bench");
    if (!g.ok()) {
      std::fprintf(stderr, "%s\n", g.status().ToString().c_str());
      return 1;
    }
    c.grammar = *g;
    const auto t_build = Clock::now();
    TokenMasker walker(c.grammar, g_vocab);
    const double build_ms = Micros(t_build) / 1000;
    test::WalkOptions o;
    o.seed = seed;
    o.soft_length = soft_length;
    o.closing_symbols = {1, 2};
    test::WalkResult r = test::RandomWalk(walker, *g_vocab, c.grammar, o, /*keep_states=*/true);
    if (!r.finished) {
      std::fprintf(stderr, "%s: walk did not finish: %s\n", c.name.c_str(), r.failure.c_str());
      return 1;
    }
    c.states = std::move(r.states);
    c.output_bytes = r.bytes.size();
    std::string shown;  // the start of the output, control bytes as '.'
    for (const char ch : r.bytes.substr(0, 100))
      shown += static_cast<unsigned char>(ch) < 0x20 ? '.' : ch;
    std::printf("%s: masker built in %.0f ms; walk of %zu tokens, %zu bytes: %s...\n",
                c.name.c_str(), build_ms, c.states.size(), c.output_bytes, shown.c_str());
    cases.push_back(std::move(c));
  }

  std::printf(
      "\nper generated token (us)        median      p99     mean   cache hits (cache %zu KiB)\n",
      cache_bytes >> 10);
  bool met = true;
  for (const Case& c : cases) {
    std::vector<uint64_t> bits;
    TokenMasker cold(c.grammar, g_vocab, 0);
    std::vector<double> cold_us;
    for (const Matcher& m : c.states) {
      const auto t0 = Clock::now();
      cold.ComputeAllowed(m, &bits);
      cold_us.push_back(Micros(t0));
    }
    TokenMasker cached(c.grammar, g_vocab, cache_bytes);
    std::vector<double> cached_us;
    for (const Matcher& m : c.states) {
      const auto t0 = Clock::now();
      cached.Allowed(m, &bits);
      cached_us.push_back(Micros(t0));
    }
    const Summary a = Summarize(cold_us);
    const Summary b = Summarize(cached_us);
    const MaskCache::Stats st = cached.cache_stats();
    std::printf("%-6s cold                   %8.1f %8.1f %8.1f\n", c.name.c_str(), a.median, a.p99,
                a.mean);
    std::printf("%-6s cached (fresh cache)   %8.1f %8.1f %8.1f   %lld/%zu (%.0f%%, %zu KiB)\n",
                c.name.c_str(), b.median, b.p99, b.mean, static_cast<long long>(st.hits),
                c.states.size(),
                100.0 * static_cast<double>(st.hits) / static_cast<double>(c.states.size()),
                st.bytes >> 10);
    met = met && b.median <= kTargetMedianUs;
  }
  std::printf("target: cached median <= %.0f us per token: %s\n\n", kTargetMedianUs,
              met ? "met" : "MISSED");

  for (const Case& c : cases) {
    benchmark::RegisterBenchmark(("mask_cold/" + c.name).c_str(), BM_MaskCold, &c);
    benchmark::RegisterBenchmark(("mask_cached/" + c.name).c_str(), BM_MaskCached, &c);
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace
}  // namespace k3::run::grammar

int main(int argc, char** argv) { return k3::run::grammar::Main(argc, argv); }
