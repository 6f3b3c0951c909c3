#include "k3run/grammar/mask_cache.h"

namespace k3::run::grammar {

std::shared_ptr<const MaskBits> MaskCache::Find(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->mask;
}

void MaskCache::Insert(const std::string& key, std::shared_ptr<const MaskBits> mask) {
  std::lock_guard<std::mutex> lock(mu_);
  if (index_.count(key) != 0) return;
  Entry e{key, std::move(mask)};
  const size_t size = EntryBytes(e);
  if (size > capacity_bytes_) return;
  lru_.push_front(std::move(e));
  index_.emplace(key, lru_.begin());
  bytes_ += size;
  while (bytes_ > capacity_bytes_) {
    const Entry& last = lru_.back();
    bytes_ -= EntryBytes(last);
    index_.erase(last.key);
    lru_.pop_back();
  }
}

MaskCache::Stats MaskCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {hits_, misses_, static_cast<int64_t>(lru_.size()), bytes_};
}

}  // namespace k3::run::grammar
