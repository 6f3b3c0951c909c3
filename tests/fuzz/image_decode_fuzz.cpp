// Fuzz target for image decoding (k3run/vision/image_decode.h): DecodeImage and ProbeImage must
// never crash, leak, exit or allocate without bound on any bytes (the limits below cap a decode
// at 4 MiB of pixels); a decoded image must agree with its probed header and hold exactly
// width x height x channels bytes; every refusal names the input; a small decoded image must
// preprocess into the patch count its grid gives. A violated property aborts, which libFuzzer
// and the replay driver both report as a failure.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "k3run/vision/image_decode.h"
#include "k3run/vision/image_patches.h"

namespace {

void Require(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace k3::vision;
  DecodeLimits limits;
  limits.max_side = 4096;
  limits.max_pixels = uint64_t{1} << 20;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const auto header = ProbeImage(in, "fuzz", limits);
  const auto image = DecodeImage(in, "fuzz", limits);
  if (!header.ok()) {
    Require(header.status().message().rfind("fuzz: ", 0) == 0);
    Require(!image.ok());
  }
  if (!image.ok()) {
    Require(image.status().message().rfind("fuzz: ", 0) == 0);
    return 0;
  }
  Require(header.ok() && header->width == image->width && header->height == image->height);
  Require(image->width >= 1 && image->height >= 1);
  Require(uint64_t{image->width} * image->height <= limits.max_pixels);
  Require(image->pixels.size() ==
          size_t{image->width} * image->height * static_cast<size_t>(image->channels()));
  if (uint64_t{image->width} * image->height <= (1u << 16)) {
    const auto patches = PreprocessImage(*image);
    Require(patches.ok());
    const NavitGrid& g = patches->grid;
    Require(patches->patches.size() == size_t{g.grid_h} * g.grid_w * kPatchFloats);
    Require(g.tokens * 4 == g.grid_h * g.grid_w);
  }
  return 0;
}
