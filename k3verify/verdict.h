// The overall verdict of an audit that collected several problems (DESIGN.md §6 precedence:
// integrity 3 > invalid 2 > could-not-complete 1), shared by `prepared` and `tensors`.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace k3::verify {

// OK when `problems` is empty; else the most serious problem's code with "<n> problem(s) in
// <subject>; the most serious: <its message>".
Status WorstVerdict(const std::vector<Status>& problems, const std::string& subject);

// Up to `limit` problems as "  problem: <Status::ToString>" lines, then "... and N more".
std::string ProblemLines(const std::vector<Status>& problems, size_t limit);

}  // namespace k3::verify
