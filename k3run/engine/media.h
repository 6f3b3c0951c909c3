// Image rows in a sequence (docs/VISION.md "Prompt"): the tower's output rows that replace the
// embedding of the <|media_pad|> positions an image's prompt block holds.
//
// A span is bound to POSITIONS, not to pad tokens: one image is exactly `rows` consecutive pads
// starting at `first` (never one pad per image, the known silent bug), and Model::Pass takes
// row p − first for a pad fed at position p inside the span. Pads outside every span keep their
// ordinary embedding row (a generated pad is just a token). Spans are immutable and shared
// (snapshots, the prompt cache): copying a State copies pointers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/hash.h"
#include "common/status.h"

namespace k3::run {

struct MediaSpan {
  int64_t first = 0;  // position of the image's first pad
  int64_t rows = 0;   // pads = rows of `data`
  Hash128 id;         // XXH3-128 of the rows' bytes: the image's identity for the prompt cache
  std::shared_ptr<const std::vector<float>> data;  // [rows][hidden]
  // XXH3-128 of the tower's input (the preprocessed patches and their grid: EncodeImages),
  // known before the tower runs; the tower is deterministic, so equal inputs give equal rows.
  // Zero for rows made otherwise (tests).
  Hash128 input;
};

// Rows the engine already holds for a tower input (MediaSpan::input), or null: what lets an
// image re-sent with a conversation skip the tower (the scheduler looks in its prompt cache).
using MediaLookup = std::function<const MediaSpan*(const Hash128& input)>;

// Encodes a request's images at its admission (Request::encode_media): the spans that replace
// its media, the rows `held` finds bound again instead of running the tower.
using MediaEncoder = std::function<Result<std::vector<MediaSpan>>(const MediaLookup& held)>;

// The spans of a sequence that overlap positions [0, length), in order. Two prefixes with the
// same tokens are the same input only when these agree (same first, rows and id).
bool SameMediaPrefix(const std::vector<MediaSpan>& a, const std::vector<MediaSpan>& b,
                     int64_t length);

}  // namespace k3::run
