#include "k3run/engine/prompt_cache.h"

#include <algorithm>
#include <utility>

namespace k3::run {

const SequenceSnapshot* PromptCache::Longest(std::span<const int32_t> prompt,
                                             const std::vector<MediaSpan>& media) {
  auto best = lru_.end();
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    const std::vector<int32_t>& t = it->snap.tokens;
    if (t.empty() || t.size() >= prompt.size()) continue;
    if (best != lru_.end() && t.size() <= best->snap.tokens.size()) continue;
    if (std::equal(t.begin(), t.end(), prompt.begin()) &&
        SameMediaPrefix(it->snap.state.media, media, static_cast<int64_t>(t.size()))) {
      best = it;
    }
  }
  if (best == lru_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, best);
  return &lru_.front().snap;
}

const MediaSpan* PromptCache::FindMedia(const Hash128& input) const {
  if (input == Hash128{}) return nullptr;
  for (const Entry& e : lru_) {
    for (const MediaSpan& m : e.snap.state.media) {
      if (m.input == input && m.data != nullptr) return &m;
    }
  }
  return nullptr;
}

void PromptCache::Insert(SequenceSnapshot snap) {
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (it->snap.tokens == snap.tokens &&
        SameMediaPrefix(it->snap.state.media, snap.state.media,
                        static_cast<int64_t>(snap.tokens.size()))) {
      bytes_ -= it->bytes;
      lru_.erase(it);
      break;
    }
  }
  const uint64_t n = snap.bytes();
  if (n > budget_) return;
  lru_.push_front(Entry{std::move(snap), n});
  bytes_ += n;
  while (bytes_ > budget_) {
    bytes_ -= lru_.back().bytes;
    lru_.pop_back();
  }
}

}  // namespace k3::run
