// k3run's streaming flags and report: memory flags apply in command-line order (later
// flags win), the JSON report's streaming fields exist and agree with each other and with the
// printed plan, peak RSS stays within the memory plan plus a stated overhead at the minimum
// budget (a separate k3run process: getrusage's peak is per process), and --dump-cache-trace.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/prepared_manifest.h"
#include "k3run/stream/streaming_plan.h"
#include "tests/k3run/engine_fixture.h"
#include "tests/support/files.h"
#include "tests/support/temp_dir.h"

namespace k3::run {
namespace {

using nlohmann::json;
using testing::kPromptText;
using testing::RunCliArgs;
using testing::TinyPreparedDir;

StreamingPlan MinimumOf(const std::string& dir) {
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), dir);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  if (!p.ok()) return {};
  BudgetRequest big;
  big.budget_gb = 1e6;
  Result<StreamingPlan> plan = PlanStreaming(*p, big, 0);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  return plan.ok() ? *plan : StreamingPlan{};
}

std::string Gb(uint64_t bytes) { return std::to_string(double(bytes) / 1e9); }

std::vector<std::string> Args(std::vector<std::string> memory_flags) {
  std::vector<std::string> a = {TinyPreparedDir(), "--ids", kPromptText, "--gen", "2",
                                "--no-floor"};
  a.insert(a.end(), memory_flags.begin(), memory_flags.end());
  return a;
}

const testing::CliRun& DefaultRun() {
  static const testing::CliRun run = RunCliArgs(Args({}));
  return run;
}

// --- memory flags: later flags win -------------------------------------------------------------

// A total below the minimum on its own is refused; followed by a roomy total, the later wins.
// On the small preset: its minimum (≈ 5 MB) is above the 0.001 GB, the tiny one's is not.
TEST(StreamingCliFlagOrder, LaterBudgetReplacesEarlierBudget) {
  const std::vector<std::string> base = {testing::SmallPreparedDir(), "--ids", "3,7,300,1000",
                                         "--gen", "2", "--no-floor"};
  auto with = [&](std::vector<std::string> flags) {
    std::vector<std::string> a = base;
    a.insert(a.end(), flags.begin(), flags.end());
    return a;
  };
  const testing::CliRun all = RunCliArgs(base);
  ASSERT_EQ(all.exit_code, 0) << all.stderr_text;
  const testing::CliRun alone = RunCliArgs(with({"--budget-gb", "0.001"}));
  ASSERT_EQ(alone.exit_code, 2) << "the first budget must be one that refuses on its own";
  const testing::CliRun run = RunCliArgs(with({"--budget-gb", "0.001", "--budget-gb", "10"}));
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_EQ(run.stdout_text(), all.stdout_text());
  EXPECT_NE(run.stderr_text.find("streaming plan:"), std::string::npos) << run.stderr_text;
}

// --trunk-gb after a total overrides the total's trunk share: too small, refused naming it.
TEST(StreamingCliFlagOrder, TrunkAfterBudgetOverridesAndIsRefusedNamingTrunkFlag) {
  const testing::CliRun run = RunCliArgs(Args({"--budget-gb", "10", "--trunk-gb", "0.000001"}));
  EXPECT_EQ(run.exit_code, 2) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("--trunk-gb: a trunk budget of"), std::string::npos)
      << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("give --trunk-gb"), std::string::npos)
      << "says what to do: " << run.stderr_text;
  EXPECT_TRUE(run.stdout_text().empty());
}

// A total after --trunk-gb replaces it: the too-small trunk budget is forgotten.
TEST(StreamingCliFlagOrder, BudgetAfterTrunkReplacesIt) {
  ASSERT_EQ(DefaultRun().exit_code, 0) << DefaultRun().stderr_text;
  const testing::CliRun run = RunCliArgs(Args({"--trunk-gb", "0.000001", "--budget-gb", "10"}));
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_EQ(run.stdout_text(), DefaultRun().stdout_text());
}

