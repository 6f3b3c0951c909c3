// Logging: human-readable lines on stderr. stdout is reserved for a tool's real output (generated
// text, --json reports), so nothing here ever writes to stdout.
//
// Thread safety: all functions may be called concurrently; each line is written with one
// write(2) so lines from different threads do not interleave.
#pragma once

#include <string_view>

namespace k3 {

// --quiet: suppresses LogInfo (and progress); warnings and errors still print.
void SetQuiet(bool quiet);
bool Quiet();

void LogInfo(std::string_view msg);   // "msg\n" unless quiet
void LogWarn(std::string_view msg);   // "warning: msg\n", always (a warning is never noise)
void LogError(std::string_view msg);  // "error: msg\n", always

// Writes `text` to stderr as is, with as few write(2) calls as the OS allows (for progress
// redraws and error reports that carry their own line endings).
void WriteStderr(std::string_view text);

}  // namespace k3
