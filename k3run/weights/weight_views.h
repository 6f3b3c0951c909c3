// Typed views over prepared-directory bytes, shared by every WeightSource (RamWeights and
// StreamingWeights): where the bytes come from differs, how they are interpreted must not.
//
// Goals: one place that turns a trunk run buffer into ops::LayerWeights, an expert record's bytes
// into ops::GluWeights, and reads embedding rows and the head vectors, with the checks and the
// messages of weights.h. Non-goals: I/O policy (callers own buffers and reads).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/status.h"
#include "formats/prepared_manifest.h"
#include "k3run/ops/weights.h"
#include "k3run/weights/weights.h"

namespace k3::run {

// A trunk layer bound to a run buffer: matrices point into the buffer, small vectors are widened
// into `vecs` (heap buffers never move when the outer vector grows).
struct LayerView {
  std::vector<std::vector<float>> vecs;
  ops::LayerWeights w;
};

// The trunk run of `layer`, or kInvalid naming k3.json.
Result<const prepared::TrunkRun*> FindTrunkRun(const prepared::PreparedDir& p, int layer);

// Binds `run_bytes` (run.length bytes of layer's trunk run, as on disk) into *out, shape-checked.
Status BindLayer(const prepared::PreparedDir& p, const ops::Dims& dims, int layer,
                 const prepared::TrunkRun& run, const uint8_t* run_bytes, LayerView* view);

// Binds an expert record's bytes (rec.length bytes) into *out, checking sub-tensor sizes; with
// `verify`, the bytes' XXH3-64 against experts.idx first (kIntegrity naming file and range).
Status BindExpert(const prepared::PreparedDir& p, const ops::Dims& dims, int layer, int expert,
                  const uint8_t* bytes, bool verify, ops::GluWeights* out);

// out [n][E] = embed_tokens rows, read one row per id from resident.bin; adds bytes to *counter.
Status ReadEmbeddingRows(File* resident, const prepared::PreparedDir& p, const ops::Dims& dims,
                         const int32_t* ids, int64_t n, float* out, uint64_t* counter);

// lm_head's region, checked to be [vocab][hidden] BF16 or F32.
Result<const prepared::Region*> LmHeadRegion(const prepared::PreparedDir& p, const ops::Dims& dims);
Result<kernels::WeightType> LmHeadType(const prepared::Region& r);

// The head vectors, widened; `storage` keeps them alive (3 entries).
Status ReadHead(File* resident, const prepared::PreparedDir& p, const ops::Dims& dims,
                std::vector<std::vector<float>>* storage, HeadWeights* out, uint64_t* counter);

}  // namespace k3::run
