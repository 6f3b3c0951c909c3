// A bounded LRU map from a Matcher's StateKey to the token mask computed for that state.
// Internal to TokenMasker. Masks are a pure function of the state, so a hit returns exactly the
// mask a cold computation would (TokenMasker's tests check this).
// Thread safety: all methods lock one mutex; masks are shared immutable vectors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace k3::run::grammar {

using MaskBits = std::vector<uint64_t>;

class MaskCache {
 public:
  explicit MaskCache(size_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}

  // The mask for `key`, or null; a hit becomes the most recently used entry.
  std::shared_ptr<const MaskBits> Find(const std::string& key);
  // Inserts (or keeps an equal entry another thread inserted first), then evicts the least
  // recently used entries until the cache fits its capacity.
  void Insert(const std::string& key, std::shared_ptr<const MaskBits> mask);

  struct Stats {
    int64_t hits = 0;
    int64_t misses = 0;
    int64_t entries = 0;
    size_t bytes = 0;
  };
  Stats stats() const;

 private:
  struct Entry {
    std::string key;
    std::shared_ptr<const MaskBits> mask;
  };
  static size_t EntryBytes(const Entry& e) { return e.key.size() + e.mask->size() * 8 + 64; }

  const size_t capacity_bytes_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recent first; guarded by mu_
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;  // guarded by mu_
  size_t bytes_ = 0;                                                   // guarded by mu_
  int64_t hits_ = 0;                                                   // guarded by mu_
  int64_t misses_ = 0;                                                 // guarded by mu_
};

}  // namespace k3::run::grammar
