// Images in the chat REPL (docs/VISION.md "CLI and chat"): `/image FILE` reads and checks a file
// at once; the transcript (--history) keeps its path, original size, token count and the
// XXH3-128 of its bytes, so a resumed chat re-reads it and refuses a file that is gone or whose
// bytes changed; the chat's memory rule for the tower.
//
// Goals: the bytes hashed are the bytes decoded (one read); a resumed chat renders exactly the
// ids it rendered before, or refuses naming the file. Non-goals: copying images into the
// transcript (a transcript stays small and text), fetching anything remote.
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/status.h"
#include "k3run/engine/image_input.h"
#include "k3run/engine/vision_encoder.h"
#include "k3run/text/chat_template.h"

namespace k3::run {

// An image waiting in the chat, or held with its message: the preprocessed patches (to encode
// it, and again whenever the chat re-feeds from scratch) and the template's view of it, placed
// before the message's text (at 0), with its path and file hash.
struct ChatImageFile {
  ImageInput input;
  ChatImage view;
};

// Reads `path` once (at most vision::kMaxImageFileBytes), hashes those bytes, preprocesses them.
// kInvalid / kNotFound naming the file.
Result<ChatImageFile> LoadChatImage(Env* env, const std::string& path);

// The image a transcript recorded, read again: kInvalid naming `where` and the file when it is
// missing or unreadable, when its bytes changed since it was attached (hash), or when it no
// longer gives the recorded size and tokens.
Result<ImageInput> ReloadChatImage(Env* env, const ChatImage& recorded, const std::string& where);

// `ids` with every <|media_pad|> that does not belong to an image block (a run right after
// <|media_content|>) replaced by -1: a pad the model generated is a token, not an image, and
// must not shift the images' runs (EncodeImages takes the k-th run as the k-th image).
std::vector<int32_t> ImagePadsOnly(std::span<const int32_t> ids, int32_t content, int32_t pad);
// The runs of `pad` in `ids` (after ImagePadsOnly: the images).
int64_t CountPadRuns(std::span<const int32_t> ids, int32_t pad);

// The memory rule of a chat on a prepared directory with vision: the tower is counted whether
// or not the chat ever sees an image (docs/VISION.md "CLI and chat"). For a context of
// `positions`: the weights, the tower's scratch for the largest image the chat accepts
// (min(positions − 1, kChatImageTokens) rows), and for every position the rows an image may
// leave there (text_hidden floats) and the patches the chat keeps to re-encode it (4 × 588).
inline constexpr int64_t kChatImageTokens = 17408;  // above any image's tokens (about 17,000)
uint64_t ChatVisionBytes(const VisionEncoder& vision, int64_t positions);
// The largest image a chat of `positions` accepts (the rule above).
int64_t ChatImageLimit(int64_t positions);

}  // namespace k3::run
