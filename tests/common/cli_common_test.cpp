// The shared command-line behaviour: flag parsing, exit codes, error reporting.
#include "common/cli_common.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/log.h"

namespace k3 {
namespace {

// Runs RunCli over `args` (argv[0] added), capturing stderr.
struct CliRun {
  int code = -1;
  std::string err;
};

CliRun RunTool(CLI::App& app, std::vector<std::string> args, std::function<Status()> fn) {
  std::vector<std::string> storage = {"tool"};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : storage) argv.push_back(s.data());
  ::testing::internal::CaptureStderr();
  CliRun r;
  r.code = RunCli(app, static_cast<int>(argv.size()), argv.data(), std::move(fn));
  r.err = ::testing::internal::GetCapturedStderr();
  return r;
}

class Cli : public ::testing::Test {
 protected:
  void TearDown() override { SetQuiet(false); }
};

TEST_F(Cli, ProgressFlagAcceptsTheFourModes) {
  for (auto [text, mode] : {std::pair{"auto", ProgressMode::kAuto},
                            std::pair{"bar", ProgressMode::kBar},
                            std::pair{"plain", ProgressMode::kPlain},
                            std::pair{"none", ProgressMode::kNone}}) {
    CLI::App app("t", "tool");
    OutputOptions out;
    out.progress = ProgressMode::kBar == mode ? ProgressMode::kNone : ProgressMode::kBar;
    AddOutputFlags(&app, &out);
    CliRun r = RunTool(app, {std::string("--progress=") + text}, [] { return Status::Ok(); });
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(out.progress, mode) << text;
  }
}

TEST_F(Cli, BadProgressValueIsUsageErrorExit2) {
  CLI::App app("t", "tool");
  OutputOptions out;
  AddOutputFlags(&app, &out);
  bool ran = false;
  CliRun r = RunTool(app, {"--progress=fancy"}, [&] {
    ran = true;
    return Status::Ok();
  });
  EXPECT_EQ(r.code, 2);
  EXPECT_FALSE(ran);
  EXPECT_NE(r.err.find("--progress"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("fancy"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("run 'tool --help'"), std::string::npos) << r.err;
}

TEST_F(Cli, QuietImpliesNoProgressWhateverTheOrder) {
  for (auto args : {std::vector<std::string>{"--quiet", "--progress=bar"},
                    std::vector<std::string>{"--progress=bar", "-q"}}) {
    SetQuiet(false);
    CLI::App app("t", "tool");
    OutputOptions out;
    AddOutputFlags(&app, &out);
    CliRun r = RunTool(app, args, [] { return Status::Ok(); });
    EXPECT_EQ(r.code, 0);
    EXPECT_TRUE(out.quiet);
    EXPECT_EQ(out.progress, ProgressMode::kNone);
    EXPECT_TRUE(Quiet());
  }
}

TEST_F(Cli, UnknownFlagIsExit2) {
  CLI::App app("t", "tool");
  CliRun r = RunTool(app, {"--bogus"}, [] { return Status::Ok(); });
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--bogus"), std::string::npos) << r.err;
}

TEST_F(Cli, HelpAndVersionExitZero) {
  {
    CLI::App app("t", "tool");
    ::testing::internal::CaptureStdout();
    CliRun r = RunTool(app, {"--help"}, [] { return Status::Invalid("must not run"); });
    const std::string out = ::testing::internal::GetCapturedStdout();
    EXPECT_EQ(r.code, 0);
    EXPECT_NE(out.find("Usage"), std::string::npos) << out;
  }
  {
    CLI::App app("t", "tool");
    app.set_version_flag("--version", "tool 0.1.0");
    ::testing::internal::CaptureStdout();
    CliRun r = RunTool(app, {"--version"}, [] { return Status::Invalid("must not run"); });
    const std::string out = ::testing::internal::GetCapturedStdout();
    EXPECT_EQ(r.code, 0);
    EXPECT_NE(out.find("tool 0.1.0"), std::string::npos) << out;
  }
}

TEST_F(Cli, FailedRunPrintsToolErrorAndReturnsItsExitCode) {
  CLI::App app("t", "k3verify");
  CliRun r = RunTool(app, {}, [] { return Status::Integrity("trunk.bin: region 3 hash mismatch"); });
  EXPECT_EQ(r.code, 3);
  EXPECT_EQ(r.err, "k3verify: error: integrity failure: trunk.bin: region 3 hash mismatch\n");
}

TEST_F(Cli, EscapingExceptionBecomesExit1) {
  CLI::App app("t", "tool");
  CliRun r = RunTool(app, {}, []() -> Status { throw std::runtime_error("boom"); });
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("internal error"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("boom"), std::string::npos) << r.err;
}

TEST_F(Cli, ReportAndExitOkIsSilentZero) {
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(ReportAndExit("tool", Status::Ok()), 0);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(ReportAndExit("tool", Status::Io("x")), 1);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "tool: error: I/O error: x\n");
}

TEST_F(Cli, LogRespectsQuietButErrorsAlwaysPrint) {
  ::testing::internal::CaptureStderr();
  LogInfo("info one");
  SetQuiet(true);
  LogInfo("info two");
  LogWarn("careful");
  LogError("broken");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "info one\nwarning: careful\nerror: broken\n");
}

// The numeric checks: NaN and ±inf refused by each (CLI11's Range lets NaN through), bounds
// printed as written, and the in-range edges accepted.
struct NumberCase {
  const char* value;
  bool accepted;
};

void ExpectChecks(const CLI::Validator& check, const std::vector<NumberCase>& cases,
                  const std::string& allowed) {
  for (const NumberCase& c : cases) {
    CLI::App app("t", "tool");
    double v = 0;
    app.add_option("--x", v)->check(check);
    bool ran = false;
    CliRun r = RunTool(app, {"--x", c.value}, [&] {
      ran = true;
      return Status::Ok();
    });
    EXPECT_EQ(ran, c.accepted) << c.value << ": " << r.err;
    EXPECT_EQ(r.code, c.accepted ? 0 : 2) << c.value;
    if (!c.accepted) {
      EXPECT_NE(r.err.find(std::string("--x: ") + c.value), std::string::npos) << r.err;
      EXPECT_NE(r.err.find("allowed " + allowed + "\n"), std::string::npos) << r.err;
      // CLI11's own wording printed 0.000000 and a 309-digit double maximum.
      EXPECT_EQ(r.err.find("0.000000"), std::string::npos) << r.err;
      EXPECT_EQ(r.err.find("1797"), std::string::npos) << r.err;
    }
  }
}

TEST_F(Cli, InRangeRefusesNonFiniteAndOutsideValuesNamingTheBounds) {
  ExpectChecks(InRange(1, 1024),
               {{"1", true}, {"1024", true}, {"0", false}, {"1025", false}, {"nan", false},
                {"NaN", false}, {"inf", false}, {"-inf", false}, {"1000000", false}},
               "1 to 1024");
}

TEST_F(Cli, AtLeastRefusesNonFiniteAndSmallerValues) {
  ExpectChecks(AtLeast(0), {{"0", true}, {"1e300", true}, {"-1", false}, {"nan", false},
                            {"inf", false}},
               "0 or more");
}

TEST_F(Cli, AboveZeroRefusesZeroNonFiniteAndTooLarge) {
  ExpectChecks(AboveZero(1000000), {{"0.001", true}, {"1000000", true}, {"0", false},
                                    {"-2", false}, {"nan", false}, {"inf", false},
                                    {"1000001", false}},
               "more than 0, up to 1000000");
}

TEST_F(Cli, NonFiniteValueSaysSo) {
  CLI::App app("t", "tool");
  double v = 0;
  app.add_option("--budget", v)->check(AboveZero(10));
  CliRun r = RunTool(app, {"--budget", "nan"}, [] { return Status::Ok(); });
  EXPECT_NE(r.err.find("--budget: nan is not a finite number: allowed more than 0, up to 10"),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace k3
