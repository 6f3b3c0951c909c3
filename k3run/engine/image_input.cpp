#include "k3run/engine/image_input.h"

namespace k3::run {

Result<ImageInput> LoadImageFile(Env* env, const std::string& path) {
  K3_ASSIGN_OR_RETURN(vision::Image image, vision::ReadImageFile(path, env));
  K3_ASSIGN_OR_RETURN(vision::ImagePatches patches, vision::PreprocessImage(image));
  return ImageInput{path, std::move(patches)};
}

Result<ImageInput> LoadImageBytes(std::string_view bytes, const std::string& name,
                                  const vision::DecodeLimits& limits) {
  K3_ASSIGN_OR_RETURN(vision::ImagePatches patches,
                      vision::PreprocessImageBytes(bytes, name, limits));
  return ImageInput{name, std::move(patches)};
}

Hash128 TowerInputId(const vision::ImagePatches& patches) {
  const Hash128 values =
      Xxh3_128(patches.patches.data(), patches.patches.size() * sizeof(float));
  const uint64_t words[4] = {patches.grid.grid_h, patches.grid.grid_w, values.high, values.low};
  return Xxh3_128(words, sizeof words);
}

ChatImage ChatImageOf(const ImageInput& image, size_t at) {
  return ChatImage{at, image.patches.grid.original_width, image.patches.grid.original_height,
                   image.tokens()};
}

Result<std::vector<MediaSpan>> EncodeImages(VisionEncoder* encoder, std::span<const int32_t> ids,
                                            int64_t first_pos, int32_t pad,
                                            std::span<const ImageInput> images,
                                            ImageStats* stats, const MediaLookup& reuse) {
  struct Run {
    int64_t begin, length;
  };
  std::vector<Run> runs;
  for (size_t i = 0; i < ids.size();) {
    if (ids[i] != pad) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < ids.size() && ids[j] == pad) ++j;
    runs.push_back(Run{static_cast<int64_t>(i), static_cast<int64_t>(j - i)});
    i = j;
  }
  if (runs.size() != images.size()) {
    return Status::Invalid("internal: the prompt has " + std::to_string(runs.size()) +
                           " runs of <|media_pad|> for " + std::to_string(images.size()) +
                           " images (please report)");
  }
  std::vector<MediaSpan> spans;
  for (size_t k = 0; k < images.size(); ++k) {
    if (runs[k].length != images[k].tokens()) {
      return Status::Invalid("internal: " + images[k].name + " needs " +
                             std::to_string(images[k].tokens()) + " pads, the prompt has " +
                             std::to_string(runs[k].length) + " (please report)");
    }
    const Hash128 input = TowerInputId(images[k].patches);
    const MediaSpan* held = reuse ? reuse(input) : nullptr;
    if (held != nullptr && held->rows == runs[k].length && held->data != nullptr) {
      MediaSpan s = *held;  // the rows and their id, bound at this prompt's run
      s.first = first_pos + runs[k].begin;
      if (stats != nullptr) {
        ++stats->images;
        ++stats->reused;
        stats->tokens += s.rows;
      }
      spans.push_back(std::move(s));
      continue;
    }
    double seconds = 0;
    const bool first_load = !encoder->loaded();
    K3_ASSIGN_OR_RETURN(MediaSpan s,
                        encoder->Encode(images[k].patches, first_pos + runs[k].begin, &seconds));
    s.input = input;
    if (stats != nullptr) {
      ++stats->images;
      stats->tokens += s.rows;
      stats->tower_seconds += seconds;
      if (first_load) stats->load_seconds += encoder->load_seconds();
    }
    spans.push_back(std::move(s));
  }
  return spans;
}

}  // namespace k3::run