// --preset is a total like --budget-gb: whichever comes last wins.
TEST(StreamingCliFlagOrder, PresetAndBudgetLastOneWins) {
  ASSERT_EQ(DefaultRun().exit_code, 0) << DefaultRun().stderr_text;
  const testing::CliRun preset_last =
      RunCliArgs(Args({"--budget-gb", "0.000001", "--preset", "laptop"}));
  EXPECT_EQ(preset_last.exit_code, 0) << preset_last.stderr_text;
  EXPECT_EQ(preset_last.stdout_text(), DefaultRun().stdout_text());
  const testing::CliRun budget_last =
      RunCliArgs(Args({"--preset", "laptop", "--budget-gb", "0.000001"}));
  EXPECT_EQ(budget_last.exit_code, 2) << budget_last.stderr_text;
  EXPECT_NE(budget_last.stderr_text.find("--budget-gb: a total budget of"), std::string::npos)
      << budget_last.stderr_text;
}

// --- the JSON report ----------------------------------------------------------------------------

json ReadJson(const std::string& path) {
  const std::string text = test::ReadWholeFile(path);
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << path << " is not JSON:\n" << text;
  return j;
}

// A rate field: null exactly when there were no requests, else hits ÷ requests in [0, 1].
void ExpectRate(const json& rate, uint64_t hits, uint64_t requests, const std::string& where) {
  if (requests == 0) {
    EXPECT_TRUE(rate.is_null()) << where << ": no requests, rate must be null";
    return;
  }
  ASSERT_TRUE(rate.is_number()) << where;
  EXPECT_GE(rate.get<double>(), 0.0) << where;
  EXPECT_LE(rate.get<double>(), 1.0) << where;
  EXPECT_DOUBLE_EQ(rate.get<double>(), double(hits) / double(requests)) << where;
}

struct ReportRun {
  testing::CliRun run;
  json report;
};

ReportRun RunWithReport(const std::string& dir, std::vector<std::string> extra) {
  test::TempDir tmp;
  const std::string out = tmp.Join("report.json");
  std::vector<std::string> a = {dir, "--ids", kPromptText, "--gen", "3", "--out", out};
  a.insert(a.end(), extra.begin(), extra.end());
  ReportRun r;
  r.run = RunCliArgs(a);
  EXPECT_EQ(r.run.exit_code, 0) << r.run.stderr_text;
  if (r.run.exit_code == 0) r.report = ReadJson(out);
  return r;
}

std::vector<std::string> MinimumFlags(const std::string& dir) {
  const StreamingPlan min = MinimumOf(dir);
  return {"--trunk-gb", Gb(min.trunk_min), "--cache-gb", Gb(min.cache_min + 4096)};
}

TEST(StreamingCliReport, StepAndTotalCountersAreConsistent) {
  std::vector<std::string> flags = MinimumFlags(TinyPreparedDir());
  flags.push_back("--no-floor");
  const ReportRun r = RunWithReport(TinyPreparedDir(), flags);
  ASSERT_TRUE(r.report.is_object());
  const json& steps = r.report["steps"];
  ASSERT_TRUE(steps.is_array());
  ASSERT_EQ(steps.size(), 3u);
  uint64_t requests = 0, hits = 0;
  double busy = 0, wait = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const json& s = steps[i];
    const std::string where = "steps[" + std::to_string(i) + "]";
    ASSERT_TRUE(s["expert_requests"].is_number_unsigned()) << where;
    ASSERT_TRUE(s["expert_hits"].is_number_unsigned()) << where;
    const auto req = s["expert_requests"].get<uint64_t>();
    const auto hit = s["expert_hits"].get<uint64_t>();
    EXPECT_GE(req, hit) << where << ": more hits than requests";
    EXPECT_GT(req, 0u) << where << ": a MoE model requests experts every step";
    ExpectRate(s["expert_hit_rate"], hit, req, where + ".expert_hit_rate");
    ASSERT_TRUE(s["io_busy_s"].is_number()) << where;
    ASSERT_TRUE(s["io_wait_s"].is_number()) << where;
    busy += s["io_busy_s"].get<double>();
    wait += s["io_wait_s"].get<double>();
    requests += req;
    hits += hit;
  }
  const json& t = r.report["totals"];
  ExpectRate(t["expert_hit_rate"], hits, requests, "totals.expert_hit_rate");
  // The run's I/O times are its steps' added up (same order, so the same doubles).
  EXPECT_EQ(t["io_busy_s"].get<double>(), busy) << t.dump();
  EXPECT_EQ(t["io_wait_s"].get<double>(), wait) << t.dump();
  ASSERT_TRUE(t["io_share"].is_number()) << t.dump();
  EXPECT_GE(t["io_share"].get<double>(), 0.0);
  EXPECT_LE(t["io_share"].get<double>(), 1.0);
  ASSERT_TRUE(t["io_hidden"].is_number()) << "the ring read: I/O was busy. " << t.dump();
  EXPECT_GE(t["io_hidden"].get<double>(), 0.0);
  EXPECT_LE(t["io_hidden"].get<double>(), 1.0);
  const json& st = r.report["streaming"]["stats"];
  EXPECT_EQ(st["expert_requests"].get<uint64_t>(), requests);
  EXPECT_EQ(st["expert_hits"].get<uint64_t>(), hits);
  EXPECT_GT(st["ring_loads"].get<uint64_t>(), 0u);
  EXPECT_FALSE(r.report["streaming"]["reader"].get<std::string>().empty());
  EXPECT_TRUE(r.report["valid"].get<bool>());
  EXPECT_GT(r.report["memory_plan"]["scratch_bytes"].get<uint64_t>(), 0u);
}

