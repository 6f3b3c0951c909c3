// The weight half of the memory plan for streaming (DESIGN.md §6 k3run memory flags, §7 "Weight
// streaming"): from a total budget or explicit trunk/cache budgets, which trunk layers are pinned,
// how many ring slots of what size, how many expert slots, whether lm_head is held. A TOTAL
// budget gives the weights what is left after BudgetRequest::reserved.
//
// Goals: computed from the prepared directory alone, before anything is allocated; refusals name
// the minimum and the flag that fixes it (exit 2). Non-goals: KV cache and state (plan.h), I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "formats/prepared_manifest.h"
#include "k3run/stream/expert_cache.h"

namespace k3::run {

struct BudgetPreset {
  const char* name;
  double gb;  // TOTAL budget, 10^9 bytes
};
// laptop 8, desktop 32, workstation 96, server 128, max 224 ("auto" is MemAvailable-derived).
const std::vector<BudgetPreset>& BudgetPresets();
std::string ListPresetsText();

// The largest budget a flag or library caller may give, in GB (1 PB): no machine has more, and
// far beyond it the GB → bytes conversion would leave uint64_t.
inline constexpr double kMaxBudgetGb = 1e6;

// Each *_gb, when set, must be finite and in (0, kMaxBudgetGb]; PlanStreaming refuses others.
struct BudgetRequest {
  std::optional<double> budget_gb;  // --budget-gb
  std::optional<double> trunk_gb;   // --trunk-gb (overrides the split's trunk part)
  std::optional<double> cache_gb;   // --cache-gb (overrides the split's cache part)
  std::optional<std::string> preset;
  CachePolicy policy = CachePolicy::kS3Fifo;
  // The part of a TOTAL budget (--budget-gb, --preset) that is not weights: latent caches, KDA
  // states and scratch (DESIGN.md §6), and the words that name it in a refusal. Explicit
  // --trunk-gb / --cache-gb are weight budgets: the reserved bytes come on top of them.
  uint64_t reserved = 0;
  std::string reserved_what;
  // Ranks ≥ 1 of a scale-out run (docs/SCALE-OUT.md) compute routed experts only and never read
  // the trunk: no pinned layer, no ring, no lm_head; the whole weight budget is the expert cache
  // (--trunk-gb does not apply).
  bool experts_only = false;
  bool any() const { return budget_gb || trunk_gb || cache_gb || preset; }
};

struct StreamingPlan {
  uint64_t trunk_budget = 0, cache_budget = 0;
  std::vector<int> pinned;         // layers held for the run, largest run first
  uint64_t pinned_bytes = 0;
  int ring_slots = 0;              // 0 when every layer is pinned
  uint64_t ring_slot_bytes = 0;    // largest unpinned run, rounded to 4 KiB
  int expert_slots = 0;
  uint64_t expert_slot_bytes = 0;  // largest expert record, rounded to 64
  bool lm_head_held = false;
  uint64_t lm_head_bytes = 0;
  int64_t lm_head_chunk_rows = 0;  // when streamed
  CachePolicy policy = CachePolicy::kS3Fifo;
  uint64_t trunk_min = 0, cache_min = 0;
  bool experts_only = false;       // BudgetRequest::experts_only: no trunk at all
  uint64_t total = 0;              // the TOTAL budget asked for (0: only weight budgets given)
  uint64_t reserved = 0;           // the part of `total` kept for caches, states and scratch
  uint64_t bytes() const;          // what the source holds at most
  std::string Describe() const;    // the printed plan
};

// `mem_available` is used for --preset auto only.
Result<StreamingPlan> PlanStreaming(const prepared::PreparedDir& p, const BudgetRequest& req,
                                    uint64_t mem_available);

// --preload's rule: the plan's expert cache holds every expert of `p`. k3run checks it before
// anything is loaded or probed; StreamingWeights checks it again for library callers.
Status CheckPreloadFits(const StreamingPlan& plan, const prepared::PreparedDir& p);

}  // namespace k3::run
