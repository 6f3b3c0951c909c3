#include "k3verify/verdict.h"

namespace k3::verify {
namespace {

int Severity(Code c) {
  switch (c) {
    case Code::kIntegrity: return 4;
    case Code::kInvalid: return 3;
    case Code::kIo: return 2;
    case Code::kUnreliable: return 1;
    case Code::kOk: return 0;
  }
  return 0;
}

}  // namespace

Status WorstVerdict(const std::vector<Status>& problems, const std::string& subject) {
  const Status* worst = nullptr;
  for (const Status& s : problems) {
    if (worst == nullptr || Severity(s.code()) > Severity(worst->code())) worst = &s;
  }
  if (worst == nullptr) return Status::Ok();
  const std::string msg = std::to_string(problems.size()) + " problem(s) in " + subject +
                          "; the most serious: " + worst->message();
  switch (worst->code()) {
    case Code::kIntegrity: return Status::Integrity(msg);
    case Code::kIo: return Status::Io(msg);
    default: return Status::Invalid(msg);
  }
}

std::string ProblemLines(const std::vector<Status>& problems, size_t limit) {
  std::string out;
  for (size_t i = 0; i < problems.size() && i < limit; ++i) {
    out += "  problem: " + problems[i].ToString() + "\n";
  }
  if (problems.size() > limit) {
    out += "  ... and " + std::to_string(problems.size() - limit) + " more (see --json)\n";
  }
  return out;
}

}  // namespace k3::verify