// streaming.plan is the plan printed on stderr before the run (StreamingPlan::Describe), and the
// memory plan's weights are that plan's bytes.
TEST(StreamingCliReport, PlanMatchesPrintedPlan) {
  std::vector<std::string> flags = MinimumFlags(TinyPreparedDir());
  flags.push_back("--no-floor");
  const ReportRun r = RunWithReport(TinyPreparedDir(), flags);
  ASSERT_TRUE(r.report.is_object());
  const json& p = r.report["streaming"]["plan"];
  ASSERT_TRUE(p.is_object()) << r.report["streaming"].dump();
  const std::string& err = r.run.stderr_text;
  const size_t at = err.find("streaming plan:");
  ASSERT_NE(at, std::string::npos) << err;
  const std::string printed = err.substr(at, err.find('\n', at) - at);
  auto expect_in_printed = [&](const std::string& want) {
    EXPECT_NE(printed.find(want), std::string::npos) << "want \"" << want << "\" in: " << printed;
  };
  expect_in_printed("(" + std::to_string(p["pinned_layers"].size()) + " layers pinned");
  expect_in_printed("ring " + std::to_string(p["ring_slots"].get<int>()) + " × ");
  expect_in_printed("expert cache " + std::to_string(p["expert_slots"].get<int>()) + " slots × " +
                    std::to_string(p["expert_slot_bytes"].get<uint64_t>()) + " B (" +
                    p["policy"].get<std::string>() + ")");
  if (p["lm_head_held"].get<bool>()) {
    expect_in_printed("lm_head held");
  } else {
    expect_in_printed("lm_head streamed through the ring in chunks of " +
                      std::to_string(p["lm_head_chunk_rows"].get<int64_t>()) + " rows");
  }
  expect_in_printed("weights held ");
  expect_in_printed(" = " + std::to_string(p["weights_bytes"].get<uint64_t>()) + " bytes");
  // The plan asked for: the minimum of this directory.
  const StreamingPlan min = MinimumOf(TinyPreparedDir());
  EXPECT_EQ(p["ring_slots"].get<int>(), 2);
  EXPECT_FALSE(p["lm_head_held"].get<bool>());
  EXPECT_EQ(p["trunk_min_bytes"].get<uint64_t>(), min.trunk_min);
  EXPECT_EQ(p["cache_min_bytes"].get<uint64_t>(), min.cache_min);
  EXPECT_EQ(p["policy"].get<std::string>(), "s3fifo");
  EXPECT_EQ(r.report["memory_plan"]["weights_bytes"].get<uint64_t>(),
            p["weights_bytes"].get<uint64_t>());
}

TEST(StreamingCliReport, FloorPresentWithoutNoFloorAndNullWithIt) {
  std::vector<std::string> flags = MinimumFlags(TinyPreparedDir());
  flags.insert(flags.end(), {"--probe-seconds", "0.02"});
  const ReportRun probed = RunWithReport(TinyPreparedDir(), flags);
  ASSERT_TRUE(probed.report.is_object());
  const json& f = probed.report["floor"];
  ASSERT_TRUE(f.is_object()) << "no floor although probes ran: " << probed.run.stderr_text;
  EXPECT_GT(f["floor_s"].get<double>(), 0.0) << f.dump();
  EXPECT_GT(f["time_over_floor"].get<double>(), 0.0) << f.dump();
  EXPECT_GT(f["bandwidths"]["trunk_bytes_per_s"].get<double>(), 0.0) << f.dump();

  flags.push_back("--no-floor");
  const ReportRun skipped = RunWithReport(TinyPreparedDir(), flags);
  ASSERT_TRUE(skipped.report.is_object());
  EXPECT_TRUE(skipped.report["floor"].is_null()) << skipped.report["floor"].dump();
}

