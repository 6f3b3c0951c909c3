#include "k3prep/doctor/budget.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/align.h"
#include "formats/safetensors.h"
#include "k3prep/synth/presets.h"

namespace k3::prep {

const std::vector<RunPreset>& RunPresets() {
  // Same order and values as k3run/stream/streaming_plan.cpp BudgetPresets().
  static const std::vector<RunPreset> presets = {
      {"laptop", 8}, {"desktop", 32}, {"workstation", 96}, {"server", 128}, {"max", 224}};
  return presets;
}

const RunPreset* LargestPresetWithin(uint64_t bytes, uint64_t at_least) {
  const RunPreset* best = nullptr;
  for (const RunPreset& p : RunPresets()) {
    const auto b = static_cast<uint64_t>(std::llround(p.gb * 1e9));
    if (b <= bytes && b >= at_least) best = &p;
  }
  return best;
}

BudgetFloor FloorOf(const std::vector<prepared::TrunkRun>& runs, uint64_t largest_expert, int topk,
                    bool has_experts) {
  BudgetFloor f;
  uint64_t all = 0;
  for (const prepared::TrunkRun& r : runs) {
    all += r.length;
    f.largest_run = std::max(f.largest_run, r.length);
  }
  f.trunk_min = std::min(all, 2 * AlignUp(f.largest_run, 4096));
  f.largest_expert = has_experts ? largest_expert : 0;
  f.cache_min = has_experts ? uint64_t(std::max(topk, 0) + 1) * AlignUp(largest_expert, 64) : 0;
  return f;
}

BudgetFloor FloorOfLayout(const prepared::Layout& layout, const ModelConfig& c) {
  return FloorOf(layout.runs, prepared::ExpertBytes(c), c.topk,
                 c.n_moe_layers() > 0 && c.n_experts > 0);
}

Result<prepared::Layout> LayoutFromConfig(const ModelConfig& c) {
  std::vector<prepared::TensorSpec> tensors;
  auto add = [&](const std::vector<prepared::ExpectedTensor>& list) {
    for (const prepared::ExpectedTensor& t : list) {
      if (t.optional) continue;
      prepared::TensorSpec s;
      s.name = t.name;
      s.dtype = DType::kBF16;
      s.shape = t.shapes.empty() ? std::vector<uint64_t>{t.min_len} : t.shapes.front();
      tensors.push_back(std::move(s));
    }
  };
  for (int L = 0; L < c.n_layers; ++L) add(prepared::ExpectedLayerTensors(c, L));
  add(prepared::ExpectedResidentTensors(c));
  return prepared::BuildLayout(c, tensors, /*require_experts=*/false);
}

Result<BudgetFloor> FloorFromConfig(const ModelConfig& c) {
  K3_ASSIGN_OR_RETURN(prepared::Layout layout, LayoutFromConfig(c));
  return FloorOfLayout(layout, c);
}

Result<prepared::Layout> LayoutFromCheckpoint(Env* env, const std::string& dir,
                                              const ModelConfig& c) {
  K3_ASSIGN_OR_RETURN(st::CheckpointIndex index, st::CheckpointIndex::Open(env, dir));
  return prepared::BuildLayout(c, prepared::TensorsOf(index));
}

Result<BudgetFloor> FloorFromCheckpoint(Env* env, const std::string& dir, const ModelConfig& c) {
  K3_ASSIGN_OR_RETURN(prepared::Layout layout, LayoutFromCheckpoint(env, dir, c));
  return FloorOfLayout(layout, c);
}

std::optional<SynthFit> LargestSynthPresetWithin(uint64_t bytes) {
  std::optional<SynthFit> best;
  for (const char* name : {"tiny", "small", "bench"}) {
    Result<ModelConfig> c = synth::PresetConfig(name);
    if (!c.ok()) continue;
    Result<BudgetFloor> f = FloorFromConfig(*c);
    if (f.ok() && f->total() <= bytes) best = SynthFit{name, *f};
  }
  return best;
}

std::string DecimalGb(uint64_t bytes) {
  char buf[48];
  // Synthetic models' floors are megabytes: "0.00 GB" would say nothing.
  if (bytes < 100'000'000) {
    std::snprintf(buf, sizeof buf, "%.2f MB", double(bytes) / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GB", double(bytes) / 1e9);
  }
  return buf;
}

std::string BudgetFlagGb(uint64_t bytes) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3f", std::floor(double(bytes) / 1e6) / 1e3);
  return buf;
}

}  // namespace k3::prep
