// Padding, normalisation and patchify (image_patches.h).
#include "k3run/vision/image_patches.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <new>
#include <string>

namespace k3::vision {

float NormalizePixel(uint8_t v) {
  // normalize(): x / 255.0 -> float64, astype(float32); x -= mean and x *= 1/std run in
  // float64 (mean and std_inv are float64 arrays) and store float32. mean 0.5, 1/std 2.0.
  const auto scaled = static_cast<float>(static_cast<double>(v) / 255.0);
  const auto centred = static_cast<float>(static_cast<double>(scaled) - 0.5);
  return static_cast<float>(static_cast<double>(centred) * 2.0);
}

ImagePatches PatchifyRgb(const NavitGrid& grid, const std::vector<uint8_t>& rgb) {
  assert(rgb.size() == size_t{grid.resized_width} * grid.resized_height * 3);
  std::array<float, 256> lut{};
  for (size_t v = 0; v < lut.size(); ++v) lut[v] = NormalizePixel(static_cast<uint8_t>(v));

  ImagePatches out;
  out.grid = grid;
  out.patches.resize(size_t{grid.grid_h} * grid.grid_w * kPatchFloats);
  const size_t p = kPatchSize;
  const size_t width = grid.resized_width;
  // One padded image row at a time: its 14-pixel spans go to row y of each patch in the grid
  // row, channel by channel; pixels right of and below the image are the padding value.
  std::vector<float> row(size_t{grid.padded_width} * 3, lut[0]);
  for (size_t iy = 0; iy < grid.padded_height; ++iy) {
    const size_t gy = iy / p, y = iy % p;
    if (iy < grid.resized_height) {
      const uint8_t* src = &rgb[iy * width * 3];
      for (size_t c = 0; c < 3; ++c) {
        float* plane = &row[c * grid.padded_width];
        for (size_t ix = 0; ix < width; ++ix) plane[ix] = lut[src[ix * 3 + c]];
      }
    } else if (iy == grid.resized_height) {
      std::fill(row.begin(), row.end(), lut[0]);
    }
    for (size_t gx = 0; gx < grid.grid_w; ++gx) {
      float* patch = &out.patches[(gy * grid.grid_w + gx) * kPatchFloats];
      for (size_t c = 0; c < 3; ++c) {
        std::copy_n(&row[c * grid.padded_width + gx * p], p, &patch[(c * p + y) * p]);
      }
    }
  }
  return out;
}

Result<ImagePatches> PreprocessImage(const Image& image) {
  const NavitGrid grid = ComputeNavitGrid(image.width, image.height);
  try {
    const std::vector<uint8_t> rgb = ResizeToRgb(image, grid.resized_width, grid.resized_height);
    return PatchifyRgb(grid, rgb);
  } catch (const std::bad_alloc&) {
    return Status::Io("out of memory preprocessing a " + std::to_string(image.width) + "x" +
                      std::to_string(image.height) + " image (" +
                      std::to_string(grid.grid_h * grid.grid_w) + " patches)");
  }
}

Result<ImagePatches> PreprocessImageBytes(std::string_view bytes, std::string_view name,
                                          const DecodeLimits& limits) {
  K3_ASSIGN_OR_RETURN(Image image, DecodeImage(bytes, name, limits));
  return PreprocessImage(image);
}

}  // namespace k3::vision
