#include "k3run/stream/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "k3run/kernels/thread_scratch.h"
#include "k3run/ops/mla.h"

namespace k3::run {

uint64_t ScratchBytes(const ModelConfig& c, int64_t T, int64_t positions, int threads) {
  const uint64_t t = uint64_t(std::max<int64_t>(T, 1));
  const uint64_t E = uint64_t(c.hidden), H = uint64_t(c.n_heads);
  const uint64_t blocks = uint64_t(c.n_layers / std::max(c.attn_res_block, 1) + 2);
  const uint64_t qk = uint64_t(c.qk_nope + c.qk_rope), lat = uint64_t(c.kv_lora);
  const uint64_t P = uint64_t(c.kda_heads) * uint64_t(c.kda_head_dim);
  // MLA's steps 3–5 per thread: a unit of at most kMlaUnitQueries queries (ops/mla.h)
  const uint64_t group = uint64_t(ops::kMlaUnitQueries);
  const uint64_t ffn = uint64_t(std::max(c.dense_inter, c.moe_inter * std::max(c.n_shared, 1)));
  const uint64_t per_row =
      E * (blocks + 8)                                           // h, snapshots, norms, outputs
      + H * (qk + 2 * lat + 3 * uint64_t(c.v_head))              // MLA q, q̃, ō, o, gate
      + uint64_t(c.q_lora) + lat + uint64_t(c.qk_rope + c.qk_nope)  // MLA latents
      + P * 10 + uint64_t(c.kda_heads) * 4                       // KDA projections, gates
      + uint64_t(c.topk) * uint64_t(3 * c.latent + 2 * c.moe_inter) + uint64_t(c.latent) * 3  // MoE
      + ffn * 3;                                                 // dense / shared GLU
  // Per thread, kept by the MatMul bodies (kernels/thread_scratch.h): the expert matrices'
  // widest row, counted whether or not the experts are MXFP4.
  const uint64_t kernel_kept =
      uint64_t(kernels::MatMulThreadScratchBytes(std::max(c.latent, c.moe_inter)));
  const uint64_t per_pass =
      uint64_t(std::max(threads, 1)) * group *  // per thread, a unit's scores and
          (uint64_t(std::max<int64_t>(positions, 1)) + 2 * uint64_t(ops::kMlaKeyBlock) +
           lat + uint64_t(c.qk_rope))  // sums and queries
      + H * lat * uint64_t(c.qk_nope)                             // W_UK transposed (fp32 bound)
      + 3 * uint64_t(c.vocab)                                     // logits, a head chunk, sampler
      + uint64_t(std::max(threads, 1)) * kernel_kept / 4;         // the MatMul bodies' own
  return 4 * (t * per_row + per_pass);
}

int64_t LargestChunk(const ModelConfig& c, uint64_t room, int64_t positions, int threads,
                     int64_t max_rows) {
  if (max_rows < 1 || ScratchBytes(c, 1, positions, threads) > room) return 0;
  int64_t lo = 1, hi = max_rows;  // ScratchBytes grows with T: the largest fitting T
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (ScratchBytes(c, mid, positions, threads) <= room) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

MemoryPlan PlanMemory(const ModelConfig& c, int layers, int64_t positions,
                      uint64_t weights_bytes, int64_t chunk, int threads, int64_t sequences,
                      int64_t spec_rows) {
  MemoryPlan p;
  p.positions = positions;
  p.chunk = std::max<int64_t>(chunk, 1);
  p.sequences = std::max<int64_t>(sequences, 1);
  p.spec_rows = std::max<int64_t>(spec_rows, 0);
  p.weights_bytes = weights_bytes;
  p.scratch_bytes = ScratchBytes(c, p.chunk, positions, threads);
  const uint64_t kv_row = uint64_t(c.kv_lora + c.qk_rope) * 4;  // the latent cache (ops/mla.h)
  const uint64_t P = uint64_t(c.kda_heads) * uint64_t(c.kda_head_dim);
  const uint64_t kda = (P * uint64_t(c.kda_head_dim) + 3 * P * uint64_t(c.conv_k - 1)) * 4;
  // ops::KdaRecords::FloatsPerRow: q, k, v, α and the three raw conv inputs, and β per head.
  const uint64_t record_row = (7 * P + uint64_t(c.kda_heads)) * 4;
  const auto n = uint64_t(p.sequences);
  uint64_t kda_layers = 0;
  for (int L = 0; L < layers; ++L) {
    if (c.is_mla(L)) {
      p.kv_cache_bytes += n * kv_row * uint64_t(positions);
      p.kv_position_bytes += kv_row;
    } else {
      p.state_bytes += n * kda;
      ++kda_layers;
    }
  }
  if (p.spec_rows > 0 && kda_layers > 0) {
    p.record_bytes = n * kda_layers * uint64_t(p.spec_rows + 1) * record_row + kda;
  }
  return p;
}

std::string MemoryPlan::Describe() const {
  const std::string seqs = sequences > 1 ? " (" + std::to_string(sequences) + " sequences)" : "";
  return "weights held " + FormatGb(weights_bytes) + " + latent caches " +
         FormatGb(kv_cache_bytes) + " for " + std::to_string(positions) +
         " positions" + seqs + GrowthNote() + " + KDA states " + FormatGb(state_bytes) +
         (vision_bytes > 0 ? " + vision tower " + FormatGb(vision_bytes) : std::string()) +
         (record_bytes > 0 ? " + speculation records " + FormatGb(record_bytes) + " for " +
                                 std::to_string(spec_rows + 1) + "-row drafts"
                           : std::string()) +
         " + scratch " +
         FormatGb(scratch_bytes) + " for passes of up to " + std::to_string(chunk) +
         " rows = " + FormatGb(total()) +
         (budget > 0 ? " of a " + FormatGb(budget) + " budget" : std::string());
}

std::string MemoryPlan::GrowthNote() const {
  if (kv_position_bytes == 0) return "";
  char buf[96];
  std::snprintf(buf, sizeof buf, " (committed as the context grows: %.1f KB per position%s)",
                double(kv_position_bytes) / 1e3, sequences > 1 ? " and sequence" : "");
  return buf;
}

std::string FormatGb(uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f GB (%.3f GiB)", double(bytes) / 1e9,
                double(bytes) / double(uint64_t{1} << 30));
  return buf;
}

Status CheckMemory(const MemoryPlan& plan, uint64_t mem_available) {
  if (plan.total() <= mem_available) return Status::Ok();
  return Status::Invalid("memory plan refused: " + plan.Describe() + " > MemAvailable " +
                         FormatGb(mem_available) +
                         "; reserve fewer positions (--ctx, or a shorter prompt and --gen), "
                         "fewer rows per pass (--chunk), a smaller budget, or free memory");
}

}  // namespace k3::run
