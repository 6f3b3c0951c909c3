// What k3run says when PREPARED is not a prepared directory it can open (DESIGN.md §6 k3run):
// a path that does not exist, a file, a checkpoint (with the `k3prep pack` command that makes a
// prepared directory of it), a pack that did not finish (its journal is there), and a prepared
// directory without k3.sum (the open error, and the k3verify or resume command to run).
// `k3prep doctor DIR` tells the same kinds apart the same way (k3.json: prepared; config.json:
// checkpoint).
#pragma once

#include <string>

#include "common/env.h"
#include "common/status.h"

namespace k3::run {

// Before opening: kInvalid for a missing path, a non-directory, a checkpoint, or a directory
// without k3.json; OK when there is a k3.json to open.
Status CheckPreparedPath(Env* env, const std::string& dir);

// After a failed open of a directory with k3.json but no k3.sum: the same code, the message
// prefixed with what the directory is and followed by what to run. Other failures unchanged.
Status ExplainOpenFailure(Env* env, const std::string& dir, const Status& failure);

// `s` quoted for a POSIX shell when it holds anything but [A-Za-z0-9/._-+:,=@].
std::string ShellQuoted(const std::string& s);

}  // namespace k3::run
