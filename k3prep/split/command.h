// `k3prep split PREPARED --ranks N --rank R --out DIR [--model-dir DIR]`: the CLI11 subcommand
// over RunSplit (k3prep/split/split.h). Flags only; no logic.
#pragma once

#include <CLI/CLI.hpp>

#include "common/cli_common.h"
#include "common/status.h"

namespace k3::prep {

// Registers the `split` subcommand on `app` and returns it. `out` holds output flags parsed at
// the tool level (may be null); the subcommand also accepts --quiet/--progress itself.
CLI::App* AddSplitCommand(CLI::App* app, const OutputOptions* out);

// Runs the split when `cmd` (the value AddSplitCommand returned) was given on the command line;
// returns its Status (exit code per DESIGN.md §6). Prints a summary via LogInfo.
Status RunSplitCommand(CLI::App* cmd);

}  // namespace k3::prep
