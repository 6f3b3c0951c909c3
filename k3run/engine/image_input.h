// Images from a front end to the rows of a sequence (docs/VISION.md "Prompt"): read and
// preprocess a file or bytes, describe it to the chat template (ChatImage), and after the prompt
// is rendered, encode each image into the span of pads the template gave it.
//
// Bad input is refused before any pass: a file that is not a PNG or JPEG, truncated, 0-pixel,
// too large (k3run/vision/image_decode.h), more tokens than a limit; each message names the
// image. The k-th run of pads in the ids fed is the k-th image; a run whose length is not the
// image's token count is a bug (kInvalid "internal"), never a silent shift.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/env.h"
#include "common/status.h"
#include "k3run/engine/media.h"
#include "k3run/engine/vision_encoder.h"
#include "k3run/text/chat_template.h"
#include "k3run/vision/image_patches.h"

namespace k3::run {

struct ImageInput {
  std::string name;  // the file, or "image N" of a request: what messages call it
  vision::ImagePatches patches;
  int64_t tokens() const { return patches.grid.tokens; }
};

// Reads, decodes and preprocesses; kInvalid naming the image. `limits`: the decoder's
// (a server lowers them for untrusted bytes).
Result<ImageInput> LoadImageFile(Env* env, const std::string& path);
Result<ImageInput> LoadImageBytes(std::string_view bytes, const std::string& name,
                                  const vision::DecodeLimits& limits = {});

// The template's view of the image, placed at byte `at` of its message.
ChatImage ChatImageOf(const ImageInput& image, size_t at);

// Tower time and rows of the images of one prompt (for the report).
struct ImageStats {
  int64_t images = 0;
  int64_t tokens = 0;          // rows = pads
  double tower_seconds = 0;    // the towers' time
  int64_t reused = 0;          // of `images`, whose rows were held already (no tower run)
  double load_seconds = 0;     // reading vision.bin (first image only)
};

// The tower input's identity (MediaSpan::input): XXH3-128 over the patches' grid and values.
Hash128 TowerInputId(const vision::ImagePatches& patches);

// `ids` are the rows about to be fed, ids[0] at sequence position `first_pos`. Finds the runs of
// `pad` in them, checks there is one per image with the image's token count, and encodes each
// image into a span at its run. kInvalid naming the image on a mismatch. `reuse` (may be empty):
// rows already held for an image's tower input are bound again instead of running the tower
// (the same bits: the tower is deterministic).
Result<std::vector<MediaSpan>> EncodeImages(VisionEncoder* encoder, std::span<const int32_t> ids,
                                            int64_t first_pos, int32_t pad,
                                            std::span<const ImageInput> images,
                                            ImageStats* stats, const MediaLookup& reuse = {});

}  // namespace k3::run