// Every weight held (no memory flag): no streaming section.
TEST(StreamingCliReport, StreamingNullWithoutBudget) {
  const ReportRun r = RunWithReport(TinyPreparedDir(), {"--no-floor"});
  ASSERT_TRUE(r.report.is_object());
  EXPECT_TRUE(r.report["streaming"].is_null()) << r.report["streaming"].dump();
  EXPECT_GT(r.report["memory_plan"]["scratch_bytes"].get<uint64_t>(), 0u);
}

// --- peak RSS within the plan -------------------------------------------------------------------

// What a k3run process holds beyond memory_plan.total_bytes (KV cache + state + scratch +
// weights held): the executable and its shared libraries (libstdc++, liburing, …; `k3run
// --list-presets` alone peaks at 6.4 MiB), the heap's slack, the prepared dir's manifest and
// decoded experts.idx (92 × 64 records), the tokenizer's tables, the reader threads' stacks and
// io_uring bounce slots. Measured on the small preset at its minimum budget without the floor
// probes (3 runs, io_uring backend): 8.9–9.0 MiB over a plan of 14.6 MiB. 16 MiB leaves room
// for a pread-pool machine; the brief caps it at 64 MiB.
constexpr uint64_t kRssOverheadBytes = uint64_t{16} << 20;

struct Process {
  int exit_code = -1;
  std::string stderr_text;
};

// Runs the real k3run executable (built next to the tests) so getrusage sees only its own peak.
Process RunK3runProcess(const std::vector<std::string>& args, const test::TempDir& tmp) {
  std::string cmd = std::string(K3_BINARY_DIR) + "/k3run/k3run";
  for (const std::string& a : args) cmd += " '" + a + "'";
  const std::string err = tmp.Join("stderr.txt");
  cmd += " > '" + tmp.Join("stdout.txt") + "' 2> '" + err + "'";
  const int status = std::system(cmd.c_str());
  Process p;
  p.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  p.stderr_text = test::ReadWholeFile(err);
  return p;
}

// Runs k3run on the small preset at its minimum budget and checks peak RSS against the plan
// plus `overhead`.
void ExpectPeakRssWithinPlan(const std::vector<std::string>& extra,
                             uint64_t overhead = kRssOverheadBytes) {
  const std::string& dir = testing::SmallPreparedDir();
  test::TempDir tmp;
  const std::string out = tmp.Join("report.json");
  std::vector<std::string> args = {dir, "--ids", "3,7,300,1000", "--gen", "3", "--out", out};
  for (const std::string& f : MinimumFlags(dir)) args.push_back(f);
  args.insert(args.end(), extra.begin(), extra.end());
  const Process p = RunK3runProcess(args, tmp);
  ASSERT_EQ(p.exit_code, 0) << p.stderr_text;
  const json r = ReadJson(out);
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(r["streaming"]["plan"]["ring_slots"].get<int>(), 2) << "not the minimum plan";
  const uint64_t plan = r["memory_plan"]["total_bytes"].get<uint64_t>();
  const uint64_t peak = r["peak_rss_bytes"].get<uint64_t>();
  EXPECT_GT(peak, 0u);
  EXPECT_GT(plan, 0u);
  EXPECT_LE(peak, plan + overhead)
      << "peak RSS " << peak << " bytes exceeds the plan " << plan << " + overhead "
      << overhead << " by " << (peak - plan - overhead) << " bytes";
}

TEST(StreamingCliRss, PeakRssWithinPlanPlusOverheadAtMinimumSmallNoFloor) {
  ExpectPeakRssWithinPlan({"--no-floor"});
}

