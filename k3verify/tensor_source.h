// Where a named tensor's bytes are, in a checkpoint directory or in a prepared directory, and
// how to read its hash and sample elements: the lookup behind `k3verify tensors`.
//
// Names are checkpoint names in both cases, so one fixture checks both kinds of directory. A
// prepared directory answers trunk/resident tensors from k3.json's regions and expert
// sub-tensors ("…layers.L.block_sparse_moe.experts.e.w1.weight_packed") through experts.idx.
// An MXFP4 entry "X" covers X.weight_packed (U8 [rows][cols/2]) and X.weight_scale
// (U8 [rows][cols/32]) and its samples are the exact dequantised fp32 values (formats/mxfp4.h).
//
// Thread safety: a TensorDir is immutable after Open; ReadTensor may run on many threads, each
// with its own FileCache.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/hash.h"
#include "common/status.h"
#include "formats/dtype.h"
#include "formats/prepared_manifest.h"
#include "formats/safetensors.h"

namespace k3::verify {

struct TensorPiece {
  std::string path;
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct TensorRef {
  std::string name;
  bool mxfp4 = false;
  DType dtype = DType::kU8;      // raw tensors only
  std::vector<uint64_t> shape;   // MXFP4: the logical [rows, cols]
  std::vector<TensorPiece> pieces;  // raw: one; MXFP4: packed then scale
  uint64_t numel() const;
  uint64_t bytes() const;
};

class TensorDir {
 public:
  // A prepared directory when DIR holds k3.sum or k3.json (opened with OpenPrepared, so its
  // structure is checked first), else a checkpoint (CheckpointIndex::Open).
  static Result<TensorDir> Open(Env* env, const std::string& dir, const std::string& model_dir);

  bool prepared() const { return prepared_.has_value(); }
  const char* kind() const { return prepared() ? "prepared directory" : "checkpoint"; }

  // nullopt when the directory has no such tensor; kInvalid when it has one whose parts do not
  // form what was asked (an MXFP4 pair with inconsistent shapes), or when a share's tensor is an
  // expert another rank's share holds.
  Result<std::optional<TensorRef>> Find(const std::string& name, bool mxfp4) const;
  // Every tensor as --emit records it: language-model and vision tensors (vision.bin in a
  // prepared directory; in a checkpoint, when config.json has a vision_config), MXFP4 pairs as
  // one entry; a share's experts only those it holds. `skipped` counts checkpoint tensors left
  // out.
  std::vector<TensorRef> All(uint64_t* skipped) const;

 private:
  Result<std::optional<TensorRef>> FindPreparedRaw(const std::string& name) const;
  // kInvalid for an expert another rank's share holds (an absent record), naming that rank.
  Result<std::optional<TensorRef>> ExpertRef(int layer, int expert, int sub, bool mxfp4) const;
  Result<std::optional<TensorRef>> CheckpointPair(const std::string& name) const;

  std::optional<st::CheckpointIndex> checkpoint_;
  std::optional<prepared::PreparedDir> prepared_;
  bool checkpoint_vision_ = false;  // a checkpoint whose config.json has a vision_config
};

// Open files for ReadTensor, one cache per thread.
using FileCache = std::map<std::string, std::unique_ptr<File>>;

struct TensorContent {
  Hash128 xxh3_128;           // of the pieces' bytes, concatenated
  std::vector<uint64_t> bits;  // one per requested index (see tensor_fixture.h Sample::bits)
};

// Streams the tensor's bytes once (large reads) for the hash and picks out the elements at
// `indices` (each < ref.numel()). `progress_bytes` is called with each chunk's size.
Result<TensorContent> ReadTensor(Env* env, FileCache* files, const TensorRef& ref,
                                 const std::vector<uint64_t>& indices,
                                 const std::function<void(uint64_t)>& progress_bytes);

}  // namespace k3::verify
