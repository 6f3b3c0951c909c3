// Synthetic checkpoints and their prepared directories, built once per CTest run and shared by
// every test process (tests/support/CMakeLists.txt registers the CTest fixtures).
//
// Where: ${K3_BINARY_DIR}/fixtures/<key>/{ck,prep}, <key> = "<preset>-s<seed>-<experts>-<hash>",
// the hash being XXH3-128 over everything that determines the bytes (synth options, experts mode,
// the prepared manifest version and kFixtureVersion below), so a changed recipe never reuses an
// old directory.
//
// Under CTest: `fixtures.reset` empties fixtures/, then one `fixtures.build.<name>` test per
// entry of CtestFixtures() builds it (FIXTURES_SETUP), the tests that read it wait for it
// (FIXTURES_REQUIRED), and `fixtures.check` (FIXTURES_CLEANUP) fails when a fixture was built more
// than once in the run or its bytes changed (a test wrote into the shared copy).
//
// By hand (a test binary run outside CTest): the first process that needs a fixture builds it
// under an exclusive flock on fixtures/<key>.lock. The pieces are written under temporary names
// and renamed into place (ck.tmp → ck, prep.tmp → prep), and the `complete` stamp (also renamed
// into place) comes last; readers use only a directory with the stamp, so no process ever sees a
// half-built fixture. A fixture directory is shared and must not be modified: copy it first.
//
// K3_FIXTURE_TRACE=FILE appends the key of every fixture a process opens to FILE (one line per
// process and fixture): the number of processes that would each have synthesised it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/prepared_manifest.h"

namespace k3::test {

// Bump when the way a fixture is built changes (what is packed, pack options).
inline constexpr int kFixtureVersion = 2;  // 2: vision shards and vision.bin

struct FixtureSpec {
  std::string preset = "tiny";
  uint64_t seed = 0;
  prepared::ExpertsMode experts = prepared::ExpertsMode::kCopy;
};

struct FixtureDirs {
  std::string checkpoint;  // `k3prep synth --preset P --seed S` output
  std::string prepared;    // `k3prep pack` of it (experts as the spec says, --jobs 1)
};

// The fixture's directories, building it first when absent (once per process: memoised).
// Fails the current test (ADD_FAILURE) and returns empty paths when it cannot be built.
const FixtureDirs& SynthFixture(const FixtureSpec& spec);

// Everything below is for the CTest fixture tool (tests/support/fixture_tool.cpp).

// The fixtures CTest builds up front, by name: "tiny", "small" (seed 0, copy mode: the engine
// tests' TinyPreparedDir / SmallPreparedDir), "tiny-ref", "small-ref" (seed 1, link mode: the
// reference gates).
struct NamedFixture {
  std::string name;
  FixtureSpec spec;
};
const std::vector<NamedFixture>& CtestFixtures();

std::string FixturesRoot();                 // ${K3_BINARY_DIR}/fixtures
std::string FixtureKey(const FixtureSpec& spec);  // the directory name under FixturesRoot()

// Removes every fixture and build counter (the start of a CTest run). Returns false on failure.
bool ResetFixtures(std::string* error);
// Checks every fixture built since the reset: built exactly once, bytes as built. Returns the
// problems found (empty: all good) and appends one line per fixture checked to *report.
std::vector<std::string> CheckFixtures(std::string* report);

}  // namespace k3::test
