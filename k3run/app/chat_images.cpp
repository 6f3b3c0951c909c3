#include "k3run/app/chat_images.h"

#include <algorithm>

#include "common/hash.h"
#include "k3run/vision/image_decode.h"
#include "k3run/vision/image_patches.h"

namespace k3::run {

Result<ChatImageFile> LoadChatImage(Env* env, const std::string& path) {
  K3_ASSIGN_OR_RETURN(std::string bytes,
                      ReadFileToString(env, path, vision::kMaxImageFileBytes));
  const Hash128 hash = Xxh3_128(bytes.data(), bytes.size());
  K3_ASSIGN_OR_RETURN(ImageInput input, LoadImageBytes(bytes, path));
  ChatImage view = ChatImageOf(input, 0);
  view.path = path;
  view.file_hash = hash.Hex();
  return ChatImageFile{std::move(input), std::move(view)};
}

Result<ImageInput> ReloadChatImage(Env* env, const ChatImage& recorded, const std::string& where) {
  const std::string fix = "; restore the file, or start a new --history";
  if (recorded.path.empty()) {
    return Status::Invalid(where + ": an image without a path cannot be read again" + fix);
  }
  Result<std::string> bytes = ReadFileToString(env, recorded.path, vision::kMaxImageFileBytes);
  if (!bytes.ok()) {
    return Status::Invalid(where + ": the image " + recorded.path + " cannot be read (" +
                           bytes.status().message() + ")" + fix);
  }
  const std::string now = Xxh3_128(bytes->data(), bytes->size()).Hex();
  if (now != recorded.file_hash) {
    return Status::Invalid(where + ": the image " + recorded.path +
                           " changed since it was attached (xxh3 " + recorded.file_hash +
                           ", now " + now + "): the conversation would not be the one the model "
                           "saw" + fix);
  }
  Result<ImageInput> input = LoadImageBytes(*bytes, recorded.path);
  if (!input.ok()) return Status::Invalid(where + ": " + input.status().message());
  const ChatImage again = ChatImageOf(*input, recorded.at);
  if (again.width != recorded.width || again.height != recorded.height ||
      again.tokens != recorded.tokens) {
    return Status::Invalid(where + ": the image " + recorded.path + " gives " +
                           std::to_string(again.width) + "x" + std::to_string(again.height) +
                           ", " + std::to_string(again.tokens) + " tokens; the transcript says " +
                           std::to_string(recorded.width) + "x" + std::to_string(recorded.height) +
                           ", " + std::to_string(recorded.tokens) + fix);
  }
  return input;
}

std::vector<int32_t> ImagePadsOnly(std::span<const int32_t> ids, int32_t content, int32_t pad) {
  std::vector<int32_t> out(ids.begin(), ids.end());
  bool in_block = false;  // the previous id was <|media_content|> or a pad of its run
  for (int32_t& id : out) {
    if (id == pad && !in_block) id = -1;
    in_block = id == content || (id == pad && in_block);
  }
  return out;
}

int64_t CountPadRuns(std::span<const int32_t> ids, int32_t pad) {
  int64_t runs = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    runs += ids[i] == pad && (i == 0 || ids[i - 1] != pad);
  }
  return runs;
}

int64_t ChatImageLimit(int64_t positions) {
  return std::clamp<int64_t>(positions - 1, 1, kChatImageTokens);
}

uint64_t ChatVisionBytes(const VisionEncoder& vision, int64_t positions) {
  const int64_t largest = ChatImageLimit(positions);
  const auto row_bytes = static_cast<uint64_t>(vision.dims().text_hidden) * sizeof(float);
  const uint64_t patch_bytes = uint64_t{4} * vision::kPatchFloats * sizeof(float);  // per row
  const auto rest = static_cast<uint64_t>(std::max<int64_t>(0, positions - largest));
  // PlanBytes(largest): the weights, the scratch and the rows of the largest image.
  return vision.PlanBytes(largest) + rest * row_bytes +
         static_cast<uint64_t>(positions) * patch_bytes;
}

}  // namespace k3::run
