// The k3prep command line (CLI11): subcommands registered here, each a thin layer that turns
// flags into an options struct and calls the library. Today: `synth` (DESIGN.md §6, §8).
#pragma once

namespace k3::prep {

// Parses argv, runs the chosen subcommand and returns the process exit code (DESIGN.md §6):
// 0 success, 1 could not complete (I/O, not enough disk), 2 usage or invalid input.
int Main(int argc, char** argv);

}  // namespace k3::prep
