// `k3prep doctor [DIR] [--probe-mb N] [--probe-seconds S] [--read-size BYTES] [--no-probe]
// [--pread] [--ranks N] [--json]`: the CLI11 subcommand over RunDoctor (k3prep/doctor/doctor.h). Flags only.
#pragma once

#include <CLI/CLI.hpp>

#include "common/cli_common.h"
#include "common/status.h"

namespace k3::prep {

// Registers the `doctor` subcommand on `app` and returns it. `out` holds the tool-level output
// flags (may be null); the subcommand also accepts --quiet and --json itself.
CLI::App* AddDoctorCommand(CLI::App* app, const OutputOptions* out);

// Runs the doctor when `cmd` (AddDoctorCommand's value) was given; prints the report (table or
// JSON) on stdout and returns kIo (exit 1) only for blocking problems.
Status RunDoctorCommand(CLI::App* cmd);

}  // namespace k3::prep
