// AlignedBuffer's three allocators: what alignment and size each gives.
#include "common/aligned_buffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

namespace k3 {
namespace {

uintptr_t Address(const AlignedBuffer& b) { return reinterpret_cast<uintptr_t>(b.data()); }

TEST(AlignedBuffer, AllocateKeepsTheSizeAndAlignment) {
  auto b = AlignedBuffer::Allocate(1000, 256);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->size(), 1000u);
  EXPECT_EQ(Address(*b) % 256, 0u);
  EXPECT_FALSE(AlignedBuffer::Allocate(64, 48).ok());  // not a power of two
}

TEST(AlignedBuffer, AllocateHugeRoundsToWholeHugePages) {
  auto b = AlignedBuffer::AllocateHuge(AlignedBuffer::kHugePage + 1);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->size(), 2 * AlignedBuffer::kHugePage);
  EXPECT_EQ(Address(*b) % AlignedBuffer::kHugePage, 0u);
}

// A planned buffer holds what the plan counts: huge-page aligned from kLargeBytes up, so the
// kernel can back its whole 2 MiB spans with huge pages (the pinned trunk's products depend on
// it), but never rounded past the next 4 KiB.
TEST(AlignedBuffer, AllocateLargeAlignsToHugePagesWithoutRoundingTheSize) {
  const size_t large = AlignedBuffer::kLargeBytes + AlignedBuffer::kHugePage / 2 + 100;
  auto b = AlignedBuffer::AllocateLarge(large);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(Address(*b) % AlignedBuffer::kHugePage, 0u);
  EXPECT_EQ(b->size(), (large + 4095) / 4096 * 4096);
  std::memset(b->data(), 0xab, b->size());  // all of it is usable
  EXPECT_EQ(b->data()[b->size() - 1], 0xab);

  auto small = AlignedBuffer::AllocateLarge(AlignedBuffer::kLargeBytes - 1);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->size(), AlignedBuffer::kLargeBytes - 1);
  EXPECT_EQ(Address(*small) % 4096, 0u);
}

}  // namespace
}  // namespace k3
