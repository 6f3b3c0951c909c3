// Memory budgets as `k3prep doctor` reasons about them: k3run's presets, the smallest budget a
// model can stream with, and which synthetic preset fits a machine.
//
// Why duplicated here: k3prep may not link k3run (DESIGN.md §2, one-way dependencies). The
// preset table (5 entries) and the minimum rule (two lines) are copied from
// k3run/stream/streaming_plan.cpp; tests/k3prep/doctor_k3run_test.cpp links both and fails when they
// drift. Everything else (layouts, expert sizes) comes from formats/, which both share.
// Non-goals: the full streaming plan (KV cache, scratch): k3run prints that before it starts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/status.h"
#include "formats/config.h"
#include "formats/prepared_layout.h"

namespace k3::prep {

struct RunPreset {
  const char* name;
  double gb;  // TOTAL budget, 10^9 bytes
};
// laptop 8, desktop 32, workstation 96, server 128, max 224 (k3run BudgetPresets()).
const std::vector<RunPreset>& RunPresets();
// The largest preset whose budget is ≤ `bytes` and ≥ `at_least`; nullptr when none.
const RunPreset* LargestPresetWithin(uint64_t bytes, uint64_t at_least = 0);
// k3run's `--preset auto` and the doctor's suggestion: 80 % of MemAvailable.
inline uint64_t UsableBudget(uint64_t mem_available) { return mem_available / 10 * 8; }

// The released model's smallest preset (laptop, 8 GB): below it the trunk ring cannot keep a
// reader running ahead of layer 0's 2.34 GB run (DESIGN.md §7).
inline constexpr uint64_t kReleasedFloorBytes = 8'000'000'000;

// The smallest total budget k3run accepts for a model (PlanStreaming's refusal threshold):
// trunk = min(all runs, 2 × the largest run rounded to 4 KiB); expert cache = top-k + 1 slots
// of the largest expert rounded to 64 B (0 for a model without routed experts).
struct BudgetFloor {
  uint64_t trunk_min = 0;
  uint64_t cache_min = 0;
  uint64_t largest_run = 0;
  uint64_t largest_expert = 0;
  uint64_t total() const { return trunk_min + cache_min; }
};
BudgetFloor FloorOf(const std::vector<prepared::TrunkRun>& runs, uint64_t largest_expert, int topk,
                    bool has_experts);

// Estimated from a config alone: every required trunk tensor as BF16 at its released shape,
// placed by formats' BuildLayout. Exact for the released model's trunk up to the few F32 vectors.
Result<prepared::Layout> LayoutFromConfig(const ModelConfig& c);
Result<BudgetFloor> FloorFromConfig(const ModelConfig& c);
// Exact from a checkpoint's own tensors (opens every shard header). kInvalid when the checkpoint
// does not lay out (the message names the shard/tensor/rule, as `k3prep pack` would).
Result<prepared::Layout> LayoutFromCheckpoint(Env* env, const std::string& dir, const ModelConfig& c);
Result<BudgetFloor> FloorFromCheckpoint(Env* env, const std::string& dir, const ModelConfig& c);
// The floor of a laid-out model (its runs, the config's expert size and top-k).
BudgetFloor FloorOfLayout(const prepared::Layout& layout, const ModelConfig& c);

// The largest of tiny < small < bench whose floor (from its config) is ≤ `bytes`.
struct SynthFit {
  std::string preset;
  BudgetFloor floor;
};
std::optional<SynthFit> LargestSynthPresetWithin(uint64_t bytes);

// "8.00 GB": decimal GB with two decimals, as DESIGN.md quotes sizes ("4.21 MB" below 0.1 GB).
std::string DecimalGb(uint64_t bytes);
// A --budget-gb value (3 decimals) that is ≤ `bytes`.
std::string BudgetFlagGb(uint64_t bytes);

}  // namespace k3::prep
