#include "k3run/stream/memory_plan.h"

#include <algorithm>
#include <cstdio>

namespace k3::run {

uint64_t ScratchBytes(const ModelConfig& c, int64_t T, int64_t positions) {
  const uint64_t t = uint64_t(std::max<int64_t>(T, 1));
  const uint64_t E = uint64_t(c.hidden), H = uint64_t(c.n_heads);
  const uint64_t blocks = uint64_t(c.n_layers / std::max(c.attn_res_block, 1) + 2);
  const uint64_t head = uint64_t(c.qk_nope + c.qk_rope + c.v_head);
  const uint64_t P = uint64_t(c.kda_heads) * uint64_t(c.kda_head_dim);
  const uint64_t ffn = uint64_t(std::max(c.dense_inter, c.moe_inter * std::max(c.n_shared, 1)));
  const uint64_t per_row =
      E * (blocks + 8)                                           // h, snapshots, norms, outputs
      + H * head * 3 + uint64_t(c.q_lora + c.kv_lora) * 2        // MLA q/k/v and latents
      + H * uint64_t(std::max<int64_t>(positions, 1))            // MLA scores
      + P * 10 + uint64_t(c.kda_heads) * 4                       // KDA projections, gates
      + uint64_t(c.topk) * uint64_t(3 * c.latent + 2 * c.moe_inter) + uint64_t(c.latent) * 3  // MoE
      + ffn * 3;                                                 // dense / shared GLU
  return 4 * (t * per_row + 3 * uint64_t(c.vocab));  // + logits, a head chunk, the sampler copy
}

MemoryPlan PlanMemory(const ModelConfig& c, int layers, int64_t positions,
                      uint64_t weights_bytes, int64_t pass_rows) {
  MemoryPlan p;
  p.positions = positions;
  p.weights_bytes = weights_bytes;
  p.scratch_bytes = ScratchBytes(c, pass_rows, positions);
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
      " + scratch " + FormatGb(plan.scratch_bytes) + " + weights held " + FormatGb(plan.weights_bytes) + " = " + FormatGb(plan.total()) +
      " > MemAvailable " + FormatGb(mem_available) +
      "; lower --gen or shorten the prompt (--ids), or free memory");
}

}  // namespace k3::run
