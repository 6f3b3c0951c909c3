// The CTest side of tests/support/synth_fixture.h:
//   k3_fixture_tool reset        empty ${K3_BINARY_DIR}/fixtures (FIXTURES_SETUP, first)
//   k3_fixture_tool build NAME   build the named fixture of CtestFixtures() (FIXTURES_SETUP)
//   k3_fixture_tool check        each fixture built once in this run, bytes unchanged
//                                (FIXTURES_CLEANUP, last)
// Exit status 0 on success, 1 on failure (with the reason on stderr).
#include <cstdio>
#include <string>

#include "tests/support/synth_fixture.h"

namespace {

int Usage() {
  std::fprintf(stderr, "usage: k3_fixture_tool reset | build NAME | check\n");
  return 2;
}

int Build(const std::string& name) {
  for (const k3::test::NamedFixture& f : k3::test::CtestFixtures()) {
    if (f.name != name) continue;
    const k3::test::FixtureDirs& d = k3::test::SynthFixture(f.spec);
    if (d.prepared.empty()) {
      std::fprintf(stderr, "fixture %s: build failed (see above)\n", name.c_str());
      return 1;
    }
    std::printf("fixture %s: %s\n", name.c_str(), d.prepared.c_str());
    return 0;
  }
  std::fprintf(stderr, "no fixture named '%s'\n", name.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage();
  const std::string cmd = argv[1];
  if (cmd == "reset" && argc == 2) {
    std::string error;
    if (!k3::test::ResetFixtures(&error)) {
      std::fprintf(stderr, "reset: %s\n", error.c_str());
      return 1;
    }
    return 0;
  }
  if (cmd == "build" && argc == 3) return Build(argv[2]);
  if (cmd == "check" && argc == 2) {
    std::string report;
    const std::vector<std::string> problems = k3::test::CheckFixtures(&report);
    std::fputs(report.c_str(), stdout);
    for (const std::string& p : problems) std::fprintf(stderr, "FAIL: %s\n", p.c_str());
    return problems.empty() ? 0 : 1;
  }
  return Usage();
}
