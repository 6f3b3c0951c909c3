#include "common/cli_common.h"

#include <charconv>
#include <cmath>
#include <exception>
#include <new>
#include <string>

#include "common/log.h"

namespace k3 {

void AddOutputFlags(CLI::App* app, OutputOptions* out) {
  // --progress is defined before --quiet: CLI11 runs option callbacks in definition order, so
  // --quiet's "no progress" wins whatever order the user typed them in.
  app->add_option_function<std::string>(
         "--progress",
         [out](const std::string& value) {
           if (!out->quiet) ParseProgressMode(value, &out->progress);
         },
         "progress display: auto (bar on a terminal, else a line every 30 s), bar, plain, none")
      ->check(CLI::IsMember({"auto", "bar", "plain", "none"}))
      ->type_name("MODE");
  app->add_flag_callback(
      "-q,--quiet",
      [out] {
        out->quiet = true;
        out->progress = ProgressMode::kNone;
        SetQuiet(true);
      },
      "print only warnings, errors and the tool's output");
}

void AddJsonFlag(CLI::App* app, OutputOptions* out) {
  app->add_flag("--json", out->json, "machine-readable JSON on stdout");
}

namespace {

// The shortest plain text that reads back as `v`: "1024", "0.5", "1000000" (not
// "1024.000000" or "1e+06"); exponents only beyond 10^15.
std::string ShortNumber(double v) {
  char buf[64];
  const auto format = std::fabs(v) < 1e15 ? std::chars_format::fixed : std::chars_format::general;
  const auto r = std::to_chars(buf, buf + sizeof buf, v, format);
  return std::string(buf, r.ptr);
}

// A validator for min <= v <= max (or min < v when min_open), described by `allowed`.
CLI::Validator NumberCheck(double min, bool min_open, double max, const std::string& allowed) {
  CLI::Validator v(
      [=](std::string& input) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(input, value)) return "\"" + input + "\" is not a number";
        if (!std::isfinite(value)) {
          return input + " is not a finite number: allowed " + allowed;
        }
        const bool low = min_open ? !(value > min) : !(value >= min);
        if (low || value > max) return input + " is out of range: allowed " + allowed;
        return std::string();
      },
      allowed);
  return v;
}

}  // namespace

CLI::Validator InRange(double min, double max) {
  return NumberCheck(min, false, max, ShortNumber(min) + " to " + ShortNumber(max));
}

CLI::Validator AtLeast(double min) {
  return NumberCheck(min, false, HUGE_VAL, ShortNumber(min) + " or more");
}

CLI::Validator AboveZero(double max) {
  return NumberCheck(0, true, max, "more than 0, up to " + ShortNumber(max));
}

int ReportAndExit(std::string_view tool, const Status& s) {
  if (s.ok()) return 0;
  WriteStderr(std::string(tool) + ": error: " + s.ToString() + "\n");
  return s.exit_code();
}

int RunCli(CLI::App& app, int argc, char** argv, std::function<Status()> run) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version arrive as "errors" with exit code 0; CLI11 prints them itself.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    WriteStderr(app.get_name() + ": error: " + e.what() + "\nrun '" + app.get_name() +
                " --help' for usage\n");
    return static_cast<int>(Code::kInvalid);
  }
  Status s;
  try {
    s = run();
  } catch (const std::bad_alloc&) {
    s = Status::Io("out of memory (lower the memory budget or free memory)");
  } catch (const std::exception& e) {
    // Library code reports failures as Status; an exception escaping is a bug, but the user
    // still gets a message and a nonzero exit instead of an abort.
    s = Status::Io(std::string("internal error (please report): ") + e.what());
  }
  return ReportAndExit(app.get_name(), s);
}

}  // namespace k3
