// The k3verify command line: subcommands and their flags; the work is in verify_*.h.
#pragma once

namespace k3::verify {

// Runs k3verify with argv; returns the process exit code (DESIGN.md §6).
int Main(int argc, char** argv);

}  // namespace k3::verify
