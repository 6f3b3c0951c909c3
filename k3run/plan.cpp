#include "k3run/plan.h"

#include <cstdio>

namespace k3::run {

MemoryPlan PlanMemory(const ModelConfig& c, int layers, int64_t positions,
                      uint64_t weights_bytes) {
  MemoryPlan p;
  p.positions = positions;
  p.weights_bytes = weights_bytes;
  const uint64_t kv_row =
      (uint64_t(c.n_heads) * uint64_t(c.qk_nope + c.v_head) + uint64_t(c.qk_rope)) * 4;
  const uint64_t P = uint64_t(c.kda_heads) * uint64_t(c.kda_head_dim);
  const uint64_t kda = (P * uint64_t(c.kda_head_dim) + 3 * P * uint64_t(c.conv_k - 1)) * 4;
  for (int L = 0; L < layers; ++L) {
    if (c.is_mla(L)) {
      p.kv_cache_bytes += kv_row * uint64_t(positions);
    } else {
      p.state_bytes += kda;
    }
  }
  return p;
}

std::string FormatGb(uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f GB (%.3f GiB)", double(bytes) / 1e9,
                double(bytes) / double(uint64_t{1} << 30));
  return buf;
}

Status CheckMemory(const MemoryPlan& plan, uint64_t mem_available) {
  if (plan.total() <= mem_available) return Status::Ok();
  return Status::Invalid(
      "memory plan refused: KV cache for " + std::to_string(plan.positions) + " positions " +
      FormatGb(plan.kv_cache_bytes) + " + recurrent state " + FormatGb(plan.state_bytes) +
      " + weights held " + FormatGb(plan.weights_bytes) + " = " + FormatGb(plan.total()) +
      " > MemAvailable " + FormatGb(mem_available) +
      "; lower --gen or shorten the prompt (--ids), or free memory");
}

}  // namespace k3::run
