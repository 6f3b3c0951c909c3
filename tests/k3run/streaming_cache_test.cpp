// ExpertCache: eviction order of LRU and S3-FIFO, pinning, refusal when everything is pinned.
#include "k3run/stream/expert_cache.h"

#include <gtest/gtest.h>

namespace k3::run {
namespace {

// Fills `c` with keys 0..n-1, unpinning after each (as a layer release would).
void Fill(ExpertCache* c, int n) {
  for (int k = 0; k < n; ++k) {
    ASSERT_GE(c->Reserve(uint64_t(k)), 0);
    c->UnpinAll();
  }
}

TEST(ExpertCacheLru, EvictsLeastRecentlyUsed) {
  ExpertCache c(3, CachePolicy::kLru);
  Fill(&c, 3);
  ASSERT_GE(c.Lookup(0), 0);  // 1 is now the oldest
  ASSERT_GE(c.Reserve(10), 0);
  EXPECT_EQ(c.Find(1), -1);
  EXPECT_GE(c.Find(0), 0);
  EXPECT_GE(c.Find(2), 0);
  EXPECT_EQ(c.evictions(), 1u);
}

TEST(ExpertCacheS3Fifo, FrequentKeySurvivesAScan) {
  // Key 0 is re-used between one-off keys; LRU loses it to a scan longer than the cache, S3-FIFO
  // keeps it in main.
  for (CachePolicy p : {CachePolicy::kLru, CachePolicy::kS3Fifo}) {
    ExpertCache c(10, p);
    Fill(&c, 10);
    for (int i = 0; i < 3; ++i) ASSERT_GE(c.Lookup(0), 0);
    for (uint64_t k = 100; k < 100 + 12; ++k) {
      ASSERT_GE(c.Reserve(k), 0);
      c.UnpinAll();
    }
    if (p == CachePolicy::kLru) {
      EXPECT_EQ(c.Find(0), -1) << "LRU should have evicted key 0 during the scan";
    } else {
      EXPECT_GE(c.Find(0), 0) << "S3-FIFO evicted the frequently used key";
    }
  }
}

TEST(ExpertCache, PinnedSlotsAreNeverEvicted) {
  for (CachePolicy p : {CachePolicy::kLru, CachePolicy::kS3Fifo}) {
    ExpertCache c(3, p);
    Fill(&c, 3);
    c.Pin(c.Find(0));
    c.Pin(c.Find(1));
    ASSERT_GE(c.Reserve(7), 0);
    EXPECT_GE(c.Find(0), 0);
    EXPECT_GE(c.Find(1), 0);
    EXPECT_EQ(c.Find(2), -1);
  }
}

TEST(ExpertCache, ReserveFailsWhenEverySlotIsPinned) {
  for (CachePolicy p : {CachePolicy::kLru, CachePolicy::kS3Fifo}) {
    ExpertCache c(2, p);
    ASSERT_GE(c.Reserve(1), 0);
    ASSERT_GE(c.Reserve(2), 0);  // both pinned by Reserve
    EXPECT_EQ(c.Reserve(3), -1);
  }
}

TEST(ExpertCache, DropFreesTheSlot) {
  ExpertCache c(1, CachePolicy::kS3Fifo);
  const int s = c.Reserve(5);
  ASSERT_GE(s, 0);
  c.Drop(s);
  EXPECT_EQ(c.Find(5), -1);
  EXPECT_EQ(c.Reserve(6), s);
  EXPECT_EQ(c.evictions(), 0u);
}

TEST(ExpertCache, ParsePolicyRejectsUnknownNamingFlag) {
  EXPECT_TRUE(ParseCachePolicy("lru").ok());
  EXPECT_TRUE(ParseCachePolicy("s3fifo").ok());
  Result<CachePolicy> bad = ParseCachePolicy("fifo");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalid);
  EXPECT_NE(bad.status().message().find("--cache-policy fifo"), std::string::npos);
}

}  // namespace
}  // namespace k3::run
