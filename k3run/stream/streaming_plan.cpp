// Budget → streaming plan (see k3run/stream/streaming_plan.h).
#include "k3run/stream/streaming_plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>
#include <cstdio>

#include "common/align.h"
#include "formats/prepared_layout.h"
#include "k3run/stream/memory_plan.h"

namespace k3::run {
namespace {

uint64_t GbToBytes(double gb) { return gb <= 0 ? 0 : static_cast<uint64_t>(std::llround(gb * 1e9)); }

// Expert records this directory holds: all of them, or a share's own (the rest are absent).
size_t PresentExperts(const prepared::PreparedDir& p) {
  return static_cast<size_t>(
      std::count_if(p.experts.records.begin(), p.experts.records.end(),
                    [](const prepared::ExpertRecord& r) { return !r.absent(); }));
}

// Budgets of small models round to 0.000 GB: the exact byte count keeps messages meaningful.
std::string GbBytes(uint64_t b) { return FormatGb(b) + " = " + std::to_string(b) + " bytes"; }

// A flag value (GB, 3 decimals) that is never below `b`, so the suggestion always works.
std::string FlagGb(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", std::ceil(double(b) / 1e6) / 1e3);
  return buf;
}

}  // namespace

const std::vector<BudgetPreset>& BudgetPresets() {
  static const std::vector<BudgetPreset> presets = {
      {"laptop", 8}, {"desktop", 32}, {"workstation", 96}, {"server", 128}, {"max", 224}};
  return presets;
}

std::string ListPresetsText() {
  std::string s = "presets (TOTAL budgets: trunk first, then the expert cache):\n";
  for (const BudgetPreset& p : BudgetPresets()) {
    s += "  " + std::string(p.name) + std::string(12 - std::string(p.name).size(), ' ') +
         std::to_string(static_cast<int>(p.gb)) + " GB\n";
  }
  s += "  auto        80 % of MemAvailable\n";
  return s;
}

uint64_t StreamingPlan::bytes() const {
  return pinned_bytes + uint64_t(ring_slots) * ring_slot_bytes +
         uint64_t(expert_slots) * expert_slot_bytes + lm_head_bytes;
}

std::string StreamingPlan::Describe() const {
  if (experts_only) {
    return "streaming plan: experts only (this rank reads no trunk), expert cache " +
           std::to_string(expert_slots) + " slots × " + std::to_string(expert_slot_bytes) +
           " B (" + CachePolicyName(policy) + "); weights held " + GbBytes(bytes());
  }
  std::string s = "streaming plan: trunk budget " + FormatGb(trunk_budget) + " (" +
                  std::to_string(pinned.size()) + " layers pinned, " + FormatGb(pinned_bytes) +
                  (ring_slots == 0 ? std::string("; no ring: every layer is pinned")
                                   : "; ring " + std::to_string(ring_slots) + " × " +
                                         FormatGb(ring_slot_bytes) +
                                         ", read ahead by a reader thread") +
                  "), expert cache " +
                  std::to_string(expert_slots) + " slots × " +
                  std::to_string(expert_slot_bytes) + " B (" + CachePolicyName(policy) +
                  "), lm_head " + (lm_head_held ? "held (" + FormatGb(lm_head_bytes) + ")"
                                                  : "streamed through the ring in chunks of " +
                                                        std::to_string(lm_head_chunk_rows) +
                                                        " rows") +
                  ", embedding rows on demand; weights held " + GbBytes(bytes());
  return s;
}

namespace {

// What the plan is made of: the trunk runs (largest first), lm_head and its chunking, the
// largest expert record.
struct Sizes {
  std::vector<prepared::TrunkRun> runs;  // largest first
  uint64_t trunk_all = 0, lm_bytes = 0, row_bytes = 0, cache_all = 0, largest = 0;
  int64_t vocab = 0, row_align = 0, min_chunk_rows = 0;
  uint64_t min_chunk_bytes = 0;
  bool moe = false;
};

Result<Sizes> MeasureSizes(const prepared::PreparedDir& p, StreamingPlan* plan) {
  const ModelConfig& c = p.manifest.config;
  Sizes z;
  z.runs = p.manifest.runs;
  std::stable_sort(z.runs.begin(), z.runs.end(),
                   [](const prepared::TrunkRun& a, const prepared::TrunkRun& b) {
                     return a.length > b.length;
                   });
  for (const prepared::TrunkRun& r : z.runs) z.trunk_all += r.length;
  const prepared::Region* lm = p.manifest.FindRegion(prepared::kLmHeadName);
  if (lm == nullptr || lm->shape.size() != 2 || lm->shape[0] == 0) {
    return Status::Invalid(p.dir + "/k3.json: " + std::string(prepared::kLmHeadName) +
                           " missing or not [vocab_size][hidden_size] (re-run k3prep pack)");
  }
  z.lm_bytes = lm->length;
  z.row_bytes = lm->length / lm->shape[0];
  uint64_t max_expert = 0;
  for (const prepared::ExpertRecord& r : p.experts.records) {
    max_expert = std::max(max_expert, r.length);  // an absent record's length is 0
  }
  plan->expert_slot_bytes = AlignUp(max_expert, 64);
  z.moe = !p.experts.records.empty();
  plan->cache_min = z.moe ? uint64_t(c.topk + 1) * plan->expert_slot_bytes : 0;
  // Everything this directory holds: a share's absent experts are other ranks' to hold. Never
  // below the minimum, so a cache that holds every expert also passes the top-k + 1 rule.
  z.cache_all = std::max(uint64_t(PresentExperts(p)) * plan->expert_slot_bytes, plan->cache_min);
  z.largest = z.runs.empty() ? 0 : AlignUp(z.runs[0].length, 4096);
  // A streamed lm_head goes through the ring in chunks: at least 16 per pass (so no chunk forces
  // a large slot), whole rows, and a row count that keeps chunk offsets 4 KiB-aligned (O_DIRECT).
  z.vocab = static_cast<int64_t>(lm->shape[0]);
  z.row_align = static_cast<int64_t>(4096 / std::gcd(z.row_bytes, uint64_t{4096}));
  z.min_chunk_rows =
      std::min<int64_t>(z.vocab, AlignUp(uint64_t((z.vocab + 15) / 16), uint64_t(z.row_align)));
  z.min_chunk_bytes = AlignUp(uint64_t(z.min_chunk_rows) * z.row_bytes, 4096);
  plan->trunk_min =
      std::min(z.trunk_all + z.lm_bytes, 2 * std::max(z.largest, z.min_chunk_bytes));
  return z;
}

// The total a preset or --budget-gb asks for (nullopt: neither), and the flag that set it.
Result<std::optional<uint64_t>> TotalBudget(const BudgetRequest& req, uint64_t mem_available,
                                            std::string* flag) {
  std::optional<uint64_t> total;
  if (req.preset) {
    if (*req.preset == "auto") {
      total = mem_available / 10 * 8;
    } else {
      for (const BudgetPreset& b : BudgetPresets()) {
        if (*req.preset == b.name) total = GbToBytes(b.gb);
      }
      if (!total) {
        return Status::Invalid("--preset " + *req.preset +
                               ": expected laptop, desktop, workstation, server, max or auto "
                               "(--list-presets shows their budgets)");
      }
    }
    *flag = "--preset " + *req.preset;
  }
  if (req.budget_gb) {
    total = GbToBytes(*req.budget_gb);
    *flag = "--budget-gb";
  }
  return total;
}

// Budgets: a total is split trunk first (re-read every token), the rest to the cache; --trunk-gb
// and --cache-gb override the split. Sets plan->trunk_budget and cache_budget.
Status SplitBudget(const prepared::PreparedDir& p, const BudgetRequest& req,
                   uint64_t mem_available, const Sizes& z, StreamingPlan* plan) {
  const ModelConfig& c = p.manifest.config;
  // Library callers bypass the flags' checks; NaN would pass every comparison below and
  // llround(NaN) is undefined.
  for (const auto& [flag, gb] : {std::pair{"--budget-gb", req.budget_gb},
                                 std::pair{"--trunk-gb", req.trunk_gb},
                                 std::pair{"--cache-gb", req.cache_gb}}) {
    if (gb && !(*gb > 0 && *gb <= kMaxBudgetGb)) {
      return Status::Invalid(std::string(flag) + " " + std::to_string(*gb) +
                             ": a budget must be a finite number of GB in (0, " +
                             std::to_string(static_cast<int64_t>(kMaxBudgetGb)) + "]");
    }
  }
  std::string total_flag;
  K3_ASSIGN_OR_RETURN(std::optional<uint64_t> total,
                      TotalBudget(req, mem_available, &total_flag));
  uint64_t trunk = z.trunk_all + z.lm_bytes, cache = z.cache_all;
  const uint64_t minimum = plan->trunk_min + plan->cache_min + req.reserved;
  if (total) {
    plan->total = *total;
    plan->reserved = req.reserved;
    if (*total < minimum) {
      return Status::Invalid(total_flag + ": a total budget of " + GbBytes(*total) +
                             " is below the minimum " + GbBytes(minimum) + " for " + p.dir +
                             " (trunk: 2 ring slots = " + FormatGb(plan->trunk_min) +
                             "; expert cache: top-k + 1 = " + std::to_string(c.topk + 1) +
                             " slots = " + FormatGb(plan->cache_min) +
                             (req.reserved > 0 ? "; " + req.reserved_what + " = " +
                                                     FormatGb(req.reserved)
                                               : std::string()) +
                             "); give " +
                             (req.budget_gb ? "--budget-gb " + FlagGb(minimum)
                                            : "a larger preset or --budget-gb " + FlagGb(minimum)) +
                             " or more" +
                             (req.reserved > 0 ? ", or reserve fewer positions (--ctx) or rows "
                                                 "per pass (--chunk)"
                                               : ""));
    }
    const uint64_t weights = *total - req.reserved;
    trunk = std::min(z.trunk_all + z.lm_bytes, weights - plan->cache_min);
    cache = weights - trunk;
  }
  if (req.trunk_gb) trunk = GbToBytes(*req.trunk_gb);
  if (req.cache_gb) cache = GbToBytes(*req.cache_gb);
  if (trunk < plan->trunk_min) {
    return Status::Invalid("--trunk-gb: a trunk budget of " + GbBytes(trunk) +
                           " is below the minimum " + GbBytes(plan->trunk_min) +
                           " (a ring of 2 slots, each the larger of the largest trunk run, " +
                           std::to_string(z.largest) + " bytes, and an lm_head chunk, " +
                           std::to_string(z.min_chunk_bytes) + " bytes) for " + p.dir +
                           "; give --trunk-gb " + FlagGb(plan->trunk_min) + " or more");
  }
  if (cache < plan->cache_min) {
    return Status::Invalid("--cache-gb: an expert cache of " + GbBytes(cache) +
                           " is below the minimum " + GbBytes(plan->cache_min) +
                           " (top-k + 1 = " + std::to_string(c.topk + 1) + " slots of " +
                           std::to_string(plan->expert_slot_bytes) + " bytes) for " + p.dir +
                           "; give --cache-gb " + FlagGb(plan->cache_min) + " or more");
  }
  plan->trunk_budget = trunk;
  plan->cache_budget = cache;
  return Status::Ok();
}

// Within the trunk budget: lm_head held or streamed, the pinned layers, the ring.
void PlaceTrunk(const Sizes& z, StreamingPlan* plan) {
  const uint64_t trunk = plan->trunk_budget;
  const std::vector<prepared::TrunkRun>& runs = z.runs;
  // lm_head is trunk-like (read every token): held only when everything else of the trunk fits.
  plan->lm_head_held = trunk >= z.trunk_all + z.lm_bytes;
  const uint64_t layer_budget = plan->lm_head_held ? trunk - z.lm_bytes : trunk;
  // The ring slot when runs [j, end) are streamed: their largest run, or an lm_head chunk.
  auto slot_for = [&](size_t j) {
    const uint64_t run = j < runs.size() ? AlignUp(runs[j].length, 4096) : 0;
    return plan->lm_head_held ? run : std::max(run, z.min_chunk_bytes);
  };
  // Pin the largest runs while the pinned set plus a ring for the rest still fits: a ring of
  // kRingSlots when the budget allows it (two readers keep the disk busy), else of 2 (the
  // minimum). Read-ahead is worth more than the few pinned layers it costs.
  constexpr uint64_t kRingSlots = 4;
  size_t k = 0;
  for (uint64_t ring : {kRingSlots, uint64_t{2}}) {
    uint64_t sum = 0;
    bool found = false;
    for (size_t j = 0; j <= runs.size(); ++j) {
      const uint64_t streamed = runs.size() - j + (plan->lm_head_held ? 0 : 1);
      const uint64_t slots = std::min<uint64_t>(ring, std::max<uint64_t>(streamed, 2));
      if (sum + slots * slot_for(j) <= layer_budget) {
        k = j;
        found = true;
      }
      if (j < runs.size()) sum += runs[j].length;
    }
    if (found) break;
  }
  for (size_t j = 0; j < k; ++j) {
    plan->pinned.push_back(runs[j].layer);
    plan->pinned_bytes += runs[j].length;
  }
  const uint64_t slot = slot_for(k);
  if (slot > 0) {
    // What is left after the pins buys read-ahead: more slots (at most 8, and no more than the
    // items streamed per pass).
    plan->ring_slot_bytes = slot;
    const uint64_t spare =
        layer_budget >= plan->pinned_bytes ? layer_budget - plan->pinned_bytes : 0;
    const uint64_t row_align = uint64_t(z.row_align);
    const uint64_t chunk_rows =
        plan->lm_head_held
            ? 0
            : std::max<uint64_t>(uint64_t(z.min_chunk_rows),
                                 slot / z.row_bytes / row_align * row_align);
    const uint64_t chunks =
        plan->lm_head_held ? 0 : (uint64_t(z.vocab) + chunk_rows - 1) / chunk_rows;
    const uint64_t items = (runs.size() - k) + chunks;
    plan->ring_slots = static_cast<int>(
        std::clamp<uint64_t>(std::min<uint64_t>(spare / slot, items), 2, 8));
    plan->lm_head_chunk_rows =
        static_cast<int64_t>(std::min<uint64_t>(chunk_rows, uint64_t(z.vocab)));
  }
  plan->lm_head_bytes = plan->lm_head_held ? z.lm_bytes : 0;  // a streamed one lives in the ring
}

}  // namespace

Result<StreamingPlan> PlanStreaming(const prepared::PreparedDir& p, const BudgetRequest& req,
                                    uint64_t mem_available) {
  StreamingPlan plan;
  plan.policy = req.policy;
  K3_ASSIGN_OR_RETURN(Sizes z, MeasureSizes(p, &plan));
  BudgetRequest r = req;
  if (req.experts_only) {  // no trunk to hold: the weight budget is all expert cache
    plan.experts_only = true;
    plan.trunk_min = 0;
    z.trunk_all = z.lm_bytes = 0;
    r.trunk_gb.reset();
  }
  K3_RETURN_IF_ERROR(SplitBudget(p, r, mem_available, z, &plan));
  plan.expert_slots =
      z.moe ? static_cast<int>(std::min(plan.cache_budget, z.cache_all) / plan.expert_slot_bytes)
            : 0;
  if (!plan.experts_only) PlaceTrunk(z, &plan);
  return plan;
}

Status CheckPreloadFits(const StreamingPlan& plan, const prepared::PreparedDir& p) {
  const size_t held = PresentExperts(p);
  if (uint64_t(plan.expert_slots) >= held) return Status::Ok();
  return Status::Invalid("--preload: the plan's expert cache holds " +
                         std::to_string(plan.expert_slots) + " of " + std::to_string(held) +
                         " experts" + (p.manifest.share ? " (this rank's share)" : "") +
                         "; preloading needs a budget that holds them all (raise "
                         "--budget-gb or --cache-gb, or use --preset max)");
}

}  // namespace k3::run
