#include "k3run/serve/server_images.h"

#include <algorithm>
#include <array>

#include "k3run/vision/image_resize.h"

namespace k3::run {
namespace {

std::string ImageName(const ApiImagePart& p) {
  return "image " + std::to_string(p.index) + " of message " + std::to_string(p.message + 1);
}

ApiError ImageError(const ApiImagePart& p, const std::string& what, std::string code = "") {
  return BadRequest(ImageName(p) + ": " + what,
                    "messages[" + std::to_string(p.message) + "].content", std::move(code));
}

// The decoder's own messages start with the name it was given; the request's name says it.
std::string Reason(const Status& s, const std::string& name) {
  std::string m = s.message();
  if (m.rfind(name + ": ", 0) == 0) m = m.substr(name.size() + 2);
  return m;
}

}  // namespace

vision::DecodeLimits ImageLimits(int64_t max_tokens) {
  vision::DecodeLimits l;
  const uint64_t want = static_cast<uint64_t>(std::max<int64_t>(max_tokens, 1)) *
                        kImagePixelsPerToken;
  l.max_pixels = std::min(l.max_pixels, want);
  return l;
}

bool DecodeDataUrl(std::string_view url, std::string* bytes, std::string* why) {
  constexpr std::string_view kData = "data:";
  if (url.substr(0, kData.size()) != kData) {
    *why = "not a data URL (expected data:image/png;base64,... or data:image/jpeg;base64,...)";
    return false;
  }
  const size_t comma = url.find(',');
  if (comma == std::string_view::npos) {
    *why = "malformed data URL: no ',' before the data";
    return false;
  }
  const std::string_view head = url.substr(kData.size(), comma - kData.size());
  if (head.substr(0, 6) != "image/") {
    *why = "data URL of type '" + std::string(head.substr(0, head.find(';'))) +
           "': expected image/png or image/jpeg";
    return false;
  }
  if (head.size() < 7 || head.substr(head.size() - 7) != ";base64") {
    *why = "malformed data URL: the data must be base64 (data:image/...;base64,...)";
    return false;
  }
  std::string_view b64 = url.substr(comma + 1);
  size_t pad = 0;
  while (!b64.empty() && b64.back() == '=' && pad < 2) {
    b64.remove_suffix(1);
    ++pad;
  }
  if (b64.size() % 4 == 1 || (pad > 0 && (b64.size() + pad) % 4 != 0)) {
    *why = "bad base64: " + std::to_string(b64.size() + pad) + " characters is not a whole "
           "number of bytes";
    return false;
  }
  std::array<int8_t, 256> value;
  value.fill(-1);
  const std::string_view alphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (size_t i = 0; i < alphabet.size(); ++i) {
    value[static_cast<unsigned char>(alphabet[i])] = static_cast<int8_t>(i);
  }
  bytes->clear();
  bytes->reserve(b64.size() / 4 * 3 + 2);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < b64.size(); ++i) {
    const int8_t v = value[static_cast<unsigned char>(b64[i])];
    if (v < 0) {
      *why = "bad base64: character " + std::to_string(i + 1) + " of the data is not in the "
             "base64 alphabet";
      return false;
    }
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes->push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  if (bytes->empty()) {
    *why = "the data URL holds no data";
    return false;
  }
  return true;
}

bool LoadRequestImages(ServerVision& v, ApiRequest* r, std::vector<ImageInput>* images,
                       ApiError* error) {
  int64_t total = 0;
  for (const ApiImagePart& p : r->images) {
    const std::string name = ImageName(p);
    if (v.encoder == nullptr) {
      *error = ImageError(p, "no vision: " + v.no_vision, "no_vision");
      return false;
    }
    std::string bytes, why;
    if (!DecodeDataUrl(p.url, &bytes, &why)) {
      *error = ImageError(p, why);
      return false;
    }
    // Priced from the header before any pixel is decoded.
    Result<vision::ImageHeader> h = vision::ProbeImage(bytes, name, v.limits);
    if (!h.ok()) {
      *error = ImageError(p, Reason(h.status(), name));
      return false;
    }
    const int64_t tokens = vision::ComputeNavitGrid(h->width, h->height).tokens;
    total += tokens;
    if (total > v.max_tokens) {
      *error = ImageError(p, "a " + std::to_string(h->width) + "x" + std::to_string(h->height) +
                                 " image needs " + std::to_string(tokens) + " tokens, and the "
                                 "request's images " + std::to_string(total) + ": more than "
                                 "the server's limit of " + std::to_string(v.max_tokens) +
                                 " image tokens per request (--max-image-tokens); send smaller "
                                 "or fewer images", "image_tokens_exceeded");
      return false;
    }
    Result<ImageInput> image = [&] {
      std::lock_guard<std::mutex> l(v.decode_mu);
      return LoadImageBytes(bytes, name, v.limits);
    }();
    if (!image.ok()) {
      *error = ImageError(p, Reason(image.status(), name));
      return false;
    }
    r->messages[p.message].images.push_back(ChatImageOf(*image, p.at));
    images->push_back(std::move(image).value());
  }
  return true;
}

MediaEncoder MediaEncoderFor(
    VisionEncoder* encoder, int32_t pad, std::vector<int32_t> prompt,
    std::vector<ImageInput> images, std::shared_ptr<ImageStats> stats) {
  auto held = std::make_shared<std::pair<std::vector<int32_t>, std::vector<ImageInput>>>(
      std::move(prompt), std::move(images));
  return [encoder, pad, held, stats](const MediaLookup& rows) -> Result<std::vector<MediaSpan>> {
    Result<std::vector<MediaSpan>> spans =
        EncodeImages(encoder, held->first, 0, pad, held->second, stats.get(), rows);
    held->second.clear();  // the patches are not needed once the rows exist
    held->second.shrink_to_fit();
    return spans;
  };
}

}  // namespace k3::run