// With the floor probes on (the default) the peak stays within the plan too: the memory probe's
// buffer (64 MiB otherwise) is capped by the plan, which is far below 64 MiB here. Before that
// cap this measured 76.2 MiB against a plan of 14.6 MiB.
// The probes' buffers are huge-page backed (AllocateHuge), and on this machine transparent huge
// pages move the peak in 2 MiB steps with the layout of the heap and the binary: measured on
// 2026-12-04, 3 runs each, the same plan of 15.1 MB peaked at 31.1–32.3 MB with a15ab78's binary
// and 33.7–34.1 MB with this one (without probes 28.2–28.4 and 28.5–28.6 MB), so the 16 MiB of
// kRssOverheadBytes failed even the old binary 2 runs of 3. Two huge pages more are allowed here.
TEST(StreamingCliRss, PeakRssWithinPlanPlusOverheadAtMinimumSmallWithFloorProbes) {
  ExpectPeakRssWithinPlan({"--probe-seconds", "0.05"}, kRssOverheadBytes + (uint64_t{4} << 20));
}

// --- --dump-cache-trace ------------------------------------------------------------------------

TEST(StreamingCliTrace, DumpCacheTraceWithoutBudgetRefusedNamingFlag) {
  test::TempDir tmp;
  const testing::CliRun run =
      RunCliArgs({TinyPreparedDir(), "--ids", kPromptText, "--gen", "1", "--no-floor",
                  "--dump-cache-trace", tmp.Join("trace")});
  EXPECT_EQ(run.exit_code, 2) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("--dump-cache-trace needs a memory budget"), std::string::npos)
      << run.stderr_text;
  EXPECT_FALSE(std::filesystem::exists(tmp.Join("trace") + "/cache-trace.jsonl"));
  EXPECT_TRUE(run.stdout_text().empty()) << "refused before generating";
}

TEST(StreamingCliTrace, DumpCacheTraceWithChatRefusedNamingFlag) {
  test::TempDir tmp;
  std::vector<std::string> a = {TinyPreparedDir(), "--chat", "--gen", "1", "--no-floor",
                                "--dump-cache-trace", tmp.Join("trace")};
  for (const std::string& f : MinimumFlags(TinyPreparedDir())) a.push_back(f);
  CliIo io;
  io.read_line = [] { return std::optional<std::string>("hello"); };
  const testing::CliRun run = RunCliArgs(a, io);
  EXPECT_EQ(run.exit_code, 2) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("--dump-cache-trace is not supported with --chat"),
            std::string::npos)
      << run.stderr_text;
  EXPECT_FALSE(std::filesystem::exists(tmp.Join("trace") + "/cache-trace.jsonl"));
}

// --- --preload ---------------------------------------------------------------------------------

TEST(StreamingCliPreload, WithoutBudgetRefusedNamingFlag) {
  const testing::CliRun run =
      RunCliArgs({TinyPreparedDir(), "--ids", kPromptText, "--gen", "1", "--no-floor",
                  "--preload"});
  EXPECT_EQ(run.exit_code, 2) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("--preload needs a memory budget"), std::string::npos)
      << run.stderr_text;
  EXPECT_TRUE(run.stdout_text().empty()) << "refused before generating";
}

TEST(StreamingCliPreload, CacheThatCannotHoldEveryExpertRefusedNamingFlag) {
  std::vector<std::string> a = {TinyPreparedDir(), "--ids", kPromptText, "--gen", "1",
                                "--no-floor", "--preload"};
  for (const std::string& f : MinimumFlags(TinyPreparedDir())) a.push_back(f);
  const testing::CliRun run = RunCliArgs(a);
  EXPECT_EQ(run.exit_code, 2) << run.stderr_text;
  // Refused by the plan, before the weights are allocated (CheckPreloadFits, which
  // StreamingWeights also applies for library callers).
  EXPECT_NE(run.stderr_text.find("--preload: the plan's expert cache holds"), std::string::npos)
      << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("--cache-gb"), std::string::npos) << run.stderr_text;
  EXPECT_TRUE(run.stdout_text().empty()) << "refused before generating";
}

TEST(StreamingCliPreload, EverythingHeldRunsAndMatchesTheDefaultRun) {
  const testing::CliRun plain =
      RunCliArgs({TinyPreparedDir(), "--ids", kPromptText, "--gen", "3", "--no-floor"});
  const testing::CliRun held = RunCliArgs({TinyPreparedDir(), "--ids", kPromptText, "--gen", "3",
                                           "--no-floor", "--budget-gb", "100", "--preload"});
  ASSERT_EQ(plain.exit_code, 0) << plain.stderr_text;
  ASSERT_EQ(held.exit_code, 0) << held.stderr_text;
  EXPECT_EQ(held.stdout_text(), plain.stdout_text());
}

