#include "common/reserved_floats.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <utility>

namespace k3 {
namespace {

const uint64_t kPage = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));

TEST(ReservedFloats, ReservationCostsNothingUntilWritten) {
  const size_t n = size_t{64} << 20;  // 256 MB of address space
  ReservedFloats buf(n);
  ASSERT_EQ(buf.size(), n);
  EXPECT_EQ(buf.ResidentBytes(), 0u);
  const size_t written = 3 * kPage / sizeof(float) + 5;  // three pages and a bit of a fourth
  for (size_t i = 0; i < written; ++i) buf.data()[i] = 1.0f + static_cast<float>(i);
  EXPECT_EQ(buf.ResidentBytes(), 4 * kPage);
  // Unwritten elements read as +0.0f. (Reading maps the kernel's shared zero page, which costs no
  // RAM but which mincore reports as resident, so it is read only after the measurement.)
  EXPECT_EQ(std::bit_cast<uint32_t>(buf.data()[n - 1]), 0u);
  EXPECT_EQ(std::bit_cast<uint32_t>(buf.data()[written]), 0u);
}

TEST(ReservedFloats, ReleaseKeepsWhatComesBeforeAndZeroesTheRest) {
  const size_t per_page = kPage / sizeof(float);
  ReservedFloats buf(8 * per_page);
  for (size_t i = 0; i < buf.size(); ++i) buf.data()[i] = 2.0f;
  EXPECT_EQ(buf.ResidentBytes(), 8 * kPage);
  buf.Release(2 * per_page + 1);  // the page holding element 2·per_page stays
  EXPECT_EQ(buf.ResidentBytes(), 3 * kPage);
  EXPECT_EQ(buf.data()[2 * per_page + 1], 2.0f);
  EXPECT_EQ(buf.data()[3 * per_page - 1], 2.0f);
  EXPECT_EQ(buf.data()[3 * per_page], 0.0f);
  buf.Release();
  EXPECT_EQ(buf.ResidentBytes(), 0u);
  EXPECT_EQ(buf.data()[0], 0.0f);
}

TEST(ReservedFloats, CopyAndMove) {
  ReservedFloats a(1000);
  for (size_t i = 0; i < a.size(); ++i) a.data()[i] = static_cast<float>(i);
  ReservedFloats b = a;
  ASSERT_EQ(b.size(), 1000u);
  EXPECT_NE(b.data(), a.data());
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(b.data()[i], static_cast<float>(i));
  b.data()[7] = -1.0f;
  EXPECT_EQ(a.data()[7], 7.0f);
  const float* where = a.data();
  ReservedFloats c = std::move(a);
  EXPECT_EQ(c.data(), where);
  EXPECT_EQ(a.size(), 0u);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  EXPECT_EQ(a.data(), nullptr);
  c = b;
  EXPECT_EQ(c.data()[7], -1.0f);
  ReservedFloats empty;
  EXPECT_EQ(empty.ResidentBytes(), 0u);
  empty.Release();
}

}  // namespace
}  // namespace k3
