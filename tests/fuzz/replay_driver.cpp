// Stand-in for libFuzzer when K3_FUZZ is off: feeds LLVMFuzzerTestOneInput every file of the
// committed seed corpus (argv[1]) and then deterministic mutations of each seed (bit flips,
// byte sets to boundary values, truncations, duplicated spans), so that CTest exercises the
// parser on malformed input in every build. A crash or sanitizer report fails the test; the
// target itself must never crash on any input.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/support/files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void Run(const std::vector<uint8_t>& input) { LLVMFuzzerTestOneInput(input.data(), input.size()); }

void Mutate(const std::vector<uint8_t>& seed, uint64_t rng, int rounds) {
  static const uint8_t kBoundary[] = {0x00, 0x01, 0x7F, 0x80, 0xFF, '{', '}', '"', ',', ':',
                                      '[', ']', '-', '9', 'e', '\\'};
  for (int r = 0; r < rounds; ++r) {
    std::vector<uint8_t> m = seed;
    const int edits = 1 + static_cast<int>(SplitMix64(rng) % 4);
    for (int e = 0; e < edits && !m.empty(); ++e) {
      const size_t pos = SplitMix64(rng) % m.size();
      switch (SplitMix64(rng) % 5) {
        case 0: m[pos] = static_cast<uint8_t>(m[pos] ^ (1u << (SplitMix64(rng) % 8))); break;
        case 1: m[pos] = kBoundary[SplitMix64(rng) % sizeof(kBoundary)]; break;
        case 2: m.resize(pos); break;
        case 3: {
          const size_t len = std::min<size_t>(m.size() - pos, 1 + SplitMix64(rng) % 16);
          std::vector<uint8_t> span(m.begin() + static_cast<long>(pos),
                                    m.begin() + static_cast<long>(pos + len));
          m.insert(m.begin() + static_cast<long>(pos), span.begin(), span.end());
          break;
        }
        default: m.erase(m.begin() + static_cast<long>(pos)); break;
      }
    }
    Run(m);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR [ROUNDS_PER_SEED]\n", argv[0]);
    return 2;
  }
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 2000;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(argv[1])) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "replay: no seed files in %s\n", argv[1]);
    return 1;
  }
  uint64_t seed_rng = 0x6B33u;
  for (const auto& f : files) {
    const std::string bytes = k3::test::ReadWholeFile(f.string());
    std::vector<uint8_t> seed(bytes.begin(), bytes.end());
    Run(seed);
    Mutate(seed, SplitMix64(seed_rng), rounds);
  }
  std::printf("replay: %zu seeds, %d mutations each, no crash\n", files.size(), rounds);
  return 0;
}
