// From pixels to the tower's input: the navit resize (image_resize.h), black padding to
// multiples of 28, normalisation and patchify, as the released processor does
// (media_utils.image_to_np, np.pad, normalize, navit_patchify). docs/VISION.md "Preprocessing".
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "k3run/vision/image_decode.h"
#include "k3run/vision/image_resize.h"

namespace k3::vision {

inline constexpr uint32_t kPatchFloats = 3 * kPatchSize * kPatchSize;  // 588

struct ImagePatches {
  NavitGrid grid;  // original, resized and padded sizes, grid_h x grid_w patches, tokens
  // (grid_h * grid_w, 3, 14, 14) float32: patches row-major over (grid_h, grid_w), each
  // channel-major (c, y, x); value = (v / 255 - 0.5) / 0.5 for the 8-bit RGB value v
  // (padding is v = 0, i.e. -1).
  std::vector<float> patches;
};

// The normalised value of an 8-bit sample, computed as numpy does it (x / 255.0 in float64,
// cast to float32, then - 0.5 and * 2.0 in float64 cast back): bit-identical to the reference.
float NormalizePixel(uint8_t v);

// RGB8 (grid.resized_height, grid.resized_width, 3) to patches: pads with black, normalises and
// patchifies. rgb must hold exactly resized_width * resized_height * 3 bytes.
ImagePatches PatchifyRgb(const NavitGrid& grid, const std::vector<uint8_t>& rgb);

// The whole preprocessing of a decoded image: ComputeNavitGrid, ResizeToRgb, PatchifyRgb.
// kIo when memory runs out (at most ~160 MB of patches: 65,536 patches of 588 floats).
Result<ImagePatches> PreprocessImage(const Image& image);

// DecodeImage then PreprocessImage; errors are DecodeImage's.
Result<ImagePatches> PreprocessImageBytes(std::string_view bytes, std::string_view name,
                                          const DecodeLimits& limits = {});

}  // namespace k3::vision
