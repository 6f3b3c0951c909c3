// LRU and S3-FIFO over expert slots (see k3run/stream/expert_cache.h).
#include "k3run/stream/expert_cache.h"

#include <algorithm>
#include <string>

namespace k3::run {

Result<CachePolicy> ParseCachePolicy(std::string_view name) {
  if (name == "lru") return CachePolicy::kLru;
  if (name == "s3fifo") return CachePolicy::kS3Fifo;
  return Status::Invalid("--cache-policy " + std::string(name) + ": expected lru or s3fifo");
}

const char* CachePolicyName(CachePolicy p) { return p == CachePolicy::kLru ? "lru" : "s3fifo"; }

ExpertCache::ExpertCache(int slots, CachePolicy policy) : policy_(policy) {
  const size_t n = static_cast<size_t>(std::max(slots, 0));
  key_.assign(n, 0);
  used_.assign(n, 0);
  pinned_.assign(n, 0);
  last_use_.assign(n, 0);
  freq_.assign(n, 0);
  in_small_.assign(n, 0);
  for (int s = slots - 1; s >= 0; --s) free_.push_back(s);
}

int ExpertCache::Lookup(uint64_t key) {
  auto it = where_.find(key);
  if (it == where_.end()) return -1;
  const size_t s = static_cast<size_t>(it->second);
  last_use_[s] = ++clock_;
  if (freq_[s] < 3) ++freq_[s];
  return it->second;
}

int ExpertCache::Reserve(uint64_t key) {
  int s = -1;
  if (!free_.empty()) {
    s = free_.back();
    free_.pop_back();
  } else {
    s = Victim();
    if (s < 0) return -1;
    ++evictions_;
    where_.erase(key_[static_cast<size_t>(s)]);
  }
  const size_t i = static_cast<size_t>(s);
  key_[i] = key;
  used_[i] = 1;
  pinned_[i] = 1;
  last_use_[i] = ++clock_;
  freq_[i] = 0;
  where_[key] = s;
  if (policy_ == CachePolicy::kS3Fifo) {
    // A key evicted from the small queue recently proved it returns: admit it to main.
    const bool ghost = ghost_.erase(key) > 0;
    in_small_[i] = ghost ? 0 : 1;
    (ghost ? main_ : small_).push_back(s);
  }
  return s;
}

void ExpertCache::Remove(int slot) {
  auto drop = [slot](std::deque<int>* q) {
    q->erase(std::remove(q->begin(), q->end(), slot), q->end());
  };
  drop(&small_);
  drop(&main_);
}

void ExpertCache::Drop(int slot) {
  const size_t i = static_cast<size_t>(slot);
  if (!used_[i]) return;
  where_.erase(key_[i]);
  used_[i] = 0;
  pinned_[i] = 0;
  Remove(slot);
  free_.push_back(slot);
}

void ExpertCache::UnpinAll() { std::fill(pinned_.begin(), pinned_.end(), 0); }

int ExpertCache::Victim() {
  return policy_ == CachePolicy::kLru ? VictimLru() : VictimS3();
}

int ExpertCache::VictimLru() {
  int best = -1;
  for (size_t i = 0; i < key_.size(); ++i) {
    if (!used_[i] || pinned_[i]) continue;
    if (best < 0 || last_use_[i] < last_use_[static_cast<size_t>(best)]) best = static_cast<int>(i);
  }
  return best;
}

int ExpertCache::VictimS3() {
  const size_t small_target = std::max<size_t>(1, key_.size() / 10);
  // Each pass either evicts or moves one entry; pinned entries rotate. The bound covers every
  // entry's frequency draining (≤ 3 reinsertions each) plus one full rotation per queue.
  const size_t bound = 5 * key_.size() + 4;
  for (size_t step = 0; step < bound; ++step) {
    const bool use_small = !small_.empty() && (small_.size() >= small_target || main_.empty());
    std::deque<int>& q = use_small ? small_ : main_;
    if (q.empty()) break;
    const int s = q.front();
    q.pop_front();
    const size_t i = static_cast<size_t>(s);
    if (pinned_[i]) {
      q.push_back(s);
      continue;
    }
    if (use_small) {
      if (freq_[i] > 0) {  // accessed again while in small: promote
        freq_[i] = 0;
        in_small_[i] = 0;
        main_.push_back(s);
        continue;
      }
      ghost_.insert(key_[i]);
      ghost_order_.push_back(key_[i]);
      while (ghost_order_.size() > key_.size()) {
        ghost_.erase(ghost_order_.front());
        ghost_order_.pop_front();
      }
      return s;
    }
    if (freq_[i] > 0) {
      --freq_[i];
      main_.push_back(s);
      continue;
    }
    return s;
  }
  // Only pinned entries in the queue the rule picks (tiny caches): any unpinned slot will do.
  for (size_t i = 0; i < key_.size(); ++i) {
    if (used_[i] && !pinned_[i]) {
      Remove(static_cast<int>(i));
      return static_cast<int>(i);
    }
  }
  return -1;
}

}  // namespace k3::run
