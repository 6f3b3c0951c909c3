// The navit resize of the released Kimi K3 preprocessor (media_utils.navit_resize_image and
// image_to_np with transparent_bg_fill_stage "after_resize"), with Pillow's resampling
// reproduced to the bit. docs/VISION.md "Preprocessing".
//
// Size rule (preprocessor_config.json: patch 14, merge 2, in_patch_limit 65,536,
// patch_limit_on_one_side 512; the spec and every port agree):
//   s = min(1, sqrt(65536 / (max(1, w//14) * max(1, h//14))), 7168/w, 7168/h)   (doubles)
//   new side = min(max(1, int(side * s)), 7168); pad right/bottom to a multiple of 28.
//
// Pixels, as the released processor gets them from Pillow 9.4 (Debian python3-pil):
//   - Image.resize(size, BICUBIC) in the file's own mode: Resample.c's two passes (horizontal,
//     then vertical, each rounding and clipping to 8 bits), bicubic a = -0.5, coefficients in
//     22-bit fixed point. No resize at all when the size is unchanged (Pillow returns a copy).
//   - RGBA (and LA) images are resized premultiplied (Pillow converts to RGBa and back, with
//     its MULDIV255 and (255 * v) / a integer rules). Palette and 1-bit images are resized
//     NEAREST (Pillow forces it for modes P and 1), by Pillow's affine scale walk.
//   - After the resize, an image with alpha is composited onto an 8-px chessboard (white 255
//     where (x/8 + y/8) is even, from the top-left; gray 180 elsewhere) in float32:
//     trunc(a/255 * rgb + (1 - a/255) * bg), as numpy does it in fill_transparent_bg_with.
//     CMYK becomes RGB by Pillow's cmyk2rgb after the resize.
// Deviation: none known for 8-bit sources; 16-bit gray PNGs differ (image_decode.h).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "k3run/vision/image_decode.h"

namespace k3::vision {

inline constexpr uint32_t kPatchSize = 14;
inline constexpr uint32_t kMergeKernel = 2;
inline constexpr uint32_t kInPatchLimit = 65536;
inline constexpr uint32_t kPatchLimitOnOneSide = 512;
inline constexpr uint32_t kMaxResizedSide = kPatchLimitOnOneSide * kPatchSize;  // 7168
inline constexpr uint32_t kPadMultiple = kMergeKernel * kPatchSize;              // 28
inline constexpr uint8_t kChessboardWhite = 255;
inline constexpr uint8_t kChessboardGray = 180;
inline constexpr uint32_t kChessboardSquare = 8;

// Everything the navit rule decides from the original size alone.
struct NavitGrid {
  uint32_t original_width = 0, original_height = 0;
  uint32_t resized_width = 0, resized_height = 0;  // the bicubic target
  uint32_t padded_width = 0, padded_height = 0;    // multiples of 28
  uint32_t grid_w = 0, grid_h = 0;                 // patches: padded / 14
  uint32_t tokens = 0;                             // grid_h * grid_w / 4 (after the 2x2 merge)
};

// The navit rule for a width x height image (each >= 1). Pure: prices an image in tokens from
// ProbeImage's header before any pixel is decoded.
NavitGrid ComputeNavitGrid(uint32_t width, uint32_t height);

// Pillow's Image.resize((out_w, out_h), BICUBIC) of an 8-bit image with `channels` interleaved
// channels (each resampled alone). src is (h, w, channels), dst (out_h, out_w, channels).
void ResizeBicubic8(const uint8_t* src, uint32_t w, uint32_t h, int channels, uint8_t* dst,
                    uint32_t out_w, uint32_t out_h);

// Pillow's NEAREST resize (ImagingScaleAffine), same layout as ResizeBicubic8.
void ResizeNearest8(const uint8_t* src, uint32_t w, uint32_t h, int channels, uint8_t* dst,
                    uint32_t out_w, uint32_t out_h);

// The released processor's resize of `image` to (out_w, out_h) in its own mode, then its
// transparent-background fill: RGB8, (out_h, out_w, 3) row-major.
std::vector<uint8_t> ResizeToRgb(const Image& image, uint32_t out_w, uint32_t out_h);

}  // namespace k3::vision
