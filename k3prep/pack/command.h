// `k3prep pack MODEL_DIR --out PREPARED [--experts link|copy] [--stripe D1,D2,…] [--resume]
// [--jobs N]`: the CLI11 subcommand over RunPack (k3prep/pack/pack.h). Flags only; no logic.
#pragma once

#include <CLI/CLI.hpp>

#include "common/cli_common.h"
#include "common/status.h"

namespace k3::prep {

// Registers the `pack` subcommand on `app` and returns it. `out` holds output flags parsed at
// the tool level (may be null); the subcommand also accepts --quiet/--progress itself.
CLI::App* AddPackCommand(CLI::App* app, const OutputOptions* out);

// Runs the pack when `cmd` (the value AddPackCommand returned) was given on the command line;
// returns its Status (exit code per DESIGN.md §6). Prints a summary via LogInfo.
Status RunPackCommand(CLI::App* cmd);

}  // namespace k3::prep
