// Image decoding for the vision input: PNG (libpng) and JPEG (libjpeg) bytes to 8-bit pixels,
// held the way the released preprocessor's Pillow holds them, so that the resize
// (image_resize.h) can treat each kind as Pillow does. docs/VISION.md "Preprocessing".
//
// Goals: decode what the released processor decodes (it opens the bytes with PIL.Image.open and
// keeps the file's own mode until after the resize) with Pillow's pixel values; refuse anything
// else with a Status naming the input and the rule. Non-goals: GIF, WebP, BMP, TIFF (refused as
// "not a PNG or JPEG image"); colour management (gAMA, iCCP and sRGB are ignored, as by Pillow);
// animation (an APNG gives its default image, an MPO its first).
//
// EXIF orientation is NOT applied: the released processor (media_utils._to_pil) calls
// PIL.Image.open without ImageOps.exif_transpose, so the model sees the stored pixels and the
// prompt carries the stored width x height. We follow it.
//
// Format is sniffed from magic bytes (PNG signature, JPEG SOI FF D8 FF), never from a name.
// libpng and libjpeg report errors through longjmp inside this module; nothing exits the process
// and no exception crosses the API (std::bad_alloc is turned into a kIo Status).
//
// Thread safety: every function is reentrant (no shared state).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/env.h"
#include "common/status.h"

namespace k3::vision {

enum class ImageFormat : uint8_t { kPng, kJpeg };
const char* ImageFormatName(ImageFormat format);

// How the decoded pixels are held. Gray is expanded to RGB (Pillow's per-channel resize gives
// the same bytes for L replicated as for L), gray+alpha to RGBA.
enum class PixelLayout : uint8_t {
  kRgb,   // 3 bytes a pixel
  kRgba,  // 4 bytes a pixel, straight (not premultiplied) alpha
  kCmyk,  // 4 bytes a pixel: a 4-component JPEG as Pillow holds it ("CMYK;I": inverted)
};

struct Image {
  uint32_t width = 0;   // as stored in the file (no EXIF rotation)
  uint32_t height = 0;
  PixelLayout layout = PixelLayout::kRgb;
  ImageFormat format = ImageFormat::kPng;
  // Pillow resizes palette ("P") and 1-bit ("1") images with NEAREST whatever filter is asked
  // for; such images carry true here and image_resize.h does the same.
  bool nearest_resize = false;
  // A gray PNG's tRNS colour key as Pillow applies it: after the resize, pixels equal to
  // (key & 0xff) become transparent. -1 when there is none.
  int transparent_gray = -1;
  // (height, width, channels) row-major, channels = 3 (kRgb) or 4 (kRgba, kCmyk).
  std::vector<uint8_t> pixels;

  int channels() const { return layout == PixelLayout::kRgb ? 3 : 4; }
  // Pillow's test in fill_transparent_bg_with: an alpha band or a transparency key.
  bool has_alpha() const { return layout == PixelLayout::kRgba || transparent_gray >= 0; }
};

// Refusals before any pixel is decoded. Each side at most 65,535 (JPEG's own field limit; the
// navit rule never keeps more than 7,168 a side anyway); at most 178,956,970 pixels, the size at
// which Pillow raises DecompressionBombError (2 x Image.MAX_IMAGE_PIXELS), so the released
// processor refuses the same images; that is at most 716 MB of RGBA. The fuzz target lowers it.
struct DecodeLimits {
  uint32_t max_side = 65535;
  uint64_t max_pixels = 178956970;
};

// The largest file ReadImageFile reads (a PNG at the pixel limit, uncompressed, fits).
inline constexpr uint64_t kMaxImageFileBytes = uint64_t{1} << 30;

struct ImageHeader {
  ImageFormat format = ImageFormat::kPng;
  uint32_t width = 0;
  uint32_t height = 0;
};

// Reads only the header (PNG IHDR, JPEG SOF): the size a caller needs to price the image in
// tokens (ComputeNavitGrid) before decoding its pixels. Same errors as DecodeImage for the
// header; a corrupt body is found only by DecodeImage.
Result<ImageHeader> ProbeImage(std::string_view bytes, std::string_view name_for_errors,
                               const DecodeLimits& limits = {});

// Decodes PNG (8/16-bit; gray, gray+alpha, palette with or without tRNS, RGB, RGBA; interlaced
// or not; 16-bit samples keep their high byte, as Pillow's RGB;16B and RGBA;16B unpackers do)
// or baseline/progressive JPEG (gray, YCbCr/RGB, CMYK/YCCK). kInvalid errors, each starting
// with name_for_errors: not a PNG or JPEG image (with its first bytes), truncated data, corrupt
// data (the libpng/libjpeg message), a 0-pixel side, a side or pixel count over `limits`.
Result<Image> DecodeImage(std::string_view bytes, std::string_view name_for_errors,
                          const DecodeLimits& limits = {});

// Reads `path` through `env` (at most kMaxImageFileBytes) and decodes it; errors name the path.
Result<Image> ReadImageFile(const std::string& path, Env* env = Env::Default(),
                            const DecodeLimits& limits = {});

}  // namespace k3::vision
