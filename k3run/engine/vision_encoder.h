// The vision part of an engine: the tower and projector weights of vision.bin
// (formats/vision_layout.h) and the rows one image gives (docs/VISION.md).
//
// Goals: open says "no vision" for a text-only prepared directory before anything is read; the
// weights are read once, on the first image, checked against k3.json's hashes (a changed byte
// of vision.bin is kIntegrity naming the tensor), and then kept; Encode runs the tower
// (k3run/vision/vision_tower.h) on preprocessed patches.
// Memory: the weights (vision.bin's size, BF16 as released; ~0.9 GB) plus the tower's scratch
// for the image (VisionScratchBytes) while it runs; the memory plan counts the weights when a
// run may see images (docs/VISION.md "Memory").
// Thread safety: one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/aligned_buffer.h"
#include "common/env.h"
#include "common/status.h"
#include "formats/prepared_manifest.h"
#include "k3run/engine/media.h"
#include "k3run/vision/image_patches.h"
#include "k3run/vision/vision_tower.h"

namespace k3::run {

class VisionEncoder {
 public:
  // kInvalid "no vision" naming the directory when its k3.json has no "vision" (a text-only
  // directory, or one packed with --no-vision). Reads nothing.
  static Result<std::unique_ptr<VisionEncoder>> Open(Env* env, const prepared::PreparedDir& p);

  const vision::VisionDims& dims() const { return dims_; }
  uint64_t weight_bytes() const { return file_bytes_; }  // vision.bin
  bool loaded() const { return buffer_.size() != 0; }
  double load_seconds() const { return load_seconds_; }

  // What a run that may see an image of up to `tokens` rows holds for it: the weights, the
  // tower's scratch for that many patches (4 per row) and the rows themselves.
  uint64_t PlanBytes(int64_t tokens) const { return PlanBytesFor(dims_, file_bytes_, tokens); }
  // The same for any tower: `weight_bytes` its vision.bin.
  static uint64_t PlanBytesFor(const vision::VisionDims& dims, uint64_t weight_bytes,
                               int64_t tokens);

  // Frees the weights (the next Encode reads vision.bin again): a front end that encodes its
  // images before the text weights load gives the memory back to them.
  void Release();
  // The rows alone: what a sequence holds for images of `tokens` rows in all.
  static uint64_t RowBytes(const vision::VisionDims& dims, int64_t tokens) {
    return static_cast<uint64_t>(tokens) * static_cast<uint64_t>(dims.text_hidden) * 4;
  }

  // The image's rows [(gh/2)·(gw/2)][text_hidden] as a span starting at `first`, its id the
  // XXH3-128 of the rows. Reads the weights first if needed. `seconds`: the tower's time.
  Result<MediaSpan> Encode(const vision::ImagePatches& image, int64_t first, double* seconds);

 private:
  VisionEncoder() = default;
  Status Load();

  Env* env_ = nullptr;
  std::string path_;
  std::vector<prepared::Region> regions_;  // vision.bin, canonical order
  uint64_t file_bytes_ = 0;
  vision::VisionDims dims_;
  AlignedBuffer buffer_;                   // vision.bin, whole
  std::vector<std::vector<float>> norms_;  // norm gains widened to fp32
  vision::VisionWeights weights_;
  double load_seconds_ = 0;
};

}  // namespace k3::run
