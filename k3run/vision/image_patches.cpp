// Padding, normalisation and patchify (image_patches.h).
#include "k3run/vision/image_patches.h"

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
  const float pad = lut[0];

  ImagePatches out;
  out.grid = grid;
  out.patches.resize(size_t{grid.grid_h} * grid.grid_w * kPatchFloats);
  const size_t p = kPatchSize;
  for (size_t gy = 0; gy < grid.grid_h; ++gy) {
    for (size_t gx = 0; gx < grid.grid_w; ++gx) {
      float* patch = &out.patches[(gy * grid.grid_w + gx) * kPatchFloats];
      for (size_t y = 0; y < p; ++y) {
        const size_t iy = gy * p + y;
        for (size_t x = 0; x < p; ++x) {
          const size_t ix = gx * p + x;
          const bool inside = iy < grid.resized_height && ix < grid.resized_width;
          const uint8_t* px = inside ? &rgb[(iy * grid.resized_width + ix) * 3] : nullptr;
          for (size_t c = 0; c < 3; ++c) {
            patch[(c * p + y) * p + x] = inside ? lut[px[c]] : pad;
          }
        }
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
