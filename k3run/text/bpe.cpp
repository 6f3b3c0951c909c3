#include "k3run/text/bpe.h"

#define XXH_INLINE_ALL  // short keys: the call overhead would dominate the hash itself
#include <xxhash.h>

#include <cstring>

#include <limits>
#include <queue>

namespace k3::tok {
namespace {

constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();

int32_t RankOf(const RankMap& ranks, std::string_view bytes) {
  const int32_t r = ranks.Find(bytes);
  return r == RankMap::kNone ? kNoRank : r;
}

}  // namespace

void RankMap::Build(const std::vector<std::string_view>& keys) {
  size_t cap = 16;
  while (cap < keys.size() * 2) cap <<= 1;  // load factor ≤ 0.5
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  count_ = keys.size();
  for (size_t r = 0; r < keys.size(); ++r) {
    const uint64_t h = XXH3_64bits(keys[r].data(), keys[r].size());
    uint64_t i = h & mask_;
    while (slots_[i].data != nullptr) i = (i + 1) & mask_;
    slots_[i] = {h, keys[r].data(), static_cast<uint32_t>(keys[r].size()), static_cast<int32_t>(r)};
  }
}

int32_t RankMap::Find(std::string_view bytes) const {
  if (slots_.empty()) return kNone;
  const uint64_t h = XXH3_64bits(bytes.data(), bytes.size());
  for (uint64_t i = h & mask_;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.data == nullptr) return kNone;
    if (s.hash == h && s.len == bytes.size() && std::memcmp(s.data, bytes.data(), s.len) == 0) {
      return s.rank;
    }
  }
}

void BytePairEncodeScan(std::string_view piece, const RankMap& ranks, std::vector<int32_t>* out) {
  // parts[i] = (start of part i, rank of merging part i with part i+1); two sentinels at the end,
  // as in tiktoken's lib.rs.
  struct Part {
    size_t start;
    int32_t rank;
  };
  std::vector<Part> parts;
  parts.reserve(piece.size() + 1);
  int32_t min_rank = kNoRank;
  size_t min_i = 0;
  for (size_t i = 0; i + 1 < piece.size(); ++i) {
    const int32_t r = RankOf(ranks, piece.substr(i, 2));
    if (r < min_rank) {
      min_rank = r;
      min_i = i;
    }
    parts.push_back({i, r});
  }
  parts.push_back({piece.size() - 1, kNoRank});
  parts.push_back({piece.size(), kNoRank});
  const auto pair_rank = [&](size_t i) {
    if (i + 3 >= parts.size()) return kNoRank;
    return RankOf(ranks, piece.substr(parts[i].start, parts[i + 3].start - parts[i].start));
  };
  while (min_rank != kNoRank) {
    const size_t i = min_i;
    if (i > 0) parts[i - 1].rank = pair_rank(i - 1);
    parts[i].rank = pair_rank(i);
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    min_rank = kNoRank;
    for (size_t k = 0; k + 1 < parts.size(); ++k) {
      if (parts[k].rank < min_rank) {
        min_rank = parts[k].rank;
        min_i = k;
      }
    }
  }
  for (size_t k = 0; k + 1 < parts.size(); ++k) {
    out->push_back(RankOf(ranks, piece.substr(parts[k].start, parts[k + 1].start - parts[k].start)));
  }
}

void BytePairEncodeHeap(std::string_view piece, const RankMap& ranks, std::vector<int32_t>* out) {
  // Parts form a doubly linked list indexed by their start byte; a part's pair rank is the rank
  // of (part + next part). The heap orders candidate merges by (rank, start): lowest rank,
  // leftmost first, exactly the scan's choice. Stale heap entries are skipped on pop by
  // comparing with the part's current rank and liveness.
  const size_t n = piece.size();
  std::vector<size_t> next(n), prev(n);
  std::vector<int32_t> rank(n, kNoRank);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    next[i] = i + 1;
    prev[i] = i == 0 ? SIZE_MAX : i - 1;
  }
  using Entry = std::pair<int32_t, size_t>;  // (rank, start)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  for (size_t i = 0; i + 1 < n; ++i) {
    rank[i] = RankOf(ranks, piece.substr(i, 2));
    if (rank[i] != kNoRank) heap.push({rank[i], i});
  }
  // Rank of (part at a) + (the part after it), or none when a is the last part.
  const auto pair_rank = [&](size_t a) {
    const size_t b = next[a];
    if (b >= n) return kNoRank;
    const size_t c = next[b];
    return RankOf(ranks, piece.substr(a, c - a));
  };
  while (!heap.empty()) {
    const auto [r, a] = heap.top();
    heap.pop();
    if (!alive[a] || rank[a] != r) continue;
    const size_t b = next[a];  // merge b into a
    alive[b] = false;
    next[a] = next[b];
    if (next[b] < n) prev[next[b]] = a;
    rank[a] = pair_rank(a);
    if (rank[a] != kNoRank) heap.push({rank[a], a});
    if (prev[a] != SIZE_MAX) {
      const size_t p = prev[a];
      rank[p] = pair_rank(p);
      if (rank[p] != kNoRank) heap.push({rank[p], p});
    }
  }
  for (size_t a = 0; a < n; a = next[a]) {
    out->push_back(RankOf(ranks, piece.substr(a, next[a] - a)));
  }
}

void BytePairEncode(std::string_view piece, const RankMap& ranks, std::vector<int32_t>* out) {
  if (piece.size() == 1) {
    out->push_back(RankOf(ranks, piece));
  } else if (piece.size() <= kHeapBpeThreshold) {
    BytePairEncodeScan(piece, ranks, out);
  } else {
    BytePairEncodeHeap(piece, ranks, out);
  }
}

}  // namespace k3::tok
