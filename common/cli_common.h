// What every k3 tool's command line shares: --quiet, --progress, --json, the mapping of
// Status to exit codes (DESIGN.md §6) and of CLI11 parse errors to exit 2.
#pragma once

#include <functional>
#include <string_view>

#include <CLI/CLI.hpp>

#include "common/progress.h"
#include "common/status.h"

namespace k3 {

struct OutputOptions {
  bool quiet = false;
  ProgressMode progress = ProgressMode::kAuto;
  bool json = false;
};

// Adds --quiet and --progress=auto|bar|plain|none to `app` (a bad value is a CLI11 parse error,
// exit 2). --quiet calls SetQuiet(true) and forces progress to kNone. --json is added by tools
// that have a JSON report (AddJsonFlag).
void AddOutputFlags(CLI::App* app, OutputOptions* out);
void AddJsonFlag(CLI::App* app, OutputOptions* out);

// Checks for numeric flags, applied to the text before CLI11 converts it. Every one refuses NaN
// and ±inf (CLI11's own Range lets NaN through: every comparison with it is false) and says what
// is allowed with the bounds as written: "--threads: 1000000 is out of range: allowed 1 to 1024".
// The integral forms print whole numbers; a fractional value for an integer flag is left to
// CLI11's conversion, which refuses it.
CLI::Validator InRange(double min, double max);  // min <= v <= max
CLI::Validator AtLeast(double min);              // min <= v, finite
CLI::Validator AboveZero(double max);            // 0 < v <= max

// Prints "TOOL: error: <s.ToString()>" to stderr for a failure; returns s.exit_code() (0 for OK).
int ReportAndExit(std::string_view tool, const Status& s);

// Parses argv with `app`. --help/--version print and return 0; a parse error prints CLI11's
// message plus "run with --help" and returns 2; otherwise runs `run` and returns
// ReportAndExit(app.get_name(), run()).
int RunCli(CLI::App& app, int argc, char** argv, std::function<Status()> run);

}  // namespace k3
