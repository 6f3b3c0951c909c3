// Generation pipeline of `k3prep synth`: weights are generated in chunks (all cores, OpenMP) on a
// producer thread while the calling thread consumes the previous chunk (writes it), so the disk
// and the generator overlap and the slower one sets the pace.
//
// Memory: at most kChunksInFlight chunks of about `chunk_bytes` exist at once (never more than
// one layer's tensors when chunk_bytes is below a layer's size). Output order and bytes never
// depend on the thread count: each job is generated independently (k3prep/synth/weights.h) into its
// fixed place in the chunk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/status.h"
#include "k3prep/synth/layout.h"
#include "k3prep/synth/weights.h"

namespace k3::synth {

struct Chunk {
  size_t shard = 0;
  bool last_in_shard = false;
  int layer = -1;              // layer of the chunk's first tensor (−1: model-level)
  std::vector<uint8_t> data;   // consecutive bytes of the shard's data section
};

inline constexpr size_t kChunksInFlight = 2;
inline constexpr uint64_t kDefaultChunkBytes = 32ull << 20;
inline constexpr uint64_t kMaxJobBytes = 2ull << 20;

// Generates shards [shard_begin, shard_end) chunk by chunk and calls `sink` for each chunk in
// file order on the calling thread. Stops at the first failing sink call and returns its Status.
Status RunPipeline(const Layout& layout, const WeightGenerator& gen, size_t shard_begin,
                   size_t shard_end, uint64_t chunk_bytes,
                   const std::function<Status(const Chunk&)>& sink);

}  // namespace k3::synth
