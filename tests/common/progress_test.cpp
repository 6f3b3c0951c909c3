// Progress with an injected clock and sink: no terminal, no real time.
#include "common/progress.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace k3 {
namespace {

struct FakeOutput {
  double now = 100.0;
  std::vector<std::string> lines;
  Progress::Clock clock() {
    return [this] { return now; };
  }
  Progress::Sink sink() {
    return [this](std::string_view s) { lines.emplace_back(s); };
  }
};

TEST(Progress, PlainModePrintsALineEvery30SecondsAndAFinalSummary) {
  FakeOutput out;
  {
    Progress p("pack", 1000u << 20, ProgressMode::kPlain, out.clock(), out.sink());
    p.SetStatus("layer 1/3");
    for (int s = 1; s <= 75; ++s) {  // 75 s at 4 MiB/s
      out.now += 1.0;
      p.Add(4u << 20);
    }
    ASSERT_EQ(out.lines.size(), 2u) << "lines at t=30 and t=60 only";
    EXPECT_EQ(out.lines[0].rfind("pack: 120.00 MiB of 1000.00 MiB (12%)", 0), 0u) << out.lines[0];
    EXPECT_NE(out.lines[0].find("4.00 MiB/s"), std::string::npos) << out.lines[0];
    EXPECT_NE(out.lines[0].find("ETA 3m40s"), std::string::npos) << out.lines[0];
    EXPECT_NE(out.lines[0].find("layer 1/3"), std::string::npos) << out.lines[0];
    EXPECT_EQ(out.lines[1].rfind("pack: 240.00 MiB", 0), 0u) << out.lines[1];
    p.Finish();
    ASSERT_EQ(out.lines.size(), 3u);
    EXPECT_EQ(out.lines[2],
              "pack: stopped at 300.00 MiB of 1000.00 MiB in 1m15s (4.00 MiB/s average), "
              "layer 1/3\n");
    p.Finish();  // idempotent
  }
  EXPECT_EQ(out.lines.size(), 3u) << "the destructor must not print a second summary";
}

TEST(Progress, PlainModePrintsDuringAStallWhenTicked) {
  FakeOutput out;
  Progress p("download", 100, ProgressMode::kPlain, out.clock(), out.sink());
  p.Add(10);
  p.SetStalled(true);
  out.now += 31;
  p.Tick();
  ASSERT_EQ(out.lines.size(), 1u);
  EXPECT_NE(out.lines[0].find(", stalled"), std::string::npos) << out.lines[0];
}

TEST(Progress, CompletedSummarySaysDone) {
  FakeOutput out;
  Progress p("verify", 2048, ProgressMode::kPlain, out.clock(), out.sink());
  out.now += 2;
  p.Add(2048);
  p.Finish();
  ASSERT_EQ(out.lines.size(), 1u);
  EXPECT_EQ(out.lines[0], "verify: done, 2.00 KiB in 2s (1.00 KiB/s average)\n");
}

TEST(Progress, NoneModePrintsNothing) {
  FakeOutput out;
  {
    Progress p("x", 100, ProgressMode::kNone, out.clock(), out.sink());
    for (int i = 0; i < 100; ++i) {
      out.now += 10;
      p.Add(1);
      p.SetStalled(i % 2 == 0);
      p.Tick();
    }
  }
  EXPECT_TRUE(out.lines.empty());
}

TEST(Progress, AutoResolvesByTty) {
  FakeOutput out;
  Progress tty("a", 1, ProgressMode::kAuto, out.clock(), out.sink(), /*sink_is_tty=*/true);
  Progress log("b", 1, ProgressMode::kAuto, out.clock(), out.sink(), /*sink_is_tty=*/false);
  EXPECT_EQ(tty.mode(), ProgressMode::kBar);
  EXPECT_EQ(log.mode(), ProgressMode::kPlain);
}

TEST(Progress, BarRedrawsAtMostTenTimesASecondAndShowsStall) {
  FakeOutput out;
  Progress p("synth", 10u << 20, ProgressMode::kBar, out.clock(), out.sink());
  for (int i = 0; i < 100; ++i) {  // 1 s in 10 ms steps
    out.now += 0.01;
    p.Add(1u << 10);
  }
  EXPECT_GE(out.lines.size(), 9u);
  EXPECT_LE(out.lines.size(), 10u);
  const std::string& last = out.lines.back();
  EXPECT_EQ(last.rfind("\rsynth [", 0), 0u) << last;
  EXPECT_NE(last.find("/10.00 MiB"), std::string::npos) << last;
  EXPECT_NE(last.find("KiB/s"), std::string::npos) << last;
  EXPECT_NE(last.find("ETA"), std::string::npos) << last;
  const size_t before = out.lines.size();
  p.SetStalled(true);  // a state change redraws immediately
  ASSERT_EQ(out.lines.size(), before + 1);
  EXPECT_NE(out.lines.back().find("STALLED"), std::string::npos) << out.lines.back();
  p.Finish();
  EXPECT_EQ(out.lines.back().rfind("\r\033[Ksynth: stopped at", 0), 0u) << out.lines.back();
}

TEST(Progress, RateIsSmoothed) {
  FakeOutput out;
  Progress p("r", 0, ProgressMode::kPlain, out.clock(), out.sink());
  for (int i = 0; i < 30; ++i) {  // 30 s at 1 MiB/s
    out.now += 1;
    p.Add(1u << 20);
  }
  for (int i = 0; i < 2; ++i) {  // then 2 s at 10 MiB/s: the EMA moves, but not all the way
    out.now += 1;
    p.Add(10u << 20);
  }
  out.now += 28.5;
  p.Add(0);
  ASSERT_EQ(out.lines.size(), 2u);
  EXPECT_NE(out.lines[0].find("1.00 MiB/s"), std::string::npos) << out.lines[0];
}

TEST(Progress, RealClockPlainModeStopsItsTickerAndPrintsOneSummary) {
  ::testing::internal::CaptureStderr();
  {
    Progress p("real", 10, ProgressMode::kPlain);
    p.Add(10);
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.rfind("real: done, 10 B in ", 0), 0u) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
}

TEST(Progress, FormatHelpers) {
  EXPECT_EQ(FormatIecBytes(0), "0 B");
  EXPECT_EQ(FormatIecBytes(1023), "1023 B");
  EXPECT_EQ(FormatIecBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatIecBytes(1560936091448.0), "1.42 TiB");
  EXPECT_EQ(FormatDuration(7), "7s");
  EXPECT_EQ(FormatDuration(245), "4m05s");
  EXPECT_EQ(FormatDuration(3723), "1h02m03s");
  EXPECT_EQ(FormatDuration(-1), "?");
  ProgressMode m;
  EXPECT_TRUE(ParseProgressMode("plain", &m));
  EXPECT_EQ(m, ProgressMode::kPlain);
  EXPECT_FALSE(ParseProgressMode("fancy", &m));
}

}  // namespace
}  // namespace k3
