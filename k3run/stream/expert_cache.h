// ExpertCache: which routed expert sits in which slot of the expert arena, and which slot to give
// up next (DESIGN.md §7 "Weight streaming", Experts). No I/O and no bytes: StreamingWeights owns
// the arena and the reads; this class only decides.
//
// Goals: LRU or S3-FIFO (Yang et al., SOSP'23: a small FIFO of ~10 % of the slots for new
// entries, a main FIFO with a 2-bit frequency and reinsertion, a ghost list of recently evicted
// small-queue keys that admits them straight to main) over whole-expert slots; pinned slots
// (in use by the current layer's wave) are never chosen. Non-goals: sizing (the plan does it).
// Thread safety: one thread.
// Invariants: (1) a key maps to at most one slot and a used slot to exactly one key; (2) a pinned
// slot is never returned by Reserve's eviction (so a view handed out for the current wave stays
// valid until UnpinAll); (3) under S3-FIFO every used slot is in exactly one of small/main.
#pragma once

#include <cstdint>
#include <deque>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/status.h"

namespace k3::run {

enum class CachePolicy { kLru, kS3Fifo };
Result<CachePolicy> ParseCachePolicy(std::string_view name);  // "lru" | "s3fifo"
const char* CachePolicyName(CachePolicy p);

class ExpertCache {
 public:
  ExpertCache(int slots, CachePolicy policy);

  // The slot holding `key`, or -1. A found key counts as an access (LRU recency, S3-FIFO freq).
  int Lookup(uint64_t key);
  // The slot holding `key`, or -1, without counting an access.
  int Find(uint64_t key) const {
    auto it = where_.find(key);
    return it == where_.end() ? -1 : it->second;
  }
  // A slot for `key` (not present): a free one, else an evicted unpinned one; -1 when every slot
  // is pinned. The slot is pinned and maps to `key` until Drop or eviction.
  int Reserve(uint64_t key);
  // Forget the key in `slot` (its read failed): the slot becomes free.
  void Drop(int slot);
  void Pin(int slot) { pinned_[static_cast<size_t>(slot)] = 1; }
  void Unpin(int slot) { pinned_[static_cast<size_t>(slot)] = 0; }
  void UnpinAll();

  int slots() const { return static_cast<int>(key_.size()); }
  uint64_t evictions() const { return evictions_; }

 private:
  int Victim();
  int VictimLru();
  int VictimS3();
  void Remove(int slot);

  CachePolicy policy_;
  std::vector<uint64_t> key_;
  std::vector<char> used_, pinned_;
  std::vector<uint64_t> last_use_;  // LRU
  std::vector<uint8_t> freq_;       // S3-FIFO, 0..3
  std::vector<char> in_small_;      // S3-FIFO: which queue
  std::deque<int> small_, main_;    // S3-FIFO, front = oldest
  std::deque<uint64_t> ghost_order_;
  std::unordered_set<uint64_t> ghost_;
  std::unordered_map<uint64_t, int> where_;
  std::vector<int> free_;
  uint64_t clock_ = 0, evictions_ = 0;
};

}  // namespace k3::run
