// The scheduler's prompt cache (DESIGN.md §11.5): snapshots of finished sequences (tokens, KDA
// states, latent caches) kept in least-recently-used order within a byte budget, so a request
// that extends a finished one (a chat client re-sending its conversation) feeds only the rest.
// A restored snapshot continues with the bits of never having stopped (Engine::Restore), so a
// hit changes how many rows are fed, never a logit.
// Thread safety: none; the scheduler uses it on the engine thread only.
#pragma once

#include <cstdint>
#include <list>
#include <span>

#include "k3run/engine/session.h"

namespace k3::run {

class PromptCache {
 public:
  explicit PromptCache(uint64_t budget_bytes) : budget_(budget_bytes) {}

  // The longest snapshot whose tokens are a PROPER prefix of `prompt` (at least one prompt id
  // is left to feed, so the request gets the logits of its last prompt row from a pass) and
  // whose images over those tokens are `media`'s (SameMediaPrefix: same positions, rows and id;
  // two prompts with the same ids but other image rows are other inputs); null when none. A hit
  // becomes the most recently used.
  const SequenceSnapshot* Longest(std::span<const int32_t> prompt,
                                  const std::vector<MediaSpan>& media = {});
  // Keeps `snap` as the most recently used, evicting the least recently used until the budget
  // holds; a snapshot larger than the whole budget is not kept. One with the same tokens and
  // images is replaced.
  void Insert(SequenceSnapshot snap);
  // An image span one of the snapshots holds whose tower input is `input` (MediaSpan::input),
  // or null (a zero input never matches). The order of use does not change.
  const MediaSpan* FindMedia(const Hash128& input) const;

  uint64_t bytes() const { return bytes_; }
  size_t size() const { return lru_.size(); }
  uint64_t budget() const { return budget_; }

 private:
  struct Entry {
    SequenceSnapshot snap;
    uint64_t bytes = 0;
  };
  uint64_t budget_;
  uint64_t bytes_ = 0;
  std::list<Entry> lru_;  // front: most recently used
};

}  // namespace k3::run
