// The scan engine on a file larger than one read window: ranges that straddle windows, small
// gaps read through, large gaps skipped, empty ranges, and the first differing byte of a
// comparison located across a window boundary.
#include "k3verify/file_scan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/k3verify/mini_pack.h"
#include "tests/support/temp_dir.h"

namespace k3::verify {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = 1 << 20;

class FileScanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    bytes_ = test::TensorBytes(20 * kMiB, 7);
    path_ = dir_.WriteFile("data.bin", bytes_);
    source_ = dir_.WriteFile("source.bin", bytes_);
  }

  // Ranges chosen around the 8 MiB window: one straddling it, one after a 5-byte gap, one after
  // a 3 MiB gap (skipped, not read), one empty.
  std::vector<ScanFile> Plan(bool compare) const {
    const std::vector<std::pair<uint64_t, uint64_t>> ranges = {
        {0, 100}, {100, 9 * kMiB - 100}, {9 * kMiB + 5, 2 * kMiB}, {14 * kMiB, 6 * kMiB - 3},
        {20 * kMiB - 3, 0}};
    ScanFile f{path_, {}};
    for (size_t i = 0; i < ranges.size(); ++i) {
      ScanItem it;
      it.label = "item " + std::to_string(i);
      it.offset = ranges[i].first;
      it.length = ranges[i].second;
      it.hash = i % 2 ? ScanHash::kXxh3_64 : ScanHash::kXxh3_128;
      it.want128 = Xxh3_128(bytes_.data() + it.offset, it.length);
      it.want64 = Xxh3_64(bytes_.data() + it.offset, it.length);
      it.want_from = "test";
      if (compare) it.sources.push_back(ScanSource{0, it.length, source_, it.offset, "src"});
      f.items.push_back(it);
    }
    return {f};
  }

  std::vector<Status> Scan(bool compare, ScanStats* stats) {
    std::vector<ScanFile> files = Plan(compare);
    Progress progress("", 0, ProgressMode::kNone);
    std::vector<Status> problems;
    *stats = ScanFiles(Env::Default(), files, 2, &progress, &problems);
    return problems;
  }

  test::TempDir dir_;
  std::string bytes_;
  std::string path_;
  std::string source_;
};

TEST_F(FileScanTest, RangesAcrossWindowsAndGapsHashCorrectly) {
  ScanStats stats;
  const std::vector<Status> problems = Scan(true, &stats);
  EXPECT_TRUE(problems.empty()) << problems[0].ToString();
  EXPECT_EQ(stats.items_hashed, 5u);
  EXPECT_EQ(stats.items_compared, 5u);
  EXPECT_EQ(stats.bytes, 17 * kMiB - 3);
}

TEST_F(FileScanTest, ByteFlippedPastTheFirstWindowIsFoundInItsRange) {
  test::FlipByte(path_, 8 * kMiB + 1);
  ScanStats stats;
  const std::vector<Status> problems = Scan(false, &stats);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_THAT(problems[0].message(), HasSubstr("item 1 (" + path_ + ", offset 100,"));
  EXPECT_THAT(problems[0].message(), HasSubstr("XXH3-64"));
}

TEST_F(FileScanTest, FirstDifferingByteIsLocatedAcrossWindows) {
  test::FlipByte(source_, 16 * kMiB + 9);
  test::FlipByte(source_, 17 * kMiB);  // later in the same range: only the first is named
  ScanStats stats;
  const std::vector<Status> problems = Scan(true, &stats);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].code(), Code::kIntegrity);
  EXPECT_THAT(problems[0].message(), HasSubstr("item 3"));
  EXPECT_THAT(problems[0].message(),
              HasSubstr("first differing byte at offset " + std::to_string(2 * kMiB + 9) +
                        " of the region"));
}

}  // namespace
}  // namespace k3::verify
