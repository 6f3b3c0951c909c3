// Tool (not a test): k3run's plans for the RELEASED model config (synth preset "full") under each
// budget preset, without its 1.6 TB of weights. The prepared directory is built in memory
// (synth::PreparedForConfig: what `k3prep pack --experts copy` writes for that config) and
// planned by the engine itself (Engine::ForPrepared, Engine::Plan), exactly as k3run plans it;
// a budget plan reads no file. For each preset and context it prints the streaming plan and the
// memory plan (with the rows per pass), or the refusal. MemAvailable is taken as 1 TB so that
// only the preset's budget decides (k3run also refuses a plan above the machine's MemAvailable).
//
// Usage: k3_plan_released [--ctx N]...
//   without --ctx: 32768 positions for every preset, and 131072 for laptop too.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "k3prep/synth/prepared.h"
#include "k3prep/synth/presets.h"
#include "k3run/engine/session.h"
#include "k3run/kernels/matmul.h"
#include "k3run/stream/streaming_plan.h"

namespace {

using namespace k3;

constexpr uint64_t kMemAvailable = uint64_t{1'000'000'000'000};  // 1 TB

// One plan: the engine's, for `preset` and `positions` (a prompt of that many rows).
void PrintPlan(const prepared::PreparedDir& p, const std::string& preset, int64_t positions) {
  std::unique_ptr<run::Engine> engine = run::Engine::ForPrepared(p);
  run::PlanOptions o;
  o.positions = positions;
  o.pass_rows = positions;
  o.budget.preset = preset;
  // The preset's budget is in question, not this machine: MemAvailable (which k3run also
  // checks the plan against) is taken as kMemAvailable.
  o.mem_available = []() -> Result<uint64_t> { return kMemAvailable; };
  std::printf("--preset %s --ctx %lld:\n", preset.c_str(), static_cast<long long>(positions));
  const Status s = engine->Plan(o);
  if (!s.ok()) {
    std::printf("  refused: %s\n\n", s.message().c_str());
    return;
  }
  std::printf("  %s\n", engine->streaming_plan()->Describe().c_str());
  std::printf("  memory plan: %s (chunk %lld)\n\n", engine->memory_plan().Describe().c_str(),
              static_cast<long long>(engine->memory_plan().chunk));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> ctxs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ctx" && i + 1 < argc) {
      char* end = nullptr;
      const long long v = std::strtoll(argv[++i], &end, 10);
      if (*end != '\0' || v < 1) {
        std::fprintf(stderr, "--ctx %s: expected a positive integer\n", argv[i]);
        return 2;
      }
      ctxs.push_back(v);
    } else {
      std::fprintf(stderr, "usage: k3_plan_released [--ctx N]...\n");
      return 2;
    }
  }
  Result<ModelConfig> c = synth::PresetConfig("full");
  if (!c.ok()) {
    std::fprintf(stderr, "%s\n", c.status().message().c_str());
    return 2;
  }
  Result<prepared::PreparedDir> p = synth::PreparedForConfig(*c);
  if (!p.ok()) {
    std::fprintf(stderr, "%s\n", p.status().message().c_str());
    return 2;
  }
  std::printf("released config (synth preset full): %d layers, %d experts (top-%d), vocab %lld; "
              "%d compute threads; MemAvailable taken as 1 TB\n\n",
              c->n_layers, c->n_experts, c->topk, static_cast<long long>(c->vocab),
              kernels::Threads());
  for (const run::BudgetPreset& b : run::BudgetPresets()) {
    std::vector<int64_t> list = ctxs;
    if (list.empty()) list = {32768};
    if (ctxs.empty() && std::string(b.name) == "laptop") list.push_back(131072);
    for (int64_t n : list) PrintPlan(*p, b.name, n);
  }
  return 0;
}
