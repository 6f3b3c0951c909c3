// Images in server requests (docs/SERVER.md "Images"): the data URLs of a chat request's image
// parts decoded, checked against the server's limits and placed in their messages, and the
// encoding of their rows at admission.
//
// Bounds (what a hostile body can make the server hold): the body is at most kMaxBodyBytes
// (4 MiB), so an image's bytes are at most 3 MiB; each image's size is read from its header
// (ProbeImage) and priced in tokens (ComputeNavitGrid) before any pixel is decoded, and the
// request is refused when its images need more than --max-image-tokens; pixels are decoded
// under ImageLimits (kImagePixelsPerToken per allowed token, at most Pillow's limit) one image
// at a time (ServerVision::decode_mu), so the transient pixel buffer is one image's.
// Tower: encoding runs at admission on the engine thread (Request::encode_media): the tower
// drives the compute threads, which only that thread may; every other request waits for it
// (seconds at released dims) as it waits for a pass.
// Thread safety: LoadRequestImages from any worker (the decode is serialised); the encoder
// returned by MediaEncoderFor runs on the engine thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "k3run/engine/image_input.h"
#include "k3run/engine/media.h"
#include "k3run/engine/vision_encoder.h"
#include "k3run/serve/openai_request.h"
#include "k3run/vision/image_decode.h"

namespace k3::run {

// --max-image-tokens default: one image of the released processor's largest (in_patch_limit
// 65,536 patches, padded to 28 px: under 17,000 tokens), or several smaller ones.
inline constexpr int64_t kDefaultMaxImageTokens = 17408;
// Decoded pixels allowed per allowed image token: a token is 28x28 = 784 resized pixels, and an
// original may be up to 4x that (2x a side) before the navit resize shrinks it: 17,408 tokens
// allow 54.6 Mpixel (218 MB as RGBA, transient), instead of Pillow's 179 Mpixel.
inline constexpr uint64_t kImagePixelsPerToken = 4 * 784;

// The vision part of a server: the encoder (null on a text-only directory, with the reason),
// the per-request token limit and the decoder's limits.
struct ServerVision {
  VisionEncoder* encoder = nullptr;  // engine thread only (MediaEncoderFor)
  std::string no_vision;             // VisionEncoder::Open's message when encoder is null
  int64_t max_tokens = kDefaultMaxImageTokens;
  vision::DecodeLimits limits;       // ImageLimits(max_tokens)
  std::mutex decode_mu;              // one decode at a time
};

vision::DecodeLimits ImageLimits(int64_t max_tokens);

// The bytes of a data URL "data:image/<type>[;param...];base64,<payload>" (strict base64,
// padding optional); false with *why naming the rule otherwise.
bool DecodeDataUrl(std::string_view url, std::string* bytes, std::string* why);

// Decodes every image part of `r` into `images` (in order) and adds each as a ChatImage to its
// message at its byte offset. false with a 400 naming the image ("image 2 of message 1: ...")
// for no vision, a malformed data URL, bad base64, bytes that are not a PNG or JPEG, a
// truncated or corrupt image, or images over the token limit.
bool LoadRequestImages(ServerVision& v, ApiRequest* r, std::vector<ImageInput>* images,
                       ApiError* error);

// Request::encode_media for a prompt whose pads hold `images`: runs the tower (engine thread) on
// each whose rows the scheduler does not hold already, and binds the rows to its run of pads.
// `stats` (may be null; must outlive the call): images, tokens, tower and vision.bin read time,
// for the request's log line.
MediaEncoder MediaEncoderFor(
    VisionEncoder* encoder, int32_t pad, std::vector<int32_t> prompt,
    std::vector<ImageInput> images, std::shared_ptr<ImageStats> stats = nullptr);

}  // namespace k3::run