TEST(StreamingCliTrace, DumpCacheTraceWithBudgetWritesTheFile) {
  test::TempDir tmp;
  std::vector<std::string> a = {TinyPreparedDir(), "--ids", kPromptText, "--gen", "2",
                                "--no-floor", "--dump-cache-trace", tmp.Join("trace")};
  for (const std::string& f : MinimumFlags(TinyPreparedDir())) a.push_back(f);
  const testing::CliRun run = RunCliArgs(a);
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  const std::string file = tmp.Join("trace") + "/cache-trace.jsonl";
  ASSERT_TRUE(std::filesystem::exists(file)) << run.stderr_text;
  EXPECT_GT(std::filesystem::file_size(file), 0u);
  EXPECT_FALSE(std::filesystem::exists(file + ".k3tmp")) << "temporary left behind";
}

// --- reading ahead (--prefetch-experts) -----------------------------------------------------

TEST(StreamingCliPrefetch, OutOfRangeRefusedNamingFlag) {
  for (const char* bad : {"-1", "4097", "many"}) {
    const testing::CliRun run = RunCliArgs({TinyPreparedDir(), "--ids", kPromptText, "--gen", "1",
                                            "--budget-gb", "100", "--prefetch-experts", bad});
    EXPECT_EQ(run.exit_code, 2) << bad << ": " << run.stderr_text;
    EXPECT_NE(run.stderr_text.find("--prefetch-experts"), std::string::npos)
        << bad << ": " << run.stderr_text;
  }
}

// With a budget that holds every layer (so every next router is at hand), the default reads
// guesses ahead and reports them; 0 turns that off; both give the bytes of the plain run. The
// report's counters agree with one another.
TEST(StreamingCliPrefetch, GuessesReportedAndOutputUnchanged) {
  const testing::CliRun plain =
      RunCliArgs({TinyPreparedDir(), "--ids", kPromptText, "--gen", "3", "--no-floor"});
  ASSERT_EQ(plain.exit_code, 0) << plain.stderr_text;
  const ReportRun on =
      RunWithReport(TinyPreparedDir(), {"--no-floor", "--budget-gb", "100", "--verbose"});
  const ReportRun off = RunWithReport(
      TinyPreparedDir(), {"--no-floor", "--budget-gb", "100", "--prefetch-experts", "0"});
  ASSERT_TRUE(on.report.is_object() && off.report.is_object());
  EXPECT_EQ(on.run.stdout_text(), plain.stdout_text());
  EXPECT_EQ(off.run.stdout_text(), plain.stdout_text());
  const json& t = on.report["totals"];
  const auto guesses = t["expert_guesses"].get<uint64_t>();
  const auto used = t["expert_guesses_used"].get<uint64_t>();
  EXPECT_GT(guesses, 0u) << t.dump();
  EXPECT_GT(used, 0u) << t.dump();
  EXPECT_LE(used, guesses);
  ExpectRate(t["expert_guess_precision"], used, guesses, "totals.expert_guess_precision");
  uint64_t step_guesses = 0, step_unused = 0;
  for (const json& s : on.report["steps"]) {
    step_guesses += s["expert_guesses"].get<uint64_t>();
    step_unused += s["bytes_read"]["prefetch_unused"].get<uint64_t>();
  }
  EXPECT_EQ(step_guesses, guesses);
  EXPECT_EQ(step_unused, t["bytes_read"]["prefetch_unused"].get<uint64_t>());
  const json& st = on.report["streaming"]["stats"];
  EXPECT_EQ(st["prefetches"].get<uint64_t>(), guesses);
  EXPECT_EQ(st["prefetch_used"].get<uint64_t>(), used);
  EXPECT_NE(on.run.stderr_text.find("read ahead:"), std::string::npos) << on.run.stderr_text;
  EXPECT_EQ(off.report["totals"]["expert_guesses"].get<uint64_t>(), 0u);
  EXPECT_TRUE(off.report["totals"]["expert_guess_precision"].is_null());
  EXPECT_EQ(off.report["totals"]["bytes_read"]["prefetch_unused"].get<uint64_t>(), 0u);
}

}  // namespace
}  // namespace k3::run
